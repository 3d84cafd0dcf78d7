"""What a client can learn of the cluster: the summary the scheduler pushes, the paged
worker list, per-prefix counters, waiting for workers, and retiring them. A mixin of
:class:`~shoal.client.client.Client`, whose connection and loop it uses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.comm.connection import Connection
from shoal.protocol import messages as m

T = TypeVar("T")


class ClusterInfo:
    asynchronous: bool
    timeout: float
    _conn: Connection | None
    _subscribed: bool
    _summary: m.ClusterState | None
    _summary_changed: asyncio.Future[None] | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    async def _info(self, start: int = 0, limit: int = -1) -> m.InfoReply:
        assert self._conn is not None
        reply, _ = await self._conn.request(
            lambda rid: m.InfoRequest(rid, start, limit), timeout=self.timeout
        )
        assert isinstance(reply, m.InfoReply)
        if reply.summary is not None:
            self._set_summary(reply.summary)
        return reply

    def _set_summary(self, summary: m.ClusterState) -> None:
        if self._summary is None or summary.version >= self._summary.version:
            self._summary = summary
        changed, self._summary_changed = self._summary_changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def _next_summary(self, timeout: float | None) -> None:
        """Wait for the next summary the scheduler pushes (or until ``timeout``)."""
        if self._summary_changed is None or self._summary_changed.done():
            self._summary_changed = asyncio.get_running_loop().create_future()
        waiter = self._summary_changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), timeout)

    def cluster_summary(self) -> dict[str, Any]:
        """The latest summary the scheduler pushed (workers, threads, memory, tasks per
        state, per-prefix counters); no request is made."""
        s = self._summary
        if s is None:
            return {}
        return {
            "version": s.version,
            "workers": s.workers,
            "nthreads": s.nthreads,
            "memory_limit": s.memory_limit,
            "nbytes": s.nbytes,
            "paused": s.paused,
            "tasks": dict(s.tasks),
            "prefixes": {
                p.name: {
                    "states": dict(p.states),
                    "nbytes": p.nbytes,
                    "duration_sum": p.duration_sum,
                    "duration_count": p.duration_count,
                }
                for p in s.prefixes
            },
        }

    def task_prefixes(self) -> Any:
        """Counters per task prefix (e.g. every ``inc``): tasks per state, bytes held,
        durations measured. The scheduler keeps them as tasks move, so asking costs
        the same however many tasks or groups there are."""

        async def prefixes() -> dict[str, Any]:
            await self._info(0, 0)
            return dict(self.cluster_summary().get("prefixes", {}))

        return prefixes() if self.asynchronous else self._sync(prefixes())

    def scheduler_info(self, n_workers: int = -1, start: int = 0) -> Any:
        """The scheduler's identity, its summary and its workers: all of them by
        default, or ``n_workers`` from ``start`` (in the order they joined)."""

        async def info() -> dict[str, Any]:
            r = await self._info(start, n_workers)
            return {
                "id": r.scheduler_id,
                "address": r.address,
                "tasks": r.tasks,
                "workers": {
                    w.address: {
                        "name": w.name,
                        "host": w.host,
                        "nthreads": w.nthreads,
                        "memory_limit": w.memory_limit,
                        "processing": w.processing,
                        "nbytes": w.nbytes,
                        "tasks_run": w.tasks_run,
                        "resources": w.resources,
                        "pid": w.pid,
                        "status": w.status,
                        "memory": w.memory,
                    }
                    for w in r.workers
                },
                "n_workers": r.summary.workers if r.summary is not None else len(r.workers),
                "summary": self.cluster_summary(),
            }

        return info() if self.asynchronous else self._sync(info())

    def retire_workers(self, workers: list[str], close_workers: bool = True) -> Any:
        """Retire ``workers`` (addresses or names) gracefully: what only they hold is
        copied to other workers first, and what they run finishes; nothing counts as a
        failure. Returns ``{"retired": [addresses], "refused": {worker: why}}``; a
        worker is refused, and keeps working, when no other worker can take its data."""

        async def retire() -> dict[str, Any]:
            conn = self._conn
            if conn is None or conn.closed:
                raise RuntimeError("the client is closed")
            reply, _ = await conn.request(
                lambda rid: m.RetireWorkers(rid, list(workers), close_workers)
            )
            assert isinstance(reply, m.RetireReply)
            return {"retired": list(reply.retired), "refused": dict(reply.refused)}

        return retire() if self.asynchronous else self._sync(retire())

    def wait_for_workers(self, n_workers: int, timeout: float | None = None) -> Any:
        """Wait until ``n_workers`` are connected. A subscribed client waits for the
        summaries the scheduler pushes; one inside a task asks now and then."""

        async def waiting() -> None:
            async with asyncio.timeout(timeout):
                await self._info(0, 0)  # fresh: a pushed summary may be an interval old
                while self._summary is None or self._summary.workers < n_workers:
                    if self._subscribed:
                        await self._next_summary(1.0)
                    else:
                        await asyncio.sleep(0.1)
                        await self._info(0, 0)

        return waiting() if self.asynchronous else self._sync(waiting())
