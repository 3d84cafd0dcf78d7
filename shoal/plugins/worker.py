"""Plugins on a worker: the ``WorkerPlugin`` s the scheduler sends (at registration, and
when this worker joins), and those a ``--preload`` module adds.

A worker unpickles a plugin only from its scheduler, over a connection that proved
the cluster token (a worker without a token refuses). Transitions reach ``transition``
hooks through the core's ``watch_transitions``, only while some plugin has one, after
the batch of events that made them (and before the next one is handled)."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import pickle
from collections.abc import Awaitable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from shoal.plugins.base import plugin_name
from shoal.plugins.registry import TOPIC, PluginRegistry, describe, result_of
from shoal.protocol import messages as m
from shoal.protocol.framing import ProtocolError

if TYPE_CHECKING:
    from shoal.server.worker import Worker

IDLE_POLL = 0.01  # seconds between looks at running tasks, closing gracefully
NO_TOKEN = (
    "this worker has no cluster token: it unpickles plugins only from a scheduler that proved one"
)


class WorkerView:
    """What a worker plugin gets as ``worker``: its identity, its tasks and results
    through read-only mappings, events for the scheduler's log, and a way to leave."""

    def __init__(self, worker: Worker):
        self._worker = worker
        self._sids = itertools.count(1)
        self._closing = False

    address = property(lambda self: self._worker.address)
    name = property(lambda self: self._worker.name)
    id = property(lambda self: self._worker.id)
    nthreads = property(lambda self: self._worker.nthreads)
    memory_limit = property(lambda self: self._worker.memory_limit)
    scheduler_address = property(lambda self: self._worker.scheduler_address)
    local_directory = property(lambda self: self._worker.local_directory)

    @property
    def tasks(self) -> MappingProxyType[Any, Any]:
        assert self._worker.state is not None
        return MappingProxyType(self._worker.state.tasks)

    @property
    def data(self) -> MappingProxyType[Any, Any]:
        assert self._worker.state is not None
        return MappingProxyType(self._worker.state.data)

    def log_event(self, topic: str, msg: Any) -> None:
        """Record ``msg`` (a dict of plain values, or one value) in the scheduler's
        event log under ``topic`` (with this worker's address)."""
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"an event topic is a non-empty str, not {topic!r}")
        data = msg if isinstance(msg, dict) else {"msg": msg}
        conn = self._worker.scheduler
        if conn is not None and not conn.closed:
            conn.send(m.LogEvent(topic, data, f"plugin-event-{next(self._sids)}"))

    def close_gracefully(
        self, reason: str = "closed by a plugin", restart: bool | None = None
    ) -> None:
        """Start no further task, let the running ones finish, hand this worker's
        results to other workers, and close; with ``restart`` (by default: if a nanny
        runs it) the nanny starts a fresh process."""
        worker = self._worker
        if worker.leaving or worker.state is None or self._closing:
            return
        self._closing = True
        worker._set_paused(True)  # at once: the scheduler sends no more, none starts
        if restart is None:
            restart = worker.under_nanny
        worker._spawn(self._leave_when_idle(reason, restart))

    async def _leave_when_idle(self, reason: str, restart: bool) -> None:
        worker = self._worker
        while worker.state is not None and worker.state.executing_count and not worker.leaving:
            await asyncio.sleep(IDLE_POLL)
        await worker.leave(reason, retire=True, restart=restart)

    def __repr__(self) -> str:
        return f"<WorkerView {self.address}>"


class WorkerPlugins:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.view = WorkerView(worker)
        self.registry = PluginRegistry("worker", self._record_failure, worker._spawn)
        self.watching = False  # some plugin has a transition hook: flush after each batch
        self._transitions: list[tuple[Any, ...]] = []

    def _record_failure(self, data: dict[str, Any]) -> None:
        self.view.log_event(TOPIC, data)

    # ---------------------------------------------------------------- adding, removing

    def add(self, plugin: Any, name: str | None = None) -> Any:
        """Register ``plugin`` (replacing one of the same name, torn down) and run its
        ``setup`` now: what it raised (the plugin is then dropped) or None, or an
        awaitable of that if ``setup`` is a coroutine."""
        name = name or plugin_name(plugin)
        self.registry.where = f"worker {self.worker.address}"
        if name in self.registry:
            self._drop(name)
        self.registry.add(name, plugin)
        self._update_watch()
        outcome = self.registry.call_now(name, "setup", self.view)
        if inspect.isawaitable(outcome):
            return self._settle(name, plugin, outcome)
        if outcome is not None:
            self._forget(name, plugin)
        return outcome

    async def _settle(self, name: str, plugin: Any, outcome: Awaitable[Any]) -> Any:
        exc = await outcome
        if exc is not None:
            self._forget(name, plugin)
        return exc

    def _forget(self, name: str, plugin: Any) -> None:
        if self.registry.plugins.get(name) is plugin:
            self.registry.remove(name)
            self._update_watch()

    def _drop(self, name: str) -> Any:
        """Unregister ``name`` and tear it down: as ``add``'s outcome."""
        plugin = self.registry.remove(name)
        self._update_watch()
        return self.registry.call_now(name, "teardown", self.view, plugin=plugin)

    async def teardown_all(self) -> None:
        """The worker closes: every plugin's ``teardown``, newest first."""
        await self.registry.close_all("teardown", self.view)
        self._update_watch()

    def _update_watch(self) -> None:
        watch = self.registry.hooked("transition")
        if watch != self.watching and self.worker.state is not None:
            self.watching = watch
            self.worker.state.watch_transitions(self._transitions if watch else None)

    def flush_transitions(self) -> None:
        """After a batch of the core: its transitions to the ``transition`` hooks."""
        entries = self._transitions[:]
        self._transitions.clear()  # the core holds this list's append
        self.registry.dispatch_transitions(entries)

    # ---------------------------------------------------------------- the scheduler's requests

    def on_message(self, msg: m.RegisterPlugin | m.UnregisterPlugin) -> None:
        if msg.kind != "worker":
            raise ProtocolError(f"a worker does not run {msg.kind!r} plugins")
        if type(msg) is m.UnregisterPlugin:
            outcome = self._drop(msg.name) if msg.name in self.registry else None
        elif not self.worker.security.token:
            outcome = PermissionError(NO_TOKEN)
        else:
            outcome = self._register(msg)  # type: ignore[arg-type]
        if inspect.isawaitable(outcome):
            self.worker._spawn(self._reply_later(msg.request_id, outcome))
        else:
            self._reply(msg.request_id, outcome)

    def _register(self, msg: m.RegisterPlugin) -> Any:
        from shoal.server.worker import DESERIALISE_LOCK  # unpickling imports modules

        try:
            with DESERIALISE_LOCK:
                plugin = pickle.loads(msg.plugin)
        except Exception as e:
            self.registry.failed(msg.name, "unpickle", e)
            return ValueError(f"cannot unpickle plugin {msg.name!r}: {describe(e)}")
        return self.add(plugin, msg.name)

    async def _reply_later(self, request_id: int, outcome: Awaitable[Any]) -> None:
        self._reply(request_id, await outcome)

    def _reply(self, request_id: int, exc: BaseException | None) -> None:
        conn = self.worker.scheduler
        if request_id and conn is not None and not conn.closed:  # 0: a push, no answer
            conn.send(m.PluginReply(request_id, "worker", {self.worker.address: result_of(exc)}))
