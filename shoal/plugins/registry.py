"""The plugins of one process by name, and the one way their hooks are called: a hook
that raises is logged with its traceback and reported (to the scheduler's event log,
topic "plugins"), and the caller goes on. Used alike by the scheduler, the workers
and the nannies; no network, no event loop of its own (coroutines a hook returns are
handed to ``spawn``)."""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from shoal.protocol import messages as m

logger = logging.getLogger("shoal.plugins")

TOPIC = "plugins"  # the event-log topic of plugin failures
TRACEBACK_CHARS = 4_000  # of a failure's traceback kept in its event (the end of it)
LOGGED_TRACEBACKS = 10  # per plugin and hook; then one line per 1,000 failures (every one
# is still an event): a transition hook that always raises would flood the log

Spawn = Callable[[Coroutine[Any, Any, Any]], None]
HOOKS = (
    "start",
    "before_close",
    "close",
    "update_graph",
    "transition",
    "add_worker",
    "remove_worker",
    "add_client",
    "remove_client",
    "log_event",
    "setup",
    "teardown",
)


def is_noop(method: Any) -> bool:
    """A hook as a base class defines it (never called)."""
    return bool(getattr(getattr(method, "__func__", method), "_shoal_noop", False))


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def result_of(exc: BaseException | None) -> m.PluginResult:
    """The wire form of a hook's outcome (None: it went well)."""
    if exc is None:
        return m.PluginResult("OK")
    tb = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
    return m.PluginResult("error", describe(exc), tb)


class PluginRegistry:
    """``where`` names this process in what failures report ("scheduler", "worker
    tcp://...", "nanny NAME"); ``on_error(data)`` records a failure (an event);
    ``spawn(coroutine)`` runs the coroutines that async hooks return."""

    def __init__(
        self, where: str, on_error: Callable[[dict[str, Any]], None], spawn: Spawn
    ) -> None:
        self.where = where
        self.plugins: dict[str, Any] = {}
        self._on_error = on_error
        self._spawn = spawn
        self._hooks: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        self.failures: dict[tuple[str, str], int] = {}  # (plugin, hook) -> how many

    def __contains__(self, name: object) -> bool:
        return name in self.plugins

    def __len__(self) -> int:
        return len(self.plugins)

    def add(self, name: str, plugin: Any) -> None:
        self.plugins[name] = plugin
        self._index()

    def remove(self, name: str) -> Any:
        plugin = self.plugins.pop(name)
        self._index()
        return plugin

    def hooked(self, hook: str) -> bool:
        """Some plugin overrides ``hook``."""
        return hook in self._hooks

    def _index(self) -> None:
        """Per hook, the plugins that override it: a dispatch never looks at others."""
        hooks: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        for name, plugin in self.plugins.items():
            for hook in HOOKS:
                method = getattr(plugin, hook, None)
                if callable(method) and not is_noop(method):
                    hooks.setdefault(hook, []).append((name, method))
        self._hooks = hooks

    def failed(self, name: str, hook: str, exc: BaseException) -> None:
        n = self.failures[name, hook] = self.failures.get((name, hook), 0) + 1
        if n <= LOGGED_TRACEBACKS:
            logger.error("plugin %r failed in %s on %s", name, hook, self.where, exc_info=exc)
        elif n % 1000 == 0:
            logger.error(
                "plugin %r failed in %s on %s %d times: %s",
                name,
                hook,
                self.where,
                n,
                describe(exc),
            )
        data = {
            "action": "failed",
            "plugin": name,
            "hook": hook,
            "where": self.where,
            "error": describe(exc),
            "traceback": "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:],
        }
        try:
            self._on_error(data)
        except Exception:  # the report itself must not break the caller
            logger.exception("could not record the failure of plugin %r", name)

    def dispatch_transitions(self, entries: list[tuple[Any, ...]]) -> None:
        """``transition(key, start, finish, stimulus_id=...)`` for each entry, on every
        plugin that has the hook: the per-task path of a watched machine, so one loop."""
        hooks = self._hooks.get("transition", ())
        for name, method in hooks:
            for key, start, finish, stimulus_id in entries:
                try:
                    method(key, start, finish, stimulus_id=stimulus_id)
                except Exception as e:
                    self.failed(name, "transition", e)

    def dispatch(self, hook: str, *args: Any, **kwargs: Any) -> None:
        """Call ``hook`` on every plugin that has it; coroutines it returns are spawned."""
        for name, method in self._hooks.get(hook, ()):
            try:
                result = method(*args, **kwargs)
            except Exception as e:
                self.failed(name, hook, e)
                continue
            if inspect.isawaitable(result):
                self._spawn(self._finish(name, hook, result))

    async def call(
        self, name: str, hook: str, *args: Any, plugin: Any = None, **kwargs: Any
    ) -> BaseException | None:
        """Call one plugin's ``hook`` (``plugin``: one no longer registered under
        ``name``) and wait for it; what it raised (reported), or None."""
        outcome = self.call_now(name, hook, *args, plugin=plugin, **kwargs)
        if inspect.isawaitable(outcome):
            return await outcome
        return outcome

    def call_now(self, name: str, hook: str, *args: Any, plugin: Any = None, **kwargs: Any) -> Any:
        """As ``call``, but a synchronous hook runs at once (before whatever the caller
        does next, e.g. the tasks in the same frame): what it raised or None, or an
        awaitable of that if the hook is a coroutine."""
        target = self.plugins.get(name) if plugin is None else plugin
        method = getattr(target, hook, None)
        if method is None or is_noop(method):
            return None
        try:
            result = method(*args, **kwargs)
        except Exception as e:
            self.failed(name, hook, e)
            return e
        if inspect.isawaitable(result):
            return self._finish(name, hook, result)
        return None

    async def _finish(
        self, name: str, hook: str, awaitable: Awaitable[Any]
    ) -> BaseException | None:
        try:
            await awaitable
        except Exception as e:
            self.failed(name, hook, e)
            return e
        return None

    async def close_all(self, hook: str, *args: Any) -> None:
        """Call ``hook`` (teardown, close) on every plugin, newest first, and forget them."""
        for name in reversed(list(self.plugins)):
            await self.call(name, hook, *args)
        self.plugins.clear()
        self._index()
