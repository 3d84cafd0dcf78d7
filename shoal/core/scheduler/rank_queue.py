"""The root-task queue: queued tasks in rank order, popped smallest rank first.

A graph's root tasks are queued in rank order or in its reverse (a submission starts
its tasks by popping recommendations, last first; a later submission ranks after an
earlier one), so almost every push lands after the last entry or before the first.
Those go to a deque, a run kept sorted: a push and a pop cost O(1) with no comparison
of tasks. A push that falls inside the run's range (a higher user priority, a task
queued again after its worker left) goes to a heap ordered by ``TaskState.__lt__``; a
pop takes the smaller of the two heads. The
order is the one a single heap gives; the memory is the same, one pointer per entry
(``(rank, task)`` tuples in a heap would cost 56 bytes more per queued task, and a heap
of tasks ~20 Python ``__lt__`` calls per pop at 750k queued roots).

Stale entries (tasks no longer queued) are left in place and skipped by the caller,
as before.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.core.scheduler.model import TaskState


class RankQueue:
    """Tasks by rank, smallest first: an in-order run plus a heap for the rest."""

    __slots__ = ("_run", "_heap")

    def __init__(self) -> None:
        self._run: deque[TaskState] = deque()  # ranks strictly increasing
        self._heap: list[TaskState] = []  # the out-of-order pushes, a heap by rank

    def push(self, ts: TaskState) -> None:
        run = self._run
        if not run or run[-1].rank < ts.rank:
            run.append(ts)
        elif ts.rank < run[0].rank:
            run.appendleft(ts)
        else:
            heapq.heappush(self._heap, ts)

    def pop(self) -> TaskState:
        """The entry of the smallest rank (IndexError if empty)."""
        heap, run = self._heap, self._run
        if heap and (not run or heap[0].rank < run[0].rank):
            return heapq.heappop(heap)
        return run.popleft()

    def peek(self) -> TaskState:
        """The entry ``pop`` would return, left in place (IndexError if empty)."""
        heap, run = self._heap, self._run
        if heap and (not run or heap[0].rank < run[0].rank):
            return heap[0]
        return run[0]

    def clear(self) -> None:
        self._run.clear()
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._run) or bool(self._heap)

    def __iter__(self) -> Iterator[TaskState]:
        """Every entry (stale ones too), in no particular order."""
        yield from self._run
        yield from self._heap
