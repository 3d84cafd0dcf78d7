"""The task stream: the last executions that finished, as the scheduler heard of them.

Dask's dashboard, its ``get_task_stream`` and its performance report all draw the same
picture: one bar per execution (worker, start, stop, coloured by prefix). The scheduler
already receives each execution's start and stop in ``TaskFinished``/``TaskErred``; this
keeps the last ``capacity`` of them in a ring, numbered, so that any number of readers
(dashboard pushes, ``get_task_stream``, a performance report) take what is new since
their cursor without scanning tasks, and an idle scheduler keeps nothing growing.
"""

from __future__ import annotations

from collections import deque

from shoal.protocol.messages import TaskStreamRecord

DEFAULT_TASK_STREAM_CAPACITY = 100_000  # ~15 MB at most; Dask keeps 100,000 too


class TaskStream:
    __slots__ = ("records", "count")

    def __init__(self, capacity: int = DEFAULT_TASK_STREAM_CAPACITY):
        if capacity < 1:
            raise ValueError(f"task stream capacity must be at least 1, got {capacity}")
        self.records: deque[TaskStreamRecord] = deque(maxlen=capacity)
        self.count = 0  # records ever added: the cursor after the newest

    def add(self, record: TaskStreamRecord) -> None:
        self.records.append(record)
        self.count += 1

    def since(self, cursor: int, limit: int | None = None) -> tuple[int, list[TaskStreamRecord]]:
        """The records added after ``cursor`` (those still kept, oldest first; at most
        ``limit``, the newest of them) and the cursor to ask from next time. A cursor
        from the future (another scheduler's) is treated as 0."""
        if cursor < 0 or cursor > self.count:
            cursor = 0
        new = min(self.count - cursor, len(self.records))
        if limit is not None:
            new = min(new, max(limit, 0))
        if new == 0:
            return self.count, []
        n = len(self.records)
        return self.count, [self.records[i] for i in range(n - new, n)]
