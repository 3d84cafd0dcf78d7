"""What a client can learn of the cluster: the summary the scheduler pushes, the paged
worker list, per-prefix and per-group counters, progress watches, waiting for workers,
and retiring them. A mixin of
:class:`~shoal.client.client.Client`, whose connection and loop it uses."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from shoal.comm.connection import Connection
from shoal.protocol import messages as m

T = TypeVar("T")


class ClusterInfo:
    asynchronous: bool
    timeout: float
    _conn: Connection | None
    _subscribed: bool
    _summary: m.ClusterState | None  # the newest we know, pushed or asked for
    _chain: m.ClusterState | None  # the last pushed, which the next delta builds on
    _summary_changed: asyncio.Future[None] | None
    _watchers: dict[int, Callable[[m.ProgressCounts | None], None]]
    _watch_ids: itertools.count[int]

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        def _send(self, msg: m.Message) -> None: ...

    async def _info(self, start: int = 0, limit: int = -1) -> m.InfoReply:
        assert self._conn is not None
        reply, _ = await self._conn.request(
            lambda rid: m.InfoRequest(rid, start, limit), timeout=self.timeout
        )
        assert isinstance(reply, m.InfoReply)
        if reply.summary is not None:
            self._set_summary(reply.summary)
        return reply

    def _pushed_summary(self, msg: m.ClusterState) -> None:
        """A summary the scheduler pushed: a full one when we subscribed, then deltas,
        each built on the one before."""
        if msg.base >= 0:
            chain = self._chain
            if chain is None or chain.version != msg.base:
                return  # not built on what we have (cannot happen on one connection)
            prefixes = {p.name: p for p in chain.prefixes}
            for name in msg.removed:
                prefixes.pop(name, None)
            prefixes.update((p.name, p) for p in msg.prefixes)
            msg = msgspec.structs.replace(
                msg, prefixes=list(prefixes.values()), base=-1, removed=[]
            )
        self._chain = msg
        self._set_summary(msg)

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
            "prefixes": {p.name: _counters(p) for p in s.prefixes},
        }

    def task_prefixes(self) -> Any:
        """Counters per task prefix (e.g. every ``inc``): tasks per state, bytes held,
        durations measured. The scheduler keeps them as tasks move, so asking costs
        the same however many tasks or groups there are."""

        async def prefixes() -> dict[str, Any]:
            await self._info(0, 0)
            return dict(self.cluster_summary().get("prefixes", {}))

        return prefixes() if self.asynchronous else self._sync(prefixes())

    def task_groups(self, prefix: str | None = None, limit: int = 100) -> Any:
        """Counters of the newest ``limit`` task groups (one per ``client.map`` call or
        dask layer), of one ``prefix`` if given, newest first: tasks per state, bytes
        held, durations measured. The answer costs O(limit) however many groups exist."""

        async def groups() -> dict[str, Any]:
            assert self._conn is not None
            reply, _ = await self._conn.request(
                lambda rid: m.GroupsRequest(rid, prefix or "", limit), timeout=self.timeout
            )
            assert isinstance(reply, m.GroupsReply)
            return {g.name: _counters(g) for g in reply.groups}

        return groups() if self.asynchronous else self._sync(groups())

    def _watch_progress(
        self, keys: list[Any], on_counts: Callable[[m.ProgressCounts | None], None]
    ) -> int:
        """Have the scheduler count, per prefix, the tasks ``keys`` need; ``on_counts``
        is called on the client's loop with each :class:`ProgressCounts` it pushes
        (the last one ``finished``), or with None if the scheduler is lost."""
        watch_id = next(self._watch_ids)
        self._watchers[watch_id] = on_counts
        self._send(m.WatchProgress(watch_id, keys, f"progress-{watch_id}"))
        return watch_id

    def _unwatch_progress(self, watch_id: int) -> None:
        conn = self._conn
        if self._watchers.pop(watch_id, None) is not None and conn is not None and not conn.closed:
            self._send(m.StopProgress(watch_id, f"progress-{watch_id}-stop"))

    def _progress_counts(self, msg: m.ProgressCounts) -> None:
        on_counts = self._watchers.get(msg.watch_id)
        if on_counts is not None:
            if msg.finished:
                del self._watchers[msg.watch_id]
            on_counts(msg)

    def _progress_lost(self) -> None:
        watchers, self._watchers = self._watchers, {}
        for on_counts in watchers.values():
            on_counts(None)

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
                        "pins": [
                            {"id": p.id, "reason": p.reason, "owner": p.owner, "expires": p.expires}
                            for p in w.pins
                        ],
                        "lifetime_left": w.lifetime_left,  # seconds; None: no --lifetime
                        "tasks_left": w.tasks_left,  # None: no --max-tasks
                        "http_address": w.http_address,  # its /metrics port; "": none
                        "transferred_in": w.transferred_in,  # dependency bytes, in all
                        "transferred_out": w.transferred_out,
                    }
                    for w in r.workers
                },
                "n_workers": r.summary.workers if r.summary is not None else len(r.workers),
                "summary": self.cluster_summary(),
            }

        return info() if self.asynchronous else self._sync(info())

    def retire_workers(
        self, workers: list[str], close_workers: bool = True, ignore_pins: bool = False
    ) -> Any:
        """Retire ``workers`` (addresses or names) gracefully: what only they hold is
        copied to other workers first, and what they run finishes; nothing counts as a
        failure. Returns ``{"retired": [addresses], "refused": {worker: why}}``; a
        worker is refused, and keeps working, when no other worker can take its data,
        or when a pin holds it (the pin's reason and owner say which), unless
        ``ignore_pins`` (then it leaves its pins)."""

        async def retire() -> dict[str, Any]:
            conn = self._conn
            if conn is None or conn.closed:
                raise RuntimeError("the client is closed")
            reply, _ = await conn.request(
                lambda rid: m.RetireWorkers(rid, list(workers), close_workers, ignore_pins)
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


def _counters(c: m.PrefixCounts) -> dict[str, Any]:
    return {
        "states": dict(c.states),
        "nbytes": c.nbytes,
        "duration_sum": c.duration_sum,
        "duration_count": c.duration_count,
    }
