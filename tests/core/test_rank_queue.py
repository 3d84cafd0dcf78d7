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
    queue.push(tasks[6])  # inside the run's range: settled at the next pop
    assert [queue.pop().key for _ in range(8)] == [f"t-{i}" for i in range(8)]
    queue.push(tasks[3])
    queue.clear()
    assert not queue and list(queue) == []


def test_a_graph_in_parts_is_merged_into_the_run_not_heaped() -> None:
    """The roots of a graph in parts: each part ranks after the one before, and its
    roots are pushed part by part from the last, each part's in reverse, so after the
    first part nearly every push falls inside the run's range. They are sorted into the
    run at the first pop, not pushed on the heap one by one."""
    tasks = _tasks(400)
    parts = [tasks[i : i + 100] for i in range(0, 400, 100)]
    queue = RankQueue()
    for part in reversed(parts):
        for ts in reversed(part[1::2]):
            queue.push(ts)
        for ts in part[::2]:  # the rest of the part, in rank order
            queue.push(ts)
    assert len(queue) == 400
    assert queue.peek() is tasks[0]
    assert not queue._heap
    assert [queue.pop() for _ in range(400)] == tasks
    assert not queue


def test_a_few_pushes_inside_the_run_go_to_the_heap() -> None:
    """A task queued again now and then does not copy a long run: it joins the heap."""
    tasks = _tasks(200)
    queue = RankQueue()
    for ts in tasks[::2]:
        queue.push(ts)
    queue.push(tasks[51])
    queue.push(tasks[51])  # queued twice (its first entry stale): popped twice too
    assert queue.pop() is tasks[0]
    assert len(queue._heap) == 2
    popped = [queue.pop() for _ in range(len(queue))]
    assert popped == sorted([*tasks[2::2], tasks[51], tasks[51]], key=lambda t: t.rank)
