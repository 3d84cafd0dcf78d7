"""Plugins on the scheduler: its own (``SchedulerPlugin``), and the worker and nanny
plugins it keeps and hands on.

Registering a scheduler plugin is the one place where the scheduler unpickles an
object a client sent, so only a client that proved the cluster token may do it: with
no token on the scheduler every registration is refused, saying how to set one.
Worker and nanny plugins pass through as opaque bytes, sent to every worker (nanny)
connected and to each that joins later; the scheduler never unpickles them.

Hooks run in this server shell, fed from what the core did: transitions through the
core's ``watch_transitions`` (only while some plugin has a ``transition`` hook, so
the per-task path costs nothing otherwise), after the batch that made them.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
from collections.abc import Callable, Coroutine
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from shoal.comm.connection import CommClosedError, Connection
from shoal.plugins.base import plugin_name
from shoal.plugins.registry import TOPIC, PluginRegistry, describe, result_of
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.server.scheduler import Scheduler

KINDS = ("scheduler", "worker", "nanny")
NO_TOKEN = (
    "registering a plugin makes the scheduler unpickle an object a client sent, which it "
    "does only for clients that proved the cluster token, and this scheduler has none: "
    "start it with a token (shoal scheduler --token, the SHOAL_TOKEN variable, or "
    "Security(token=...); LocalCluster makes one unless token=False)"
)


class PluginRefused(Exception):
    """A plugin request refused as a whole; ``error_type`` is what the client raises."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


class SchedulerView:
    """What a scheduler plugin gets as ``scheduler``: the core's records through
    read-only mappings (do not change the records themselves: the state machine owns
    them), the event log, and the scheduler's identity."""

    def __init__(self, server: Scheduler):
        self._server = server

    @property
    def address(self) -> str:
        return self._server.address

    @property
    def id(self) -> str:
        return self._server.id

    @property
    def tasks(self) -> MappingProxyType[Any, Any]:
        return MappingProxyType(self._server.state.tasks)

    @property
    def workers(self) -> MappingProxyType[str, Any]:
        return MappingProxyType(self._server.state.workers)

    @property
    def clients(self) -> MappingProxyType[str, Any]:
        return MappingProxyType(self._server.state.clients)

    def log_event(self, topic: str, msg: Any) -> None:
        """Record ``msg`` (a dict of plain values, or one value) under ``topic``; every
        plugin's ``log_event`` hook sees it too (as Dask)."""
        data = msg if isinstance(msg, dict) else {"msg": msg}
        self._server.state.log_event(topic, data)
        self._server.plugins.registry.dispatch("log_event", topic, msg)

    def get_events(self, topic: str | None = None) -> dict[str, list[Any]]:
        return self._server.state.get_events(topic)

    def __repr__(self) -> str:
        return f"<SchedulerView {self.address}>"


