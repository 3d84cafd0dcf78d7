"""The dashboard's HTTP server (aiohttp), on the scheduler's own event loop.

Imported only when a scheduler opens a dashboard port. Every route is a GET that
reads the scheduler (no page or API call changes cluster state; other methods get
405). With a cluster token, everything but ``/login`` needs a session cookie that a
one-time login link gives (``auth.py``).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from shoal.dashboard import api
from shoal.dashboard.auth import (
    AuthError,
    NonceRegistry,
    check_login,
    check_session,
    session_cookie,
)
from shoal.dashboard.metrics import render_scheduler_metrics
from shoal.dashboard.push import PushHub
from shoal.dashboard.serve_metrics import metrics_handler

if TYPE_CHECKING:
    from shoal.server.scheduler import Scheduler

logger = logging.getLogger("shoal.dashboard")
STATIC = Path(__file__).parent / "static"
PAGES = ("status", "workers", "worker", "groups", "task", "events", "system")
_SAFE_NEXT = re.compile(r"^[A-Za-z0-9_\-./]*$")  # a relative page after login, no URL
_encode = msgspec.json.Encoder().encode
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # Everything is served from here: no CDN, no inline script, no framing.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}


CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
}


def path_suffix(name: str) -> str:
    return name[name.rfind(".") :] if "." in name else ""


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=_encode(data),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def error_response(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/api/"):
        return json_response({"error": message}, status)
    page = (
        "<!doctype html><meta charset=utf-8><title>shoal dashboard</title>"
        f"<h1>{status}</h1><p>{_escape(message)}</p>"
    )
    return web.Response(text=page, status=status, content_type="text/html")


def redirect(location: str) -> web.Response:
    """A relative redirect: right behind a proxy that serves us under a path prefix."""
    return web.Response(status=302, headers={"Location": location})


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Dashboard:
    """Serves the dashboard of ``scheduler`` on ``host:port`` (0: a free port)."""

    def __init__(self, scheduler: Scheduler, host: str, port: int, token: str | None):
        self.scheduler = scheduler
        self.host = host
        self.port = port
        self.token = token
        self.cookie_name = "shoal-dashboard"  # per port once the port is known
        self.nonces = NonceRegistry()
        self.hub = PushHub(scheduler)
        self._files: dict[str, bytes] = {}
        self._runner: web.AppRunner | None = None

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        get = app.router.add_get
        get("/", self._root)
        get("/login", self._login)
        for page in PAGES:
            get(f"/{page}", self._page)
        get("/static/{name}", self._static)
        get("/api/v1/summary", self._api(lambda r: api.summary(self.scheduler)))
        get("/api/v1/workers", self._api(lambda r: api.workers(self.scheduler, dict(r.query))))
        get(
            "/api/v1/workers/{address:.+}",
            self._api(lambda r: api.worker(self.scheduler, r.match_info["address"])),
        )
        get("/api/v1/prefixes", self._api(lambda r: api.prefixes(self.scheduler, dict(r.query))))
        get("/api/v1/groups", self._api(lambda r: api.groups(self.scheduler, dict(r.query))))
        get(
            "/api/v1/tasks/{key:.+}",
            self._api(lambda r: api.task(self.scheduler, r.match_info["key"])),
        )
        get("/api/v1/events", self._api(lambda r: api.events(self.scheduler, dict(r.query))))
        get(
            "/api/v1/task-stream",
            self._api(lambda r: api.task_stream(self.scheduler, dict(r.query))),
        )
        get("/api/v1/system", self._api(lambda r: api.system(self.scheduler, dict(r.query))))
        get("/api/v1/stream", self._stream)
        # Prometheus text, behind the token like every page (a scraper sends it as
        # ``Authorization: Bearer``; or scrapes the separate --metrics-address site).
        get("/metrics", metrics_handler(lambda: render_scheduler_metrics(self.scheduler)))
        return app

    async def start(self) -> int:
        """Listen; returns the port. A port in use (the default 8787 taken by another
        scheduler) is replaced by a free one, with a warning, as Dask does."""
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            site = web.TCPSite(self._runner, self.host or None, self.port)
            await site.start()
        except OSError as e:
            if e.errno != errno.EADDRINUSE or self.port == 0:
                await self._runner.cleanup()
                raise
            logger.warning("dashboard port %d is in use: serving on a free port instead", self.port)
            site = web.TCPSite(self._runner, self.host or None, 0)
            await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.cookie_name = f"shoal-dashboard-{self.port}"  # cookies ignore ports
        if not self.token and not is_loopback(self.host):
            logger.warning(
                "the dashboard on %s:%d has no token: anyone who can reach it sees the "
                "cluster (set a cluster token, or listen on 127.0.0.1)",
                self.host or "*",
                self.port,
            )
        return self.port

    async def stop(self) -> None:
        self.hub.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ guards

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            response: web.StreamResponse = error_response(
                request, 405, "the dashboard only reads: GET requests only"
            )
            response.headers["Allow"] = "GET, HEAD"
        elif self.token and request.path == "/metrics" and self._bearer_ok(request):
            response = await self._handle(request, handler)
        elif self.token and request.path != "/login":
            try:
                check_session(self.token, request.cookies.get(self.cookie_name), time.time())
            except AuthError as e:
                status = 401 if self.cookie_name not in request.cookies else 403
                response = error_response(request, status, str(e))
            else:
                response = await self._handle(request, handler)
        else:
            response = await self._handle(request, handler)
        if not response.prepared:
            response.headers.update(SECURITY_HEADERS)
        return response

    def _bearer_ok(self, request: web.Request) -> bool:
        assert self.token
        given = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(given, f"Bearer {self.token}".encode())

    @staticmethod
    async def _handle(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status >= 400:
                return error_response(request, e.status, e.reason)
            raise

    # ------------------------------------------------------------------ pages

    async def _root(self, request: web.Request) -> web.StreamResponse:
        return redirect("status")

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if not self.token:
            return redirect("status")  # an open dashboard: nothing to log in to
        query = dict(request.query)
        try:
            check_login(self.token, query, time.time(), self.nonces)
        except AuthError as e:
            return error_response(request, 403, str(e))
        page = query.get("next") or "status"
        if not _SAFE_NEXT.match(page) or page.startswith(("/", ".")):
            page = "status"  # never a redirect elsewhere
        response = redirect(page)
        response.set_cookie(
            self.cookie_name,
            session_cookie(self.token, time.time()),
            httponly=True,
            samesite="Strict",
            path="/",
        )
        return response

    async def _page(self, request: web.Request) -> web.StreamResponse:
        return self._file(f"{request.path.strip('/')}.html")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        """A file of ``static/``, read once (a few kB each; no executor thread)."""
        body = self._files.get(name)
        if body is None:
            path = STATIC / name
            if "/" in name or name.startswith(".") or not path.is_file():
                raise web.HTTPNotFound(reason=f"no static file {name!r}")
            body = self._files[name] = path.read_bytes()
        kind = CONTENT_TYPES.get(path_suffix(name), "application/octet-stream")
        return web.Response(body=body, content_type=kind, headers={"Cache-Control": "no-cache"})

    def _api(self, build: Callable[[web.Request], Any]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                return json_response(build(request))
            except api.BadRequest as e:
                return json_response({"error": str(e)}, 400)
            except api.NotFound as e:
                return json_response({"error": str(e)}, 404)

        return handler

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the topics' snapshots, then their deltas."""
        try:
            topics = self.hub.parse_topics(request.query.get("topics", ""))
        except api.BadRequest as e:
            return json_response({"error": str(e)}, 400)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # no buffering in a proxy (nginx)
                **SECURITY_HEADERS,
            }
        )
        await response.prepare(request)
        sub = self.hub.subscribe(topics)
        try:
            while not sub.dropped:
                await sub.wake.wait()
                if sub.dropped:
                    break
                data = sub.take()
                if data:
                    await response.write(data)
        except ConnectionResetError:
            pass  # the page was closed
        finally:
            self.hub.unsubscribe(sub)
        return response
