"""The HTTP ports of metrics: a worker's own port (``/metrics``, ``/health``) and the
separate ``--metrics-address`` site of the scheduler or a worker (``/metrics`` only).

Tokens: a worker's port asks for ``Authorization: Bearer`` with the metrics token if
one is set, else with the cluster token if there is one. The ``--metrics-address``
site asks for the metrics token if one is set, and nothing otherwise: it is what a
Prometheus server scrapes (bind it to a private interface).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from shoal.dashboard.http import HttpSite, bearer_required, http_url, parse_http_address
from shoal.dashboard.metrics import CONTENT_TYPE, render_worker_metrics

if TYPE_CHECKING:
    from shoal.server.worker import Worker


def metrics_handler(
    render: Callable[[], bytes],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE})

    return metrics


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def metrics_app(render: Callable[[], bytes], token: str | None) -> web.Application:
    """An application serving only ``/metrics`` (behind ``token`` if given)."""
    app = web.Application()
    app.router.add_get("/metrics", bearer_required(token, metrics_handler(render)))
    return app


async def open_metrics_site(
    render: Callable[[], bytes], address: str, default_host: str, token: str | None
) -> HttpSite:
    """Serve ``/metrics`` at ``address`` (``--metrics-address``)."""
    host, port = parse_http_address(address, default_host)
    return await HttpSite(metrics_app(render, token)).start(host, port)


def worker_app(worker: Worker, token: str | None) -> web.Application:
    app = web.Application()
    render = metrics_handler(lambda: render_worker_metrics(worker))
    app.router.add_get("/metrics", bearer_required(token, render))
    app.router.add_get("/health", _health)
    return app


async def open_worker_http(worker: Worker, host: str) -> tuple[list[HttpSite], str]:
    """Open the worker's HTTP port (``dashboard_address``) and its metrics site
    (``metrics_address``), those that are set; ``host``: the worker's advertised host,
    where ``":port"`` binds. Returns the sites and the port's URL to advertise ("": none)."""
    sites: list[HttpSite] = []
    url = ""
    try:
        if worker.dashboard_address is not None:
            bind, port = parse_http_address(worker.dashboard_address, host)
            token = worker.metrics_token or worker.security.token
            site = await HttpSite(worker_app(worker, token)).start(bind, port)
            sites.append(site)
            # bound to every interface: advertise the host others reach the worker at
            url = http_url(host, site.port) if bind in ("0.0.0.0", "::") else site.url
        if worker.metrics_address is not None:
            render = lambda: render_worker_metrics(worker)  # noqa: E731
            sites.append(
                await open_metrics_site(render, worker.metrics_address, host, worker.metrics_token)
            )
    except BaseException as e:
        for site in sites:
            await site.close()
        if isinstance(e, OSError):  # a port taken: final, not "no scheduler yet"
            raise ValueError(f"cannot open the worker's HTTP port: {e}") from e
        raise
    return sites, url
