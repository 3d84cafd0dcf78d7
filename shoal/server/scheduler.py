"""The scheduler process: connections in, :class:`SchedulerState` decides.

This shell only translates: it runs the handshake, feeds each decoded batch to the
core, answers read-only queries, and implements the core's ``Comm`` by queueing
messages on connections (one frame per destination per loop iteration).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from shoal.comm.addresses import advertised_listener, unreachable_advertisement
from shoal.comm.connection import Connection
from shoal.comm.security import Security
from shoal.comm.tcp import HANDSHAKE_TIMEOUT, HandshakeError, check_hello, listen, parse_address
from shoal.comm.traffic import Traffic
from shoal.core.scheduler.lanes import DURATIONS_INTERVAL
from shoal.core.scheduler.membership import DEFAULT_ALLOWED_FAILURES, DEFAULT_WORKER_TTL
from shoal.core.scheduler.state import SchedulerState
from shoal.core.scheduler.stealing import STEAL_INTERVAL
from shoal.plugins.scheduler import SchedulerPlugins
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, ProtocolError, encode_frame
from shoal.server import remote_run
from shoal.server.coordination import DeadlineTimer
from shoal.server.dashboard import start_dashboard, stop_dashboard
from shoal.server.loop_latency import LoopLatency
from shoal.server.monitor import Monitor
from shoal.server.worker_views import WorkerView, worker_views

logger = logging.getLogger("shoal.scheduler")


def client_heartbeat_interval(n_clients: int) -> float:
    """How often each client beats: every 2 s, slower past 20 clients, so that the
    scheduler answers at most about 10 client heartbeats a second."""
    return max(2.0, n_clients / 10)


# Answered by the server from the core's records, between the batches of the core.
_QUERIES = (
    *(m.WhoHasRequest, m.InfoRequest, m.GroupsRequest, m.Heartbeat, m.EventsRequest),
    m.TaskStreamRequest,
    m.HasWhatRequest,
)
_PLUGIN_REQUESTS = (m.RegisterPlugin, m.UnregisterPlugin)  # answered by self.plugins

PROGRESS_INTERVAL = 0.2  # seconds between two counts of one progress watch, at most


def summary_interval(subscribers: int) -> float:
    """Seconds between pushes of the summary: 0.5 s for up to 25 subscribers, then
    longer, so that about 50 summaries a second go out however many subscribe."""
    return max(0.5, subscribers / 50)


def tune_gc() -> None:
    """Servers create and drop many small records per task; the default thresholds
    make the cyclic collector rescan them constantly (half the scheduler's time in a
    measurement). Collect young objects less often, and never rescan startup objects."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 50)


