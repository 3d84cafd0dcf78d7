"""Plugins from the client's side: ``client.register_plugin(plugin, name=None,
idempotent=None)`` and ``client.unregister_plugin(name)``, as Dask's. A mixin of
:class:`~shoal.client.client.Client`, whose connection and loop it uses.

The plugin is pickled here (cloudpickle: a class defined in a script or a notebook
travels by value); the scheduler unpickles it only if it is a scheduler plugin, and
only because this client proved the cluster token."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from shoal.comm.connection import Connection
from shoal.plugins.base import plugin_kind, plugin_name
from shoal.protocol import messages as m

T = TypeVar("T")

_REFUSALS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "PermissionError": PermissionError,
}


class PluginError(RuntimeError):
    """A plugin's hook raised where it runs (``setup`` on a worker, ``start`` on the
    scheduler, ...); the message names the plugin, the process and the error, and
    ``results`` holds every process's answer."""

    def __init__(self, message: str, results: dict[str, dict[str, str]]):
        super().__init__(message)
        self.results = results


class PluginsMixin:
    asynchronous: bool
    _conn: Connection | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def register_plugin(
        self, plugin: Any, name: str | None = None, idempotent: bool | None = None
    ) -> Any:
        """Register a :class:`~shoal.SchedulerPlugin` (runs in the scheduler), a
        :class:`~shoal.WorkerPlugin` (in every worker, now and joining later) or a
        :class:`~shoal.NannyPlugin` (in every nanny, now and later). ``name``: the
        plugin's ``name`` attribute, else its class name and a random suffix; a plugin
        of that name is replaced, unless ``idempotent`` (default: the plugin's
        attribute), then this one is ignored.

        Returns None for a scheduler plugin, else ``{worker address or nanny name:
        {"status": "OK"}}``; raises :class:`PluginError` if its setup (start) raised
        anywhere, ``PermissionError`` if the scheduler has no cluster token (the only
        way it trusts a client to make it unpickle an object)."""
        kind = plugin_kind(plugin)
        name = name or plugin_name(plugin)
        if idempotent is None:
            idempotent = bool(getattr(plugin, "idempotent", False))
        data = cloudpickle.dumps(plugin)

        async def register() -> Any:
            reply = await self._plugin_request(
                lambda rid: m.RegisterPlugin(rid, kind, name, data, idempotent)
            )
            results = _checked(reply, name, "setup" if kind != "scheduler" else "start")
            return None if kind == "scheduler" else results

        return register() if self.asynchronous else self._sync(register())

    def unregister_plugin(self, name: str) -> Any:
        """Unregister the plugin ``name`` (of whatever kind): ``teardown`` runs on every
        worker (nanny), ``close`` on the scheduler; no process gets it any more.
        Returns what ``register_plugin`` does; ValueError for an unknown name."""
        return self._unregister(name, "")

    def unregister_worker_plugin(self, name: str, nanny: bool | None = None) -> Any:
        """Dask's name: unregister the worker (``nanny=True``: nanny) plugin ``name``."""
        return self._unregister(name, "nanny" if nanny else "worker")

    def unregister_scheduler_plugin(self, name: str) -> Any:
        """Dask's name: unregister the scheduler plugin ``name``."""
        return self._unregister(name, "scheduler")

    def _unregister(self, name: str, kind: str) -> Any:
        async def unregister() -> Any:
            reply = await self._plugin_request(lambda rid: m.UnregisterPlugin(rid, name, kind))
            hook = "close" if reply.kind == "scheduler" else "teardown"
            results = _checked(reply, name, hook)
            return None if reply.kind == "scheduler" else results

        return unregister() if self.asynchronous else self._sync(unregister())

    async def _plugin_request(self, make: Any) -> m.PluginReply:
        conn = self._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        # No timeout: a plugin's setup may take long (installing a package); a worker
        # that dies meanwhile is answered for by the scheduler.
        reply, _ = await conn.request(make)
        assert isinstance(reply, m.PluginReply)
        return reply


def _checked(reply: m.PluginReply, name: str, hook: str) -> dict[str, dict[str, str]]:
    if reply.error:
        raise _REFUSALS.get(reply.error_type, RuntimeError)(reply.error)
    results = {
        who: {"status": r.status, **({"error": r.error} if r.error else {})}
        for who, r in reply.results.items()
    }
    failed = {who: r for who, r in reply.results.items() if r.status != "OK"}
    if failed:
        who, first = next(iter(failed.items()))
        more = f" (and on {len(failed) - 1} more)" if len(failed) > 1 else ""
        message = f"plugin {name!r} failed in {hook} on {who}{more}: {first.error}"
        if first.traceback:
            message += f"\n\nremote traceback:\n{first.traceback}"
        raise PluginError(message, results)
    return results
