"""The worker state machine with resources: a task that needs them waits until they are
free, holds them until its thread ends, and never blocks tasks that need none.

Every worker runs with ``validate=True``: after each batch it checks that the resources
free are its totals less what its running threads hold, and that no thread idles while
a task could start. The property test in ``test_worker_state.py`` draws GPU tasks too.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_worker_state import ARGS, ME, fail, ok, run, states

from shoal.core.story import InvalidState
from shoal.core.worker.state import Execute, ExecuteSuccess, WorkerState
from shoal.protocol.messages import ComputeTask, FreeKeys, Key


def make(nthreads: int, **resources: float) -> WorkerState:
    return WorkerState(nthreads, ME, validate=True, resources=resources)


def needs(key: Key, prio: int = 0, **resources: float) -> ComputeTask:
    return ComputeTask(key, "func", ARGS, (prio,), [], f"compute-{key}", resources)


def executed(out: list[Any]) -> list[Key]:
    return [inst.key for inst in out if isinstance(inst, Execute)]


def test_tasks_needing_a_resource_run_no_more_at_once_than_there_is():
    ws = make(4, GPU=2)
    out = run(ws, *[needs(f"g{i}", i, GPU=1) for i in range(4)])
    assert executed(out) == ["g0", "g1"]  # two GPUs, although four threads
    assert states(ws) == {"g0": "executing", "g1": "executing", "g2": "ready", "g3": "ready"}
    assert ws.available_resources == {"GPU": 0.0}
    assert executed(ws.handle(ok("g1"))) == ["g2"]
    assert executed(ws.handle(fail("g0"))) == ["g3"]  # a failure frees them too
    run(ws, ok("g2"), ok("g3"))
    assert ws.available_resources == {"GPU": 2.0} and ws.executing_count == 0


def test_unconstrained_tasks_run_while_a_better_one_waits_for_resources():
    ws = make(2, GPU=1)
    assert executed(run(ws, needs("g0", 0, GPU=1))) == ["g0"]
    # "g1" comes first by priority, but the GPU is taken: "plain" uses the free thread
    out = ws.handle(needs("g1", 0, GPU=1), ComputeTask("plain", "func", ARGS, (5,)))
    assert executed(out) == ["plain"]
    assert executed(ws.handle(ok("g0"))) == ["g1"]


def test_a_freed_running_task_holds_its_resources_until_its_thread_ends():
    ws = make(2, GPU=1)
    run(ws, needs("g0", GPU=1))
    ws.handle(FreeKeys(["g0"], "free"))
    assert states(ws) == {"g0": "cancelled"}
    # the scheduler counts the GPU free at once and sends the next GPU task: it waits
    assert executed(ws.handle(needs("g1", GPU=1))) == []
    assert ws.available_resources == {"GPU": 0.0}
    assert executed(ws.handle(ok("g0"))) == ["g1"]
    assert "g0" not in ws.tasks


def test_a_waiting_resource_task_that_is_freed_takes_nothing_with_it():
    ws = make(2, GPU=1)
    run(ws, needs("g0", GPU=1), needs("g1", GPU=1))
    ws.handle(FreeKeys(["g1"], "free"))
    assert states(ws) == {"g0": "executing"}
    run(ws, ok("g0"))
    assert ws.available_resources == {"GPU": 1.0}
    assert ws.ready_count == 0


def test_fractional_amounts_and_several_resources():
    ws = make(8, GPU=1, MEM=100)
    out = run(
        ws,
        needs("a", 0, GPU=0.5, MEM=50),
        needs("b", 1, GPU=0.5, MEM=60),  # MEM would run out: waits, and so does "c" behind it
        needs("c", 2, GPU=0.5),
    )
    assert executed(out) == ["a"]
    assert executed(ws.handle(ok("a"))) == ["b", "c"]
    assert ws.available_resources == {"GPU": 0.0, "MEM": 40.0}


def test_pipelined_short_tasks_never_exceed_the_resources():
    """Short tasks are queued several deep on each thread; resource-bound ones are not."""
    ws = make(1, GPU=1)
    run(ws, *[needs(f"g{i:02}", i, GPU=1) for i in range(20)])
    run(ws, *[ComputeTask(f"p{i:02}", "func", ARGS, (i,)) for i in range(20)])
    running = {k for k, ts in ws.tasks.items() if ts.state == "executing"}
    for _ in range(60):
        if not running:
            break
        key = min(running)
        running.discard(key)
        out = ws.handle(ExecuteSuccess(key, 1, 8, None, "int", 0.0, 1e-5, f"done-{key}"))
        running |= set(executed(out))
        assert len([k for k in running if k.startswith("g")]) <= 1
    assert ws.execution_limit > 1  # the plain tasks were pipelined meanwhile
    assert not running and all(ts.state == "memory" for ts in ws.tasks.values())


def test_a_task_needing_a_resource_this_worker_lacks_never_starts():
    ws = make(1)
    assert executed(run(ws, needs("t", GPU=1))) == []
    assert states(ws) == {"t": "ready"}


def test_validate_state_catches_a_corrupted_resource_count():
    ws = make(2, GPU=1)
    run(ws, needs("g0", GPU=1), needs("g1", GPU=1))
    ws.validate_state()
    ws.available_resources["GPU"] += 1  # as if "g0" held nothing: "g1" could start
    with pytest.raises(InvalidState, match="GPU in use"):
        ws.validate_state()
