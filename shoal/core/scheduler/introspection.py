"""Read-only queries of :class:`~shoal.core.scheduler.SchedulerState` (a mixin, like
placement): the cluster summary, pages of workers and task groups, who holds what.

Every answer is built from counters the scheduler keeps as events happen, so what a
query costs depends on what it returns, never on how many tasks or groups exist.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.model import Counters, TaskGroup, TaskPrefix, TaskState, WorkerRecord
from shoal.core.story import StoryLog
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

if TYPE_CHECKING:
    from shoal.core.scheduler.pins import PinRecord


def counts_of(c: Counters) -> m.PrefixCounts:
    return m.PrefixCounts(
        c.name,
        {state: n for state, n in c.states.items() if n and state != "forgotten"},
        c.nbytes,
        c.duration_sum,
        c.duration_count,
    )


class Introspection:
    """Query methods of :class:`~shoal.core.scheduler.SchedulerState`."""

    tasks: dict[Key, TaskState]
    groups: dict[str, TaskGroup]
    prefixes: dict[str, TaskPrefix]
    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]
    task_counts: dict[str, int]
    version: int
    total_threads: int
    total_memory: int
    total_nbytes: int
    log: StoryLog
    wall_time: float

    if TYPE_CHECKING:

        def pins_of(self, address: str) -> list[PinRecord]: ...
        def _find_worker(self, name: str) -> WorkerRecord | None: ...

    def who_has(self, keys: Iterable[Key]) -> list[tuple[Key, list[str]]]:
        out = []
        for key in keys:
            ts = self.tasks.get(key)
            out.append((key, [ws.address for ws in ts.who_has] if ts is not None else []))
        return out

    def has_what_page(self, worker: str, start: int, limit: int) -> m.HasWhatReply:
        """A page of the keys in memory on ``worker`` (name or address), every
        client's, read from its live set: O(start + limit), never the whole set copied."""
        ws = self._find_worker(worker)
        if ws is None:
            return m.HasWhatReply(0, "", [], 0)
        start = max(0, start)
        page = itertools.islice(ws.has_what, start, start + max(0, limit))
        return m.HasWhatReply(0, ws.address, [ts.key for ts in page], len(ws.has_what))

    def worker_infos(self, start: int = 0, limit: int = -1) -> list[m.WorkerInfo]:
        """A page of the workers, in the order they joined (all of them by default).
        Every field is a value the record keeps (its host was parsed when it joined)."""
        stop = None if limit < 0 else start + limit
        return [
            self._worker_info(ws)
            for ws in itertools.islice(self.workers.values(), max(0, start), stop)
        ]

    def worker_info(self, address: str) -> m.WorkerInfo | None:
        ws = self.workers.get(address)
        return None if ws is None else self._worker_info(ws)

    def _worker_info(self, ws: WorkerRecord) -> m.WorkerInfo:
        return m.WorkerInfo(
            ws.address,
            ws.name,
            ws.host,
            ws.nthreads,
            ws.memory_limit,
            len(ws.processing),
            ws.nbytes,
            ws.tasks_run,
            ws.resources,
            ws.pid,
            ws.status,
            ws.memory,
            [m.PinInfo(p.id, p.reason, p.owner, p.expires) for p in self.pins_of(ws.address)]
            if ws.pins
            else [],
            None if ws.deadline is None else max(0.0, ws.deadline - self.wall_time),
            None if ws.budget is None else max(0, ws.budget - ws.assigned),
            http_address=ws.http_address,
            transferred_in=ws.transferred_in,
            transferred_out=ws.transferred_out,
            spilled=ws.spilled,
            cpu=ws.cpu,
            net_in=ws.net_in,
            net_out=ws.net_out,
            memory_pause=ws.memory_pause,
            memory_terminate=ws.memory_terminate,
        )

    def story(self, *keys: Key) -> list[tuple[Any, ...]]:
        return self.log.story(*keys)

    def summary(self) -> m.ClusterState:
        """The cluster in numbers: O(prefixes), never O(tasks), O(groups) or O(workers)."""
        return m.ClusterState(
            self.version,
            len(self.workers),
            self.total_threads,
            self.total_memory,
            self.total_nbytes,
            len(self.workers) - len(self.runnable),
            {state: n for state, n in self.task_counts.items() if n and state != "forgotten"},
            [counts_of(tp) for tp in self.prefixes.values() if tp.alive],
        )

    def task_groups(
        self, prefix: str = "", limit: int = 100, start: int = 0
    ) -> tuple[list[m.PrefixCounts], int]:
        """The newest ``limit`` groups alive (of ``prefix``, if given), newest first,
        skipping the ``start`` newest, and how many are alive: O(start + limit),
        whatever the number of groups."""
        if prefix:
            tp = self.prefixes.get(prefix)
            source = tp.groups if tp is not None else {}
        else:
            source = self.groups
        start = max(0, start)
        newest = itertools.islice(reversed(source.values()), start, start + max(0, limit))
        return [counts_of(tg) for tg in newest], len(source)