class Scheduler:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        validate: bool = False,
        owns_process: bool = False,
        allowed_failures: int = DEFAULT_ALLOWED_FAILURES,
        worker_ttl: float = DEFAULT_WORKER_TTL,
        security: Security | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        work_stealing: bool = True,
        metrics_address: str | None = None,
        metrics_token: str | None = None,
        dashboard_address: str | None = None,
    ):
        # "[host]:port" of the dashboard (no host: this scheduler's; port 0: a free one);
        # None: no dashboard (see shoal/server/dashboard.py).
        self.dashboard_address = dashboard_address
        self.dashboard: Any = None  # shoal.dashboard.app.Dashboard, once listening
        self.dashboard_port = 0
        self.monitor: Monitor | None = None  # CPU, memory, loop latency, rates (with a dashboard)
        self.security = security or Security()  # token / TLS for every connection
        self.handshake_timeout = handshake_timeout  # to send a complete Hello, or be closed
        self.owns_process = owns_process  # the CLI's scheduler may tune process-wide settings
        self.host = host
        self.port = port
        self.id = f"scheduler-{uuid.uuid4().hex[:12]}"
        self.state = SchedulerState(
            self,
            validate=validate,
            allowed_failures=allowed_failures,
            worker_ttl=worker_ttl,
            stealing=work_stealing,
        )
        self.address = ""
        self._server: asyncio.Server | None = None
        self._workers: dict[str, Connection] = {}
        self._clients: dict[str, Connection] = {}
        self._client_ids = itertools.count(1)
        self._closed = asyncio.Event()
        self._stimulus = itertools.count(1)
        self._watchdog: asyncio.Task[None] | None = None
        self._subscribers: dict[str, Connection] = {}  # clients that get the summary
        # The summary last pushed (the base of the next delta), and its full encoding.
        self._pushed: m.ClusterState | None = None
        self._pushed_frame: list[bytes | memoryview] | None = None
        self._pusher: asyncio.Task[None] | None = None
        self._progress_pusher: asyncio.Task[None] | None = None
        self._balancer: asyncio.Task[None] | None = None
        self._duration_sharer: asyncio.Task[None] | None = None
        self.plugins = SchedulerPlugins(self)  # shoal/plugins/scheduler.py
        self._deadlines = DeadlineTimer(self.state, self._sid)  # coordination timeouts
        self.traffic = Traffic()  # what its connections carried (shoal/comm/traffic.py)
        self.loop_latency = LoopLatency()
        # A /metrics-only HTTP site for Prometheus ("host:port"; None: none), behind
        # ``metrics_token`` if given (shoal/dashboard/serve_metrics.py).
        self.metrics_address = metrics_address
        self.metrics_token = metrics_token
        self.metrics_url = ""
        self._metrics_site: Any = None

    # ---------------------------------------------------------------- Comm (for the core)

    def send_worker(self, address: str, msg: m.Message) -> None:
        conn = self._workers.get(address)
        if conn is None:
            return
        if type(msg) is m.FreeKeys:
            last = conn.last_queued()
            if type(last) is m.FreeKeys:  # adjacent: merging keeps the order of events
                last.keys.extend(msg.keys)
                return
        conn.send(msg)

    def send_client(self, client_id: str, msg: m.Message) -> None:
        conn = self._clients.get(client_id)
        if conn is not None:
            conn.send(msg)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> Scheduler:
        if self.owns_process:
            tune_gc()
            Connection.fatal_on_invalid_state = self.state.validate
        self._server, listening = await listen(
            self.host,
            self.port,
            self._accept,
            self.security,
            self.handshake_timeout,
            traffic=self.traffic,
        )
        self.address = advertised_listener(listening)  # --host 0.0.0.0: a reachable one
        if self.metrics_address is not None:
            try:
                await self._open_metrics_site(self.metrics_address)
            except BaseException:  # e.g. its port taken: no half-started scheduler
                self._server.close()
                raise
        self.loop_latency.start()
        if self.dashboard_address is not None:
            await start_dashboard(self)
        self._watchdog = asyncio.ensure_future(self._check_heartbeats())
        self._pusher = asyncio.ensure_future(self._push_summaries())
        self._progress_pusher = asyncio.ensure_future(self._push_progress())
        if self.state.stealing_enabled:
            self._balancer = asyncio.ensure_future(self._balance())
        self._duration_sharer = asyncio.ensure_future(self._share_lane_durations())
        logger.info("scheduler at %s", self.address)
        return self

    async def _open_metrics_site(self, address: str) -> None:
        from shoal.dashboard.metrics import render_scheduler_metrics  # aiohttp: only now
        from shoal.dashboard.serve_metrics import open_metrics_site

        host = parse_address(self.address)[0]
        render = lambda: render_scheduler_metrics(self)  # noqa: E731
        self._metrics_site = await open_metrics_site(render, address, host, self.metrics_token)
        self.metrics_url = self._metrics_site.url

    @property
    def client_count(self) -> int:
        """Clients connected now."""
        return len(self._clients)

    def write_scheduler_file(self, path: str | os.PathLike[str]) -> None:
        data = {"address": self.address, "id": self.id, "pid": os.getpid()}
        if self.metrics_url:
            data["metrics"] = f"{self.metrics_url}/metrics"  # --metrics-address
        if self.dashboard_port:
            data["dashboard_port"] = self.dashboard_port
        tmp = Path(f"{path}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)  # atomic: readers never see half a file

    def add_plugin(
        self, plugin: object, name: str | None = None, idempotent: bool | None = None
    ) -> str:
        """Register a scheduler plugin from this process (a ``--preload`` module); its
        ``start`` runs in the background. Returns its name."""
        return self.plugins.add_and_start(plugin, name, idempotent)

    async def close(self) -> None:
        await self.plugins.close()
        await stop_dashboard(self)
        if self._server is not None:
            self._server.close()
        for task in (
            self._watchdog,
            self._pusher,
            self._progress_pusher,
            self._balancer,
            self._duration_sharer,
        ):
            if task is not None:
                task.cancel()
        self.loop_latency.stop()
        if self._metrics_site is not None:
            await self._metrics_site.close()
        self._deadlines.cancel()
        for conn in [*self._workers.values(), *self._clients.values()]:
            conn.close()
        self._closed.set()

    async def finished(self) -> None:
        await self._closed.wait()

    def _sid(self, what: str) -> str:
        return f"{what}-{next(self._stimulus)}"

    # ---------------------------------------------------------------- connections

    def _accept(self, conn: Connection) -> None:
        conn.set_handler(self._handshake)

    def _handshake(self, conn: Connection, frame: Frame) -> None:
        try:
            hello = check_hello(frame)
        except HandshakeError as e:
            conn.abort(str(e))
            return
        if hello.role == "worker":
            self._add_worker(conn, hello)
        elif hello.role == "client":
            self._add_client(conn, hello)
        elif hello.role == "nanny":
            self._add_nanny(conn, hello)
        else:
            conn.abort(f"the scheduler does not accept role {hello.role!r}")

    def _add_worker(self, conn: Connection, hello: m.Hello) -> None:
        address = hello.address
        if not address or address in self._workers:
            conn.abort(f"invalid or duplicate worker address {address!r}")
            return
        try:  # peers and clients will connect there: refuse what they could not
            parse_address(address)
        except ValueError as e:
            conn.abort(f"invalid worker address: {e}")
            return
        unreachable = unreachable_advertisement(address, conn.local_host)
        if unreachable:
            conn.abort(unreachable)
            return
        if hello.nthreads < 1:
            conn.abort(f"a worker needs at least one thread, not {hello.nthreads}")
            return
        if hello.lifetime is not None and not 0 <= hello.lifetime < float("inf"):
            conn.abort(f"a worker's remaining lifetime is >= 0 seconds, not {hello.lifetime}")
            return
        if hello.max_tasks is not None and hello.max_tasks < 0:
            conn.abort(f"a worker's task budget is >= 0 tasks, not {hello.max_tasks}")
            return
        self._workers[address] = conn
        conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, hello.name or address))
        self.plugins.worker_joining(conn)

        def on_frame(conn: Connection, frame: Frame) -> None:
            msgs = frame.messages
            if any(type(msg) is m.Heartbeat for msg in msgs):
                msgs = self._worker_heartbeats(address, conn, msgs)
                if not msgs:  # the usual idle frame: nothing for the core to apply
                    return
            self.state.tick(time.time())
            try:
                self.state.handle_worker(address, *msgs)
            except TypeError as e:
                raise ProtocolError(str(e)) from None

        def on_close(conn: Connection, exc: BaseException | None) -> None:
            if self._workers.get(address) is conn:
                del self._workers[address]
                self.state.tick(time.time())
                self.state.remove_worker(address, self._sid("worker-closed"))
                logger.info("worker %s left: %s", address, conn.close_reason)

        conn.on_close = on_close
        conn.set_handler(on_frame)
        self.state.tick(time.time())  # its remaining lifetime becomes a deadline from now
        self.state.add_worker(
            address,
            hello.name,
            hello.nthreads,
            hello.memory_limit,
            self._sid("worker-joined"),
            hello.resources,
            pid=hello.pid,
            now=time.monotonic(),
            lifetime=hello.lifetime,
            max_tasks=hello.max_tasks,
            http_address=hello.http_address,
        )
        logger.info(
            "worker %s joined (%d threads, resources %s)", address, hello.nthreads, hello.resources
        )

    def _add_client(self, conn: Connection, hello: m.Hello) -> None:
        client_id = f"client-{next(self._client_ids)}-{hello.name or 'anonymous'}"
        self._clients[client_id] = conn
        self.state.add_client(client_id)
        conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, client_id, self.dashboard_port))
        if self.plugins.watching_clients:
            self.plugins.add_client(client_id)
        if hello.subscribe:  # clients inside tasks do not: they would multiply the pushes
            self._subscribe(client_id, conn)

        def on_frame(conn: Connection, frame: Frame) -> None:
            batch: list[m.Message] = []
            for msg in frame.messages:
                if isinstance(msg, _QUERIES):
                    if batch:
                        self._client_batch(client_id, batch)
                        batch = []
                    conn.send(self._answer(msg))
                elif isinstance(msg, _PLUGIN_REQUESTS):
                    if batch:
                        self._client_batch(client_id, batch)
                        batch = []
                    self.plugins.on_request(conn, msg)
                elif type(msg) is m.RunFunction:  # run_on_scheduler: a token holder's only
                    if batch:
                        self._client_batch(client_id, batch)
                        batch = []
                    allowed = bool(self.security.token)
                    remote_run.answer(conn, msg, "dask_scheduler", self, allowed)
                else:
                    batch.append(msg)
            if batch:
                self._client_batch(client_id, batch)

        def on_close(conn: Connection, exc: BaseException | None) -> None:
            self._subscribers.pop(client_id, None)
            if self._clients.pop(client_id, None) is not None:
                self.state.tick(time.time())
                self.state.remove_client(client_id, self._sid("client-closed"))
                if self.plugins.watching_clients:
                    self.plugins.remove_client(client_id)

        conn.on_close = on_close
        conn.set_handler(on_frame)

    def _client_batch(self, client_id: str, batch: list[m.Message]) -> None:
        self.state.tick(time.time())
        try:
            self.state.handle_client(client_id, *batch)
        except TypeError as e:
            raise ProtocolError(str(e)) from None
        self._deadlines.arm()
        if self.plugins.watching_graphs:
            self.plugins.update_graph(client_id, batch)

    @property
    def workers(self) -> dict[str, WorkerView]:
        """Read-only snapshots of the workers by address (``pid``, ``name``,
        ``nthreads``, ``memory_limit``, ...), as Dask's ``Scheduler.workers`` is read."""
        return worker_views(self.state.worker_infos())

    def _answer(
        self,
        msg: m.WhoHasRequest
        | m.InfoRequest
        | m.GroupsRequest
        | m.Heartbeat
        | m.EventsRequest
        | m.TaskStreamRequest
        | m.HasWhatRequest,
    ) -> m.Message:
        if isinstance(msg, m.Heartbeat):  # a client checking that we are alive
            return m.HeartbeatReply(msg.request_id, client_heartbeat_interval(len(self._clients)))
        if isinstance(msg, m.GroupsRequest):
            return m.GroupsReply(msg.request_id, *self.state.task_groups(msg.prefix, msg.limit))
        if isinstance(msg, m.WhoHasRequest):
            return m.WhoHasReply(msg.request_id, self.state.who_has(msg.keys))
        if isinstance(msg, m.HasWhatRequest):
            page = self.state.has_what_page(msg.worker, msg.start, msg.limit)
            return msgspec.structs.replace(page, request_id=msg.request_id)
        if isinstance(msg, m.EventsRequest):
            return m.EventsReply(msg.request_id, self.state.get_events(msg.topic))
        if isinstance(msg, m.TaskStreamRequest):
            cursor, records = self.state.task_stream.since(msg.cursor, msg.limit)
            return m.TaskStreamReply(msg.request_id, cursor, records)
        # Any page is answered (empty past the end, from 0 for a negative start), and
        # never sliced with numbers the slicing cannot take (a start of 2**62).
        n = len(self.state.workers)
        start = min(max(0, msg.start), n)
        limit = min(msg.limit, n) if msg.limit >= 0 else -1
        return m.InfoReply(
            msg.request_id,
            self.id,
            self.address,
            self.state.worker_infos(start, limit),
            len(self.state.tasks),
            self.state.summary(),
        )

    # ---------------------------------------------------------------- the pushed summary

    def _subscribe(self, client_id: str, conn: Connection) -> None:
        """Send a new subscriber the full summary that the next pushed delta builds
        on (at most one interval old; ``wait_for_workers`` asks for a fresh one)."""
        if self._pushed is None:
            self._pushed = self.state.summary()
        if self._pushed_frame is None:
            self._pushed_frame = encode_frame([self._pushed])  # once per push, if needed
        self._subscribers[client_id] = conn
        conn.send_frame(self._pushed_frame)

    def _push_delta(self) -> None:
        """What changed since the last push, encoded once for every subscriber: the
        totals, and only the prefixes whose counters moved."""
        now = self.state.summary()
        before = self._pushed
        if before is None:
            delta = now
        else:
            old = {p.name: p for p in before.prefixes}
            current = {p.name for p in now.prefixes}
            delta = msgspec.structs.replace(
                now,
                prefixes=[p for p in now.prefixes if old.get(p.name) != p],
                base=before.version,
                removed=[name for name in old if name not in current],
            )
        frame = encode_frame([delta])
        for conn in list(self._subscribers.values()):
            conn.send_frame(frame)
        self._pushed = now
        self._pushed_frame = None

    async def _push_summaries(self) -> None:
        """Send subscribers what changed, at most once an interval; the interval grows
        with their number, so the bytes sent stay bounded."""
        while True:
            await asyncio.sleep(summary_interval(len(self._subscribers)))
            pushed = self._pushed
            if self._subscribers and (pushed is None or self.state.version != pushed.version):
                self._push_delta()

    async def _push_progress(self) -> None:
        """Send progress watches their counts when they changed, at most once an
        interval: a bar over a million tasks costs a message per interval, not per task."""
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL)
            if self.state.progress_changed:
                self.state.flush_progress()

    async def _balance(self) -> None:
        """Work stealing (shoal/core/scheduler/stealing.py): a periodic balance, so
        that it costs nothing per task."""
        while True:
            await asyncio.sleep(STEAL_INTERVAL)
            self.state.balance(self._sid("steal"))

    async def _share_lane_durations(self) -> None:
        """The prefixes' durations, to the workers that have lanes: periodic, so that it
        costs nothing per task (shoal/core/scheduler/lanes.py)."""
        while True:
            await asyncio.sleep(DURATIONS_INTERVAL)
            self.state.share_lane_durations()

    # ---------------------------------------------------------------- liveness

    def _worker_heartbeats(
        self, address: str, conn: Connection, msgs: list[m.Message]
    ) -> list[m.Message]:
        """Answer a worker's heartbeats; the rest of the batch goes to the core."""
        rest = []
        now = time.monotonic()
        for msg in msgs:
            if type(msg) is m.Heartbeat:
                interval = self.state.heartbeat(address, msg, now)
                conn.send(m.HeartbeatReply(msg.request_id, interval))
            else:
                rest.append(msg)
        return rest

    async def _check_heartbeats(self) -> None:
        """Remove workers whose heartbeats stopped (a frozen process, a blocked loop, a
        vanished host: nothing closes their connection for us)."""
        while True:
            ttl = self.state.worker_ttl_now()
            await asyncio.sleep(min(1.0, ttl / 4))
            self.state.tick(time.time(), self._sid("tick"))  # leases expire when idle too
            for address in self.state.check_heartbeats(time.monotonic(), self._sid("ttl")):
                conn = self._workers.pop(address, None)
                if conn is not None:
                    conn.abort(f"no heartbeat within the {ttl:.1f}s TTL: removed")

    def _add_nanny(self, conn: Connection, hello: m.Hello) -> None:
        """A nanny reports the exits of the worker it supervises (a kill for memory
        before it happens, so a KilledWorker can say so), and runs nanny plugins."""
        name = hello.name
        conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, "nanny"))
        self.plugins.nanny_joined(name, conn)
        conn.on_close = lambda conn, exc: self.plugins.nanny_left(name, conn)

        def on_frame(conn: Connection, frame: Frame) -> None:
            for msg in frame.messages:
                if type(msg) is m.Heartbeat:  # "have you read my reports?" (before a kill)
                    conn.send(m.HeartbeatReply(msg.request_id, 0.0))
                    continue
                if type(msg) is m.LogEvent and msg.topic:  # a nanny plugin's event
                    self.state.log_event(msg.topic, {**msg.data, "nanny": name})
                    continue
                if type(msg) is not m.WorkerExited:
                    raise ProtocolError(f"a nanny may not send {type(msg).__name__}")
                logger.info("worker %s exited: %s", msg.address, msg.reason)
                worker_conn = self._workers.pop(msg.address, None)
                if worker_conn is not None:
                    worker_conn.close()
                sid = msg.stimulus_id or self._sid("worker-exited")
                self.state.tick(time.time())
                self.state.remove_worker(msg.address, sid, f"exited: {msg.reason}")

        conn.set_handler(on_frame)
