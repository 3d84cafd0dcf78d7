"""The plugin base classes, in the shapes of Dask's ``distributed.diagnostics.plugin``:
a Dask plugin ports by changing its import.

Subclass one, override the hooks you need, and register an instance with
``client.register_plugin(plugin)`` (or from a ``--preload`` module). Hooks left as
the base class has them are never called, so a plugin pays only for what it uses;
in particular ``transition`` hooks are fed only while a plugin has one.

A hook may be a coroutine function where Dask allows it (``start``, ``close``,
``add_worker``, ``remove_worker``, ``setup``, ``teardown``); ``transition`` and
``update_graph`` run synchronously, between two batches of the state machine. A hook
that raises is logged and recorded in the scheduler's event log under the topic
``"plugins"``; the process and its state machine go on.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

_F = TypeVar("_F")


def _noop(func: _F) -> _F:
    """Mark a base-class hook: a plugin that does not override it is not called."""
    func._shoal_noop = True  # type: ignore[attr-defined]
    return func


class SchedulerPlugin:
    """Runs in the scheduler process and sees what the scheduler does.

    ``scheduler`` is a read-only view (``address``, ``id``, ``tasks``, ``workers``,
    ``clients``, ``get_events``) that can also ``log_event(topic, msg)``. ``name``, if
    set, names the plugin (a registration under the same name replaces it, unless
    ``idempotent``: then it is kept and the new one ignored).
    """

    idempotent: bool = False

    @_noop
    async def start(self, scheduler: Any) -> None:
        """Run when the plugin is registered (the scheduler is running)."""

    @_noop
    async def before_close(self) -> None:
        """Run when the scheduler begins to close."""

    @_noop
    async def close(self) -> None:
        """Run when the scheduler closes, or when the plugin is unregistered."""

    @_noop
    def update_graph(
        self,
        scheduler: Any,
        *,
        client: str,
        keys: set[Any],
        tasks: list[Any],
        annotations: dict[str, Any],
        priority: dict[Any, Any],
        stimulus_id: str,
        **kwargs: Any,
    ) -> None:
        """Run after a client's graph (or a part of it) was added: ``tasks`` its keys,
        ``keys`` those the client holds futures for."""

    @_noop
    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Run for every task transition of the scheduler (``stimulus_id`` in kwargs),
        after the batch of events that caused it."""

    @_noop
    def add_worker(self, scheduler: Any, worker: str) -> None | Awaitable[None]:
        """Run when a worker joins (``worker`` is its address)."""

    @_noop
    def remove_worker(
        self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any
    ) -> None | Awaitable[None]:
        """Run when a worker has been removed."""

    @_noop
    def add_client(self, scheduler: Any, client: str) -> None:
        """Run when a client connects."""

    @_noop
    def remove_client(self, scheduler: Any, client: str) -> None:
        """Run when a client disconnects."""

    @_noop
    def log_event(self, topic: str, msg: Any) -> None:
        """Run when an event is logged through the scheduler view (by a plugin)."""


class WorkerPlugin:
    """Runs in every worker process: those running at registration and every one that
    joins later (the scheduler keeps the pickled plugin and sends it on).

    ``worker`` is a read-only view (``address``, ``name``, ``id``, ``nthreads``,
    ``memory_limit``, ``tasks``, ``data``) that can ``log_event(topic, msg)`` (to the
    scheduler's event log) and ``close_gracefully(reason, restart)``.
    """

    idempotent: bool = False

    @_noop
    def setup(self, worker: Any) -> None | Awaitable[None]:
        """Run when the plugin is registered on the worker, or the worker starts."""

    @_noop
    def teardown(self, worker: Any) -> None | Awaitable[None]:
        """Run when the plugin is unregistered, or the worker closes."""

    @_noop
    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """Run for every task transition on the worker (``stimulus_id`` in kwargs),
        after the batch of events that caused it."""


class NannyPlugin:
    """Runs in every nanny process (``shoal worker --nanny``, LocalCluster's workers),
    before its worker starts; ``restart = True``: registering it restarts the running
    workers, so that they start in what ``setup`` prepared (an environment variable, a
    file). ``nanny`` is a view (``name``, ``scheduler_address``, ``worker_address``,
    ``log_event``).
    """

    idempotent: bool = False
    restart: bool = False

    @_noop
    def setup(self, nanny: Any) -> None | Awaitable[None]:
        """Run when the plugin is registered, or the nanny starts."""

    @_noop
    def teardown(self, nanny: Any) -> None | Awaitable[None]:
        """Run when the plugin is unregistered, or the nanny stops."""


def plugin_kind(plugin: object) -> str:
    """ "scheduler", "worker" or "nanny"; TypeError for any other object (as Dask, no
    duck-typed plugins: which processes run it would be a guess)."""
    if isinstance(plugin, SchedulerPlugin):
        return "scheduler"
    if isinstance(plugin, WorkerPlugin):
        return "worker"
    if isinstance(plugin, NannyPlugin):
        return "nanny"
    raise TypeError(
        f"{plugin!r} is not a plugin: inherit from shoal.SchedulerPlugin, "
        "shoal.WorkerPlugin or shoal.NannyPlugin"
    )


def plugin_name(plugin: object) -> str:
    """The plugin's ``name`` attribute, or its class name and a random suffix (as Dask)."""
    import uuid

    name = getattr(plugin, "name", None)
    if name is not None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a plugin's name is a non-empty str, not {name!r}")
        return name
    return f"{type(plugin).__name__}-{uuid.uuid4()}"
