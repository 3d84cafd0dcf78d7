"""``cluster.scheduler`` of a process-based :class:`~shoal.deploy.local.LocalCluster`:
a read-only view of the scheduler (which runs in its own process) offering what Dask
users reach for on Dask's ``Scheduler`` object, e.g. Dask's resilience notebook::

    pids = [w.pid for w in cluster.scheduler.workers.values()]

Offered: ``address``, ``id``, ``workers`` (address -> :class:`WorkerView` with
``address``, ``name``, ``host``, ``pid``, ``nthreads``, ``memory_limit``, ``status``,
``nbytes``, ``resources``, ``processing``), ``total_nthreads`` and ``n_workers``. Each
read of ``workers`` asks the scheduler for its current workers (one InfoRequest); the
objects are snapshots, changing them changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.protocol import messages as m
from shoal.server.worker_views import WorkerView, worker_views

__all__ = ["SchedulerView", "WorkerView"]


class SchedulerView:
    """Read-only: see the module docstring. ``ask`` returns a fresh ``InfoReply``."""

    def __init__(self, ask: Callable[[], m.InfoReply]):
        self._ask = ask

    @property
    def address(self) -> str:
        return self._ask().address

    @property
    def id(self) -> str:
        return self._ask().scheduler_id

    @property
    def workers(self) -> dict[str, WorkerView]:
        return worker_views(self._ask().workers)

    @property
    def n_workers(self) -> int:
        return len(self._ask().workers)

    @property
    def total_nthreads(self) -> int:
        return sum(w.nthreads for w in self._ask().workers)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_ask":
            raise AttributeError(
                f"cluster.scheduler is a read-only view of a scheduler in another process: "
                f"cannot set {name!r}"
            )
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        reply = self._ask()
        return f"<Scheduler view {reply.address!r} workers={len(reply.workers)}>"