class SchedulerPlugins:
    def __init__(self, server: Scheduler):
        self.server = server
        self.view = SchedulerView(server)
        self.registry = PluginRegistry("scheduler", self._record_failure, self._spawn)
        # name -> the pickle a client sent: never unpickled here
        self.worker_plugins: dict[str, bytes] = {}
        self.nanny_plugins: dict[str, bytes] = {}
        self.nannies: dict[str, Connection] = {}  # nanny name -> its connection
        self.watching_graphs = False  # some plugin has update_graph
        self.watching_clients = False  # some plugin has add_client or remove_client
        self._watching_transitions = False
        self._watching_workers = False
        self._workers_changed: list[tuple[str, str, str]] = []
        self._transitions: list[tuple[Any, ...]] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record_failure(self, data: dict[str, Any]) -> None:
        self.server.state.log_event(TOPIC, data)

    # ---------------------------------------------------------------- scheduler plugins

    def add_plugin(
        self, plugin: Any, name: str | None = None, idempotent: bool | None = None
    ) -> str:
        """Register ``plugin`` here (a preload's, or one a client sent) and return its
        name; its ``start`` hook is run by ``add`` (or spawned by the server's
        ``add_plugin``). A plugin of the same name is replaced (closed), unless
        ``idempotent``: then the new one is ignored."""
        name = name or plugin_name(plugin)
        if idempotent is None:
            idempotent = bool(getattr(plugin, "idempotent", False))
        if name in self.registry:
            if idempotent:
                return name
            old = self.registry.remove(name)
            self._spawn(self.registry.call(name, "close", plugin=old))
        self.registry.add(name, plugin)
        self._update_watches()
        return name

    def add_and_start(
        self, plugin: Any, name: str | None = None, idempotent: bool | None = None
    ) -> str:
        """``add_plugin``, and its ``start`` hook spawned (a preload's plugin)."""
        name = name or plugin_name(plugin)
        if idempotent is None:
            idempotent = bool(getattr(plugin, "idempotent", False))
        if idempotent and name in self.registry:
            return name
        self.add_plugin(plugin, name, idempotent=False)
        self._spawn(self.registry.call(name, "start", self.view))
        return name

    async def add(
        self, plugin: Any, name: str | None = None, idempotent: bool | None = None
    ) -> BaseException | None:
        """Register ``plugin`` and run its ``start``; what ``start`` raised (the plugin
        is then dropped), or None."""
        name = name or plugin_name(plugin)
        if idempotent and name in self.registry:
            return None
        self.add_plugin(plugin, name, idempotent=False)
        exc = await self.registry.call(name, "start", self.view)
        if exc is not None and self.registry.plugins.get(name) is plugin:
            self.registry.remove(name)
            self._update_watches()
        return exc

    async def remove(self, name: str) -> BaseException | None:
        """Unregister the scheduler plugin ``name``; what its ``close`` raised, or None."""
        plugin = self.registry.remove(name)
        self._update_watches()
        return await self.registry.call(name, "close", plugin=plugin)

    async def close(self) -> None:
        """The scheduler closes: ``before_close``, then ``close`` of every plugin."""
        for name in list(self.registry.plugins):
            await self.registry.call(name, "before_close")
        await self.registry.close_all("close")
        self._update_watches()

    def _update_watches(self) -> None:
        watch = self.registry.hooked("transition")
        if watch != self._watching_transitions:
            self._watching_transitions = watch
            sink = self._transitions if watch else None
            self.server.state.watch_transitions(sink, self._schedule_flush)
        watch = self.registry.hooked("add_worker") or self.registry.hooked("remove_worker")
        if watch != self._watching_workers:
            self._watching_workers = watch
            self.server.state.watch_workers(self._on_worker if watch else None)
        self.watching_graphs = self.registry.hooked("update_graph")
        self.watching_clients = self.registry.hooked("add_client") or self.registry.hooked(
            "remove_client"
        )
        # A lane's task reaches neither hook: lanes close while a plugin watches (shoal/lanes).
        lanes = not (self._watching_transitions or self.watching_graphs)
        if lanes != self.server.state.lanes_enabled:
            why = "a scheduler plugin watches transitions or graphs"
            self.server.state.set_lanes_enabled(lanes, why)

    def _schedule_flush(self) -> None:
        """The core recorded a first transition (or worker change) since the last
        flush: hand them to the plugins once the batch is over."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_feed)

    def _on_worker(self, entry: tuple[str, str, str]) -> None:
        """Called by the core when a worker joins or is removed (however it goes)."""
        self._workers_changed.append(entry)
        self._schedule_flush()

    def _flush_feed(self) -> None:
        self._flush_scheduled = False
        changes, self._workers_changed = self._workers_changed, []
        entries = self._transitions[:]
        self._transitions.clear()  # the core appends to this very list
        dispatch = self.registry.dispatch
        for change, address, stimulus_id in changes:
            if change == "add":
                dispatch("add_worker", self.view, address)
            else:
                dispatch("remove_worker", self.view, address, stimulus_id=stimulus_id)
        if entries:
            self.registry.dispatch_transitions(entries)

    # ---------------------------------------------------------------- events from the server

    def worker_joining(self, conn: Connection) -> None:
        """Before the core learns of a worker: the worker plugins go first, so that
        they are set up before its first task."""
        for name, data in self.worker_plugins.items():
            conn.send(m.RegisterPlugin(0, "worker", name, data))

    def add_client(self, client_id: str) -> None:
        self.registry.dispatch("add_client", self.view, client_id)

    def remove_client(self, client_id: str) -> None:
        self.registry.dispatch("remove_client", self.view, client_id)

    def update_graph(self, client_id: str, msgs: list[m.Message]) -> None:
        """After the core took a batch of a client's messages: one call per graph part."""
        for msg in msgs:
            if type(msg) is m.SubmitTasks:
                self.registry.dispatch(
                    "update_graph",
                    self.view,
                    client=client_id,
                    keys=set(msg.wanted),
                    tasks=[spec.key for spec in msg.tasks],
                    annotations={},
                    priority={spec.key: spec.priority for spec in msg.tasks if spec.priority},
                    stimulus_id=msg.stimulus_id,
                )

    def nanny_joined(self, name: str, conn: Connection) -> None:
        self.nannies[name] = conn
        for plugin_name_, data in self.nanny_plugins.items():
            conn.send(m.RegisterPlugin(0, "nanny", plugin_name_, data))

    def nanny_left(self, name: str, conn: Connection) -> None:
        if self.nannies.get(name) is conn:
            del self.nannies[name]

    # ---------------------------------------------------------------- client requests

    def on_request(self, conn: Connection, msg: m.RegisterPlugin | m.UnregisterPlugin) -> None:
        self._spawn(self._answer(conn, msg))

    async def _answer(self, conn: Connection, msg: m.RegisterPlugin | m.UnregisterPlugin) -> None:
        try:
            if type(msg) is m.RegisterPlugin:
                kind, results = msg.kind, await self._register(msg)
            else:
                kind, results = await self._unregister(msg)  # type: ignore[arg-type]
            reply = m.PluginReply(msg.request_id, kind, results)
        except PluginRefused as e:
            reply = m.PluginReply(msg.request_id, error=str(e), error_type=e.error_type)
        if not conn.closed:
            conn.send(reply)

    async def _register(self, msg: m.RegisterPlugin) -> dict[str, m.PluginResult]:
        if not self.server.security.token:
            raise PluginRefused("PermissionError", NO_TOKEN)
        if msg.kind not in KINDS:
            raise PluginRefused("ValueError", f"unknown plugin kind {msg.kind!r}: one of {KINDS}")
        if not msg.name:
            raise PluginRefused("ValueError", "a plugin needs a non-empty name")
        if msg.kind == "scheduler":
            if msg.idempotent and msg.name in self.registry:
                return {}
            try:  # the one unpickling of a client's object, from a token holder only
                plugin = pickle.loads(msg.plugin)
            except Exception as e:
                raise PluginRefused(
                    "ValueError",
                    f"the scheduler cannot unpickle plugin {msg.name!r}: {describe(e)}",
                ) from None
            return {"scheduler": result_of(await self.add(plugin, msg.name))}
        stored = self.worker_plugins if msg.kind == "worker" else self.nanny_plugins
        if msg.idempotent and msg.name in stored:
            return {}
        stored[msg.name] = msg.plugin
        targets = self.server._workers if msg.kind == "worker" else self.nannies
        return await self._ask_all(
            targets, lambda rid: m.RegisterPlugin(rid, msg.kind, msg.name, msg.plugin)
        )

    async def _unregister(self, msg: m.UnregisterPlugin) -> tuple[str, dict[str, m.PluginResult]]:
        if not self.server.security.token:
            raise PluginRefused("PermissionError", NO_TOKEN)
        if msg.kind and msg.kind not in KINDS:
            raise PluginRefused("ValueError", f"unknown plugin kind {msg.kind!r}: one of {KINDS}")
        name = msg.name
        kinds = [msg.kind] if msg.kind else list(KINDS)
        if "scheduler" in kinds and name in self.registry:
            return "scheduler", {"scheduler": result_of(await self.remove(name))}
        for kind, stored, targets in (
            ("worker", self.worker_plugins, self.server._workers),
            ("nanny", self.nanny_plugins, self.nannies),
        ):
            if kind in kinds and name in stored:
                del stored[name]
                request = functools.partial(_unregister_request, name=name, kind=kind)
                return kind, await self._ask_all(targets, request)
        registered = {
            "scheduler": sorted(self.registry.plugins),
            "worker": sorted(self.worker_plugins),
            "nanny": sorted(self.nanny_plugins),
        }
        raise PluginRefused(
            "ValueError",
            f"no {msg.kind + ' ' if msg.kind else ''}plugin named {name!r} is registered "
            f"(registered: {registered})",
        )

    @staticmethod
    async def _ask_all(
        targets: dict[str, Connection], make: Callable[[int], m.Message]
    ) -> dict[str, m.PluginResult]:
        """Send the request to every worker (nanny) connected now; what each said."""

        async def ask(who: str, conn: Connection) -> dict[str, m.PluginResult]:
            try:
                reply, _ = await conn.request(make)
            except (CommClosedError, OSError) as e:
                return {who: m.PluginResult("error", f"{who} left before answering: {e}")}
            if not isinstance(reply, m.PluginReply):  # pragma: no cover - routed by type
                return {who: m.PluginResult("error", f"{who} answered {reply!r}")}
            return dict(reply.results)

        results: dict[str, m.PluginResult] = {}
        for answer in await asyncio.gather(*(ask(w, c) for w, c in list(targets.items()))):
            results.update(answer)
        return results


def _unregister_request(request_id: int, name: str, kind: str) -> m.Message:
    return m.UnregisterPlugin(request_id, name, kind)
