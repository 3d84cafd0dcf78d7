"""Whether a worker takes a lane's run (shoal/core/worker/lanes.py), against a worker
state machine driven with events only: idle takes it; anything else to do, a pause, a
limit, a watcher or a run already under way declines it, saying why."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shoal.core.worker.lanes import lane_decline_reason
from shoal.core.worker.state import Pause, Secede, Unpause, WorkerState
from shoal.protocol import messages as m
from tests.core.test_worker_state import ME, compute, make, ok

TASK = m.TaskSpec(key="sum-1", func="f" * 24, payload=m.Payload(0, b"\x91\x93\x01\x02\x03"))
IDLE: dict[str, Any] = dict(
    lane="lane-1", lane_open=True, running=0, leaving=False, limited=False, watched=False
)


def reason(state: WorkerState | None, task: m.TaskSpec = TASK, **facts: Any) -> str:
    return lane_decline_reason(state, task, **{**IDLE, **facts})


def test_an_idle_worker_takes_a_plain_task():
    assert reason(make()) == ""


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({"lane_open": False}, f"lane lane-1 is not open on {ME}"),
        ({"leaving": True}, f"worker {ME} is leaving"),
        ({"limited": True}, f"worker {ME} has a lifetime or task budget"),
        ({"watched": True}, "a worker plugin watches transitions"),
        ({"running": 1}, f"worker {ME} runs another lane task"),
    ],
)
def test_each_fact_that_declines_names_itself(facts: dict[str, Any], expected: str):
    assert reason(make(), **facts) == expected


@pytest.mark.parametrize(
    "change",
    [
        {"deps": ["x"]},
        {"retries": 1},
        {"restrictions": m.TaskRestrictions(workers=["w"])},
        {"shuffle": m.ShuffleMark("s", "transfer", 0)},
        {"duration": 3.0},
        {"func": ""},
    ],
)
def test_only_a_plain_task_goes_by_lane(change: dict[str, Any]):
    task = msgspec.structs.replace(TASK, **change)
    assert "only a plain task" in reason(make(), task)


def test_a_worker_not_started_is_leaving():
    assert reason(None) == "worker  is leaving"


def test_a_busy_worker_declines_until_it_is_idle_again():
    ws = make(nthreads=1)
    ws.handle(compute("a"))  # runs
    assert reason(ws) == f"worker {ME} is busy"
    ws.handle(compute("b", prio=(1,)))  # and one waits
    assert reason(ws) == f"worker {ME} is busy"
    ws.handle(ok("a"))
    assert ws.executing_count == 1 and reason(ws) == f"worker {ME} is busy"  # b runs now
    ws.handle(ok("b"))
    assert reason(ws) == ""


def test_a_seceded_task_keeps_the_worker_busy():
    ws = make(nthreads=1)
    ws.handle(compute("a"))
    ws.handle(Secede("a", "secede-a"))
    assert ws.executing_count == 0 and ws.seceded_count == 1
    assert reason(ws) == f"worker {ME} is busy"


def test_a_paused_worker_declines_and_takes_again_once_resumed():
    ws = make()
    ws.handle(Pause("mem"))
    assert reason(ws) == f"worker {ME} is paused"
    ws.handle(Unpause("mem-ok"))
    assert reason(ws) == ""


def test_the_lane_is_checked_first():
    """An unknown lane says so, whatever else holds (the client then drops a stale lane)."""
    ws = make()
    ws.handle(compute("a"))
    assert reason(ws, lane_open=False, running=1).startswith("lane lane-1 is not open")
