"""Secede and rejoin in the worker state machine: a task waiting on other tasks leaves
the thread count so that another task starts; it runs on, is reported as usual, keeps
its resources, and counts again once it rejoins and a slot is free."""

from __future__ import annotations

from typing import Any

import pytest
from test_worker_state import ARGS, ME, compute, fail, finished, make, ok, run, states

from shoal.core.story import InvalidTransition
from shoal.core.worker.state import Execute, Rejoin, ResumeThread, Secede, WorkerState
from shoal.protocol.messages import ComputeTask, FreeKeys, Key


def secede(key: Key) -> Secede:
    return Secede(key, f"secede-{key}")


def rejoin(key: Key) -> Rejoin:
    return Rejoin(key, f"rejoin-{key}")


def executed(out: list[Any]) -> list[Key]:
    return [inst.key for inst in out if isinstance(inst, Execute)]


def resumed(out: list[Any]) -> list[Key]:
    return [inst.key for inst in out if isinstance(inst, ResumeThread)]


def test_a_seceded_task_frees_its_slot_and_is_still_reported():
    ws = make(1)
    assert executed(run(ws, compute("parent"), compute("child", prio=(1,)))) == ["parent"]
    assert executed(ws.handle(secede("parent"))) == ["child"]  # the slot went to "child"
    assert ws.executing_count == 1 and ws.seceded_count == 1
    assert ws.handle(ok("child")) == [finished("child", "done-child")]
    # the seceded task ends without rejoining: reported like any other
    assert ws.handle(ok("parent")) == [finished("parent", "done-parent")]
    assert states(ws) == {"parent": "memory", "child": "memory"}
    assert ws.executing_count == ws.seceded_count == 0


def test_rejoin_waits_for_a_free_slot_and_goes_before_new_tasks():
    ws = make(1)
    run(ws, compute("parent"), secede("parent"))
    assert executed(ws.handle(compute("a", prio=(1,)))) == ["a"]
    assert resumed(ws.handle(rejoin("parent"))) == []  # "a" holds the only slot
    ws.handle(compute("b", prio=(-1,)))  # a better task waits too: rejoining comes first
    out = ws.handle(ok("a"))
    assert resumed(out) == ["parent"] and executed(out) == []
    assert ws.executing_count == 1 and ws.seceded_count == 0
    assert executed(ws.handle(ok("parent"))) == ["b"]


def test_rejoin_with_a_free_slot_resumes_at_once():
    ws = make(2)
    run(ws, compute("parent"), secede("parent"))
    assert resumed(ws.handle(rejoin("parent"))) == ["parent"]
    assert ws.executing_count == 1


def test_a_paused_worker_still_lets_a_rejoining_task_go_on():
    from shoal.core.worker.state import Pause

    ws = make(1)
    run(ws, compute("parent"), secede("parent"), Pause("pause"))
    assert resumed(ws.handle(rejoin("parent"))) == ["parent"]


def test_many_seceded_tasks_let_every_queued_task_run_on_one_thread():
    ws = make(1)
    out = run(ws, *[compute(f"p{i}", prio=(i,)) for i in range(5)])
    started = executed(out)
    for i in range(5):
        started += executed(ws.handle(secede(f"p{i}")))
    assert started == [f"p{i}" for i in range(5)]
    assert ws.executing_count == 0 and ws.seceded_count == 5
    for i in range(5):
        ws.handle(fail(f"p{i}") if i % 2 else ok(f"p{i}"))
    assert states(ws) == {f"p{i}": "error" if i % 2 else "memory" for i in range(5)}


def test_a_seceded_task_keeps_its_resources():
    ws = WorkerState(2, ME, validate=True, resources={"GPU": 1})
    gpu = [ComputeTask(f"g{i}", "func", ARGS, (i,), [], f"c-g{i}", {"GPU": 1}) for i in (0, 1)]
    assert executed(run(ws, *gpu)) == ["g0"]
    assert executed(ws.handle(secede("g0"))) == []  # its thread still uses the GPU
    assert ws.available_resources == {"GPU": 0.0}
    assert executed(ws.handle(ok("g0"))) == ["g1"]


def test_a_seceded_task_freed_meanwhile_is_cancelled_then_forgotten():
    ws = make(1)
    run(ws, compute("parent"), secede("parent"))
    ws.handle(FreeKeys(["parent"], "free"))
    assert states(ws) == {"parent": "cancelled"}
    ws.handle(rejoin("parent"))  # its thread still runs and may rejoin
    assert ws.handle(ok("parent")) == []  # the result is dropped
    assert states(ws) == {} and ws.executing_count == ws.seceded_count == 0


def test_a_freed_then_wanted_again_seceded_task_is_reported():
    ws = make(1)
    run(ws, compute("parent"), secede("parent"), FreeKeys(["parent"], "free"))
    ws.handle(compute("parent", sid="again"))
    assert states(ws) == {"parent": "executing"}
    assert ws.handle(ok("parent")) == [finished("parent", "done-parent")]


@pytest.mark.parametrize(
    "events",
    [
        [secede("x")],  # unknown
        [compute("x"), secede("x"), secede("x")],  # seceded twice
        [compute("x"), rejoin("x")],  # rejoin without secede
        [compute("a"), compute("x", prio=(1,)), secede("x")],  # x is only ready
    ],
)
def test_impossible_secede_or_rejoin_raises(events: list[Any]):
    ws = make(1)
    with pytest.raises(InvalidTransition):
        run(ws, *events)


def test_secede_tells_the_scheduler_unless_the_task_was_cancelled():
    from shoal.core.worker.state import SendMessage
    from shoal.protocol.messages import TaskSeceded

    ws = make(2)
    run(ws, compute("a"), compute("b"))
    out = ws.handle(secede("a"))
    assert out == [SendMessage(TaskSeceded("a", "secede-a"), "secede-a")]
    ws.handle(FreeKeys(["b"], "free"))
    assert ws.handle(secede("b")) == []  # cancelled: the scheduler has forgotten it


def test_secede_of_a_task_kept_only_for_a_local_dependent_tells_nobody():
    from test_worker_state import dep

    ws = make(1)
    run(ws, compute("a"), compute("b", dep("a", ME)), FreeKeys(["a"], "free-a"))
    assert states(ws) == {"a": "executing", "b": "waiting"}  # kept for "b", not wanted
    assert ws.handle(secede("a")) == []  # the scheduler no longer counts it on us
