"""Rows of the task stream: one per worker thread, as Dask draws it.

Each finished execution goes to the first row of its worker that is free at its
start (greedily, in the order they arrive), or a new row; a worker with n threads
needs about n rows. Computed once on the scheduler for every page, so that every
page draws the same picture. Executions may arrive a little out of order (workers
report when they finish): a row is free when its last bar stopped by this start.
"""

from __future__ import annotations

from collections.abc import Container

MAX_LANES = 256  # rows per worker at most (a worker with more threads shares rows)


class Lanes:
    __slots__ = ("_ends",)

    def __init__(self) -> None:
        self._ends: dict[str, list[float]] = {}  # worker -> stop time of each row's last bar

    def assign(self, worker: str, start: float, stop: float) -> int:
        ends = self._ends.get(worker)
        if ends is None:
            ends = self._ends[worker] = []
        for lane, end in enumerate(ends):
            if end <= start:
                ends[lane] = stop
                return lane
        if len(ends) < MAX_LANES:
            ends.append(stop)
            return len(ends) - 1
        lane = min(range(len(ends)), key=ends.__getitem__)  # the row free soonest
        ends[lane] = max(ends[lane], stop)
        return lane

    def forget(self, keep: Container[str]) -> None:
        """Drop the rows of workers not in ``keep`` (those gone)."""
        for worker in [w for w in self._ends if w not in keep]:
            del self._ends[worker]

    def __len__(self) -> int:
        return len(self._ends)
