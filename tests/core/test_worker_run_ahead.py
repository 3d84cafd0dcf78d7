"""Run-ahead: tasks of a few milliseconds are handed to the threads one ahead of the one
each runs, so a thread goes on to the next without waiting for the event loop. Driven
with events only (``validate=True``: every invariant checked after each batch)."""

from __future__ import annotations

from typing import Any

from test_worker_resources import needs
from test_worker_secede import executed, rejoin, resumed, secede
from test_worker_state import compute, make, run, states

from shoal.core.worker.state import (
    MAX_PIPELINE,
    PIPELINE_WINDOW,
    RUN_AHEAD_WINDOW,
    ExecuteSuccess,
    Pause,
    SendMessage,
    Unpause,
    WorkerState,
)
from shoal.protocol.messages import ComputeTask, FreeKeys, Key, TaskFinished

SHORT = 0.01  # between the pipelining window and the run-ahead window
assert PIPELINE_WINDOW < SHORT < RUN_AHEAD_WINDOW


def took(key: Key, seconds: float = SHORT, value: Any = 1) -> ExecuteSuccess:
    return ExecuteSuccess(key, value, 8, None, "int", 10.0, 10.0 + seconds, f"done-{key}")


def measured(nthreads: int, seconds: float = SHORT, **kwargs: Any) -> WorkerState:
    """A worker that has run one task of ``seconds``."""
    ws = make(nthreads, **kwargs)
    run(ws, compute("warm"), took("warm", seconds))
    return ws


def reported(out: list[Any]) -> list[Key]:
    return [i.msg.key for i in out if isinstance(i, SendMessage) and type(i.msg) is TaskFinished]


def test_short_tasks_run_one_ahead_per_thread_in_priority_order():
    ws = measured(2)
    out = run(ws, *[compute(f"k{i}", prio=(i,)) for i in range(7)])
    assert executed(out) == ["k0", "k1", "k2", "k3"]  # two per thread
    assert ws.executing_count == 4 and ws.ready_count == 3
    # when a task ends, its thread already has the next: the state machine hands it one
    # more in the same step
    out = ws.handle(took("k0"))
    assert reported(out) == ["k0"] and executed(out) == ["k4"]
    assert executed(ws.handle(took("k1"), took("k2"))) == ["k5", "k6"]
    assert ws.executing_count == 4 and ws.ready_count == 0


def test_long_tasks_and_unmeasured_ones_get_one_per_thread():
    ws = make(2)
    assert executed(run(ws, *[compute(f"k{i}", prio=(i,)) for i in range(5)])) == ["k0", "k1"]
    assert ws.execution_limit == 2  # nothing has ended yet: durations unknown
    assert executed(ws.handle(took("k0", RUN_AHEAD_WINDOW * 2))) == ["k2"]
    assert ws.executing_count == 2


def test_the_first_duration_is_taken_as_it_is():
    """One task of 0.1 s is long: no run-ahead (a moving average started at the
    pipelining window would still call it short)."""
    ws = measured(1, 0.1)
    assert ws.execution_limit == 1
    assert executed(run(ws, compute("a"), compute("b"))) == ["a"]


def test_a_task_run_ahead_and_freed_is_cancelled_and_its_result_dropped():
    ws = measured(1)
    assert executed(run(ws, compute("a", prio=(0,)), compute("b", prio=(1,)))) == ["a", "b"]
    assert executed(ws.handle(FreeKeys(["b"], "free"))) == []  # b's thread may have it
    assert states(ws)["b"] == "cancelled" and ws.executing_count == 2
    run(ws, compute("c", prio=(2,)))
    out = ws.handle(took("b", value=99))  # it ran anyway: dropped, unreported
    assert reported(out) == [] and "b" not in ws.tasks and "b" not in ws.data
    assert executed(out) == ["c"]
    assert reported(ws.handle(took("a"))) == ["a"]


def test_a_rejoining_task_waits_for_a_thread_not_a_place_in_the_queue():
    ws = measured(1)
    run(ws, compute("parent", prio=(0,)), secede("parent"))
    assert executed(run(ws, compute("a", prio=(1,)), compute("b", prio=(2,)))) == ["a", "b"]
    assert resumed(ws.handle(rejoin("parent"))) == []
    assert executed(ws.handle(compute("c", prio=(3,)))) == []  # the rejoin goes first
    # a ends; its thread goes on to b: still no free thread for parent
    out = ws.handle(took("a"))
    assert resumed(out) == [] and executed(out) == []
    out = ws.handle(took("b"))
    assert resumed(out) == ["parent"] and executed(out) == []
    assert executed(ws.handle(took("parent"))) == ["c"]


def test_a_paused_worker_hands_out_nothing_more_and_refills_on_unpause():
    ws = measured(1)
    assert executed(run(ws, compute("a", prio=(0,)), Pause("p"), compute("b", prio=(1,)))) == ["a"]
    assert executed(ws.handle(took("a"))) == []
    out = ws.handle(Unpause("u"), compute("c", prio=(2,)))
    assert executed(out) == ["b", "c"]  # both threads' places: the one running and one ahead


def test_tasks_run_ahead_never_hold_more_resources_than_there_are():
    ws = measured(2, resources={"GPU": 1})
    events: list[ComputeTask] = [needs(f"g{i}", i, GPU=1) for i in range(4)]
    out = run(ws, *events)
    assert executed(out) == ["g0"]  # limit 4, but one GPU
    assert executed(ws.handle(took("g0"))) == ["g1"]
    assert ws.available_resources == {"GPU": 0.0}


def test_tiny_tasks_queue_about_the_pipelining_window_per_thread():
    """Tasks of tens of microseconds: each thread gets about PIPELINE_WINDOW's worth
    queued behind the one it runs (fewer hand-offs and wake-ups per task), never more."""
    tiny = 50e-6
    ws = measured(2, tiny)
    out = run(ws, *[compute(f"k{i}", prio=(i,)) for i in range(400)])
    per_thread = int(PIPELINE_WINDOW / tiny)  # 40 queued behind each running task
    assert per_thread <= MAX_PIPELINE
    assert executed(out) == [f"k{i}" for i in range(2 * (1 + per_thread))]
    # the queued work stays within the window whatever the tasks' size
    ws = measured(1, 1e-7)
    out = run(ws, *[compute(f"k{i}", prio=(i,)) for i in range(400)])
    assert len(executed(out)) == 1 + MAX_PIPELINE
    assert MAX_PIPELINE * 1e-7 <= PIPELINE_WINDOW
