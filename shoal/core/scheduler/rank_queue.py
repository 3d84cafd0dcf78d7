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

Yet the pushes of a graph in parts are neither: each part ranks after the one before,
and its roots are queued as the recommendations reach them, part by part from the
end, so nearly every push of the 1M graph fell inside the run's range (97% of its
roots went to the heap). Such pushes are only collected (``_unsorted``); the next pop
or peek settles them: many at once are sorted (by rank, in C) together with the run
into a new run, O(n) for a batch of pushes that all land before any pop; a few, fewer
than 1/:data:`MERGE_SHARE` of the run, go to the heap as before, so that pushes
trickling in between pops never copy the run.

Stale entries (tasks no longer queued) are left in place and skipped by the caller,
as before.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.core.scheduler.model import TaskState

MERGE_SHARE = 16  # pushes below 1/MERGE_SHARE of the run go to the heap, not a merge
_rank = attrgetter("rank")


class RankQueue:
    """Tasks by rank, smallest first: an in-order run plus a heap for the rest."""

    __slots__ = ("_run", "_heap", "_unsorted")

    def __init__(self) -> None:
        self._run: deque[TaskState] = deque()  # ranks increasing
        self._heap: list[TaskState] = []  # the out-of-order pushes, a heap by rank
        self._unsorted: list[TaskState] = []  # pushes inside the run's range, not settled

    def push(self, ts: TaskState) -> None:
        run = self._run
        if not run or run[-1].rank < ts.rank:
            run.append(ts)
        elif ts.rank < run[0].rank:
            run.appendleft(ts)
        else:
            self._unsorted.append(ts)

    def _settle(self) -> None:
        """Put the collected pushes in order: merged into the run if they are many, else
        into the heap."""
        pushed, self._unsorted = self._unsorted, []
        if len(pushed) * MERGE_SHARE < len(self._run):
            heap = self._heap
            for ts in pushed:
                heapq.heappush(heap, ts)
            return
        pushed.extend(self._run)  # two sorted runs at most after the sort's first pass
        self._run.clear()  # (its entries are in ``pushed``: not held twice as a deque)
        pushed.sort(key=_rank)  # stable: a task pushed twice keeps both entries
        self._run = deque(pushed)

    def pop(self) -> TaskState:
        """The entry of the smallest rank (IndexError if empty)."""
        if self._unsorted:
            self._settle()
        heap, run = self._heap, self._run
        if heap and (not run or heap[0].rank < run[0].rank):
            return heapq.heappop(heap)
        return run.popleft()

    def peek(self) -> TaskState:
        """The entry ``pop`` would return, left in place (IndexError if empty)."""
        if self._unsorted:
            self._settle()
        heap, run = self._heap, self._run
        if heap and (not run or heap[0].rank < run[0].rank):
            return heap[0]
        return run[0]

    def clear(self) -> None:
        self._run.clear()
        self._heap.clear()
        self._unsorted.clear()

    def __len__(self) -> int:
        return len(self._run) + len(self._heap) + len(self._unsorted)

    def __bool__(self) -> bool:
        return bool(self._run) or bool(self._heap) or bool(self._unsorted)

    def __iter__(self) -> Iterator[TaskState]:
        """Every entry (stale ones too), in no particular order."""
        yield from self._run
        yield from self._heap
        yield from self._unsorted
