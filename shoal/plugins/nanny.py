"""Plugins on a nanny: the ``NannyPlugin`` s the scheduler sends, at registration and
when the nanny connects (before it starts its worker, so a plugin's ``setup`` prepares
every worker process it starts). A plugin with ``restart = True`` registered while the
worker runs restarts it (gracefully: SIGTERM, the worker hands its results off and
asks for a fresh process)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import pickle
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from shoal.comm.connection import CommClosedError
from shoal.plugins.registry import TOPIC, PluginRegistry, describe, result_of
from shoal.protocol import messages as m
from shoal.protocol.framing import ProtocolError

if TYPE_CHECKING:
    from shoal.server.nanny import Nanny

NO_TOKEN = (
    "this nanny has no cluster token: it unpickles plugins only from a scheduler that proved one"
)


class NannyView:
    """What a nanny plugin gets as ``nanny``."""

    def __init__(self, nanny: Nanny):
        self._nanny = nanny

    name = property(lambda self: self._nanny.name)
    scheduler_address = property(lambda self: self._nanny.scheduler_address)
    local_directory = property(lambda self: self._nanny.directory)

    @property
    def worker_address(self) -> str:
        """The address of the worker it runs now ("" while none has joined)."""
        return self._nanny._read_address()

    def log_event(self, topic: str, msg: Any) -> None:
        """Record ``msg`` in the scheduler's event log under ``topic``."""
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"an event topic is a non-empty str, not {topic!r}")
        conn = self._nanny._scheduler
        data = msg if isinstance(msg, dict) else {"msg": msg}
        if conn is not None and not conn.closed:
            with contextlib.suppress(CommClosedError):
                conn.send(m.LogEvent(topic, data, "nanny-plugin-event"))

    def __repr__(self) -> str:
        return f"<NannyView {self.name}>"


class NannyPlugins:
    def __init__(self, nanny: Nanny):
        self.nanny = nanny
        self.view = NannyView(nanny)
        self.registry = PluginRegistry(f"nanny {nanny.name}", self._record_failure, self._spawn)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._setting_up: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record_failure(self, data: dict[str, Any]) -> None:
        self.view.log_event(TOPIC, data)

    async def settled(self) -> None:
        """Wait for the ``setup`` of plugins that are coroutines (before a worker starts)."""
        while self._setting_up:
            await asyncio.gather(*self._setting_up, return_exceptions=True)

    async def teardown_all(self) -> None:
        await self.registry.close_all("teardown", self.view)

    def on_message(self, msg: m.RegisterPlugin | m.UnregisterPlugin) -> None:
        if msg.kind != "nanny":
            raise ProtocolError(f"a nanny does not run {msg.kind!r} plugins")
        outcome: Any
        if type(msg) is m.UnregisterPlugin:
            outcome = None
            if msg.name in self.registry:
                plugin = self.registry.remove(msg.name)
                outcome = self.registry.call_now(msg.name, "teardown", self.view, plugin=plugin)
        elif not self.nanny.security.token:
            outcome = PermissionError(NO_TOKEN)
        else:
            outcome = self._register(msg)  # type: ignore[arg-type]
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(self._reply_later(msg, outcome))
            self._setting_up.add(task)
            task.add_done_callback(self._setting_up.discard)
        else:
            self._done(msg, outcome)

    def _register(self, msg: m.RegisterPlugin) -> Any:
        try:
            plugin = pickle.loads(msg.plugin)
        except Exception as e:
            self.registry.failed(msg.name, "unpickle", e)
            return ValueError(f"cannot unpickle plugin {msg.name!r}: {describe(e)}")
        if msg.name in self.registry:
            old = self.registry.remove(msg.name)
            self.registry.call_now(msg.name, "teardown", self.view, plugin=old)
        self.registry.add(msg.name, plugin)
        outcome = self.registry.call_now(msg.name, "setup", self.view)
        if not inspect.isawaitable(outcome) and outcome is not None:
            self.registry.remove(msg.name)
        return outcome

    async def _reply_later(
        self, msg: m.RegisterPlugin | m.UnregisterPlugin, outcome: Awaitable[Any]
    ) -> None:
        exc = await outcome
        if exc is not None and type(msg) is m.RegisterPlugin and msg.name in self.registry:
            self.registry.remove(msg.name)
        self._done(msg, exc)

    def _done(self, msg: m.RegisterPlugin | m.UnregisterPlugin, exc: BaseException | None) -> None:
        """Answer the scheduler; a newly set up plugin that asks for it restarts the
        running worker (one that starts later has been prepared already)."""
        if type(msg) is m.RegisterPlugin and exc is None:
            plugin = self.registry.plugins.get(msg.name)
            if getattr(plugin, "restart", False):
                self.nanny.restart_worker(f"nanny plugin {msg.name!r} asks for a restart")
        conn = self.nanny._scheduler
        if msg.request_id and conn is not None and not conn.closed:
            reply = m.PluginReply(msg.request_id, "nanny", {self.nanny.name: result_of(exc)})
            with contextlib.suppress(CommClosedError):
                conn.send(reply)
