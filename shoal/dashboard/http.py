"""Small aiohttp plumbing shared by the HTTP ports: parsing ``--dashboard-address`` /
``--metrics-address``, a bearer-token check, and one site on the server's own loop.

aiohttp is imported here, and this module only when a port is opened, so a server
without HTTP never loads it.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def parse_http_address(text: str, default_host: str) -> tuple[str, int]:
    """``":8787"`` / ``"8787"`` -> (default_host, 8787); ``"0.0.0.0:0"``, ``"[::1]:80"``,
    ``"http://host:80"`` -> as written. A bad value raises ValueError naming it."""
    rest = text.strip()
    if rest.startswith(("http://", "https://")):
        rest = rest.split("://", 1)[1].rstrip("/")
    if rest.isdigit():
        host, port = "", rest
    elif rest.startswith("["):
        host, _, port = rest[1:].partition("]:")
    else:
        host, _, port = rest.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"not an HTTP address: {text!r} (expected [host]:port, e.g. ':8787' or "
            "'0.0.0.0:9000'; port 0: any free)"
        )
    return host or default_host, int(port)


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bearer_required(token: str | None, handler: Handler) -> Handler:
    """``handler`` behind ``Authorization: Bearer <token>`` (401 without it, compared
    in constant time); unchanged when ``token`` is empty."""
    if not token:
        return handler
    expected = f"Bearer {token}".encode()

    async def guarded(request: web.Request) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return web.Response(
                status=401,
                text="401: this endpoint needs 'Authorization: Bearer <token>'\n",
                headers={"WWW-Authenticate": 'Bearer realm="shoal"'},
            )
        return await handler(request)

    return guarded


class HttpSite:
    """One aiohttp application listening on one address; ``url`` once started."""

    def __init__(self, app: web.Application):
        self._runner = web.AppRunner(app, access_log=None)
        self.url = ""
        self.port = 0

    async def start(self, host: str, port: int) -> HttpSite:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        bound = self._runner.addresses  # (host, port, ...) of each socket: the chosen port
        self.port = int(bound[0][1]) if bound else port
        self.url = http_url(host, self.port)
        return self

    async def close(self) -> None:
        await self._runner.cleanup()
