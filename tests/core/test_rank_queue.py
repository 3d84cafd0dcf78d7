"""The root-task queue (core/scheduler/rank_queue.py) pops in the order one heap of
the same tasks would, whatever the order of pushes and pops."""

from __future__ import annotations

import heapq
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.core.scheduler.model import TaskGroup, TaskPrefix, TaskState
from shoal.core.scheduler.rank_queue import RankQueue


def _tasks(n: int) -> list[TaskState]:
    group = TaskGroup("t", TaskPrefix("t"))
    return [TaskState(f"t-{i}", "f", None, group, rank=i) for i in range(n)]


# An operation: push the task of that rank (the same task may be pushed again, as a
# task queued a second time is), or pop (None).
operations = st.lists(st.one_of(st.none(), st.integers(0, 30)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_pops_in_the_order_of_one_heap(ops: list[int | None]) -> None:
    tasks = _tasks(31)
    queue, heap = RankQueue(), []
    for op in ops:
        if op is None:
            if not heap:
                assert not queue and len(queue) == 0
                with pytest.raises(IndexError):
                    queue.pop()
                continue
            assert queue.peek().rank == heap[0].rank
            assert queue.pop().rank == heapq.heappop(heap).rank
        else:
            queue.push(tasks[op])
            heapq.heappush(heap, tasks[op])
        assert len(queue) == len(heap) and bool(queue) == bool(heap)
        assert sorted(t.rank for t in queue) == sorted(t.rank for t in heap)
    drained: list[Any] = []
    while queue:
        drained.append(queue.pop().rank)
    assert drained == sorted(t.rank for t in heap)


def test_pushes_in_order_or_reverse_order_stay_out_of_the_heap() -> None:
    tasks = _tasks(8)
    queue = RankQueue()
    for ts in tasks[4:6]:  # a graph's roots arrive in rank order...
        queue.push(ts)
    for ts in reversed(tasks[1:4]):  # ...or in reverse (recommendations popped)
        queue.push(ts)
    assert not queue._heap
    queue.push(tasks[7])
    queue.push(tasks[0])
    assert not queue._heap
    queue.push(tasks[6])  # inside the run's range: the heap
    assert len(queue._heap) == 1
    assert [queue.pop().key for _ in range(8)] == [f"t-{i}" for i in range(8)]
    queue.push(tasks[3])
    queue.clear()
    assert not queue and list(queue) == []
