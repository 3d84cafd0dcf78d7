"""Whether a worker takes a lane's run (shoal/core/worker/lanes.py), against a worker
state machine driven with events only: idle takes it; anything else to do, a pause, a
limit, a watcher or a run already under way declines it, saying why."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shoal.core.worker.lanes import (
    GraphLimits,
    LaneFacts,
    graph_decline_reason,
    graph_stop_reason,
    lane_decline_reason,
    task_prefix,
)
from shoal.core.worker.state import Pause, Secede, Unpause, WorkerState
from shoal.protocol import messages as m
from tests.core.test_worker_state import ME, compute, make, ok

TASK = m.TaskSpec(key="sum-1", func="f" * 24, payload=m.Payload(0, b"\x91\x93\x01\x02\x03"))
IDLE = LaneFacts("lane-1", lane_open=True, running=0, leaving=False, limited=False, watched=False)


def reason(state: WorkerState | None, task: m.TaskSpec = TASK, **facts: Any) -> str:
    return lane_decline_reason(state, task, IDLE._replace(**facts))


def test_an_idle_worker_takes_a_plain_task():
    assert reason(make()) == ""


DECLINING_FACTS = [
    ({"lane_open": False}, f"lane lane-1 is not open on {ME}"),
    ({"leaving": True}, f"worker {ME} is leaving"),
    ({"limited": True}, f"worker {ME} has a lifetime or task budget"),
    ({"watched": True}, "a worker plugin watches transitions"),
    ({"running": 1}, f"worker {ME} runs another lane task"),
]


@pytest.mark.parametrize("facts, expected", DECLINING_FACTS)
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


# ------------------------------------------------------------------ small graphs


def spec(key: m.Key, *deps: m.Key, **change: Any) -> m.TaskSpec:
    return msgspec.structs.replace(TASK, key=key, deps=list(deps), **change)


GRAPH = [spec(("ones-1", 0)), spec(("ones-1", 1)), spec("sum-2", ("ones-1", 0), ("ones-1", 1))]
KNOWN = {"ones": 0.001, "sum": 0.002}
LIMITS = GraphLimits()


def graph_reason(
    state: WorkerState | None,
    tasks: list[m.TaskSpec] = GRAPH,
    keys: list[m.Key] | None = None,
    durations: dict[str, float] = KNOWN,
    limits: GraphLimits = LIMITS,
    **facts: Any,
) -> str:
    keys = ["sum-2"] if keys is None else keys
    return graph_decline_reason(state, tasks, keys, durations, limits, IDLE._replace(**facts))


def test_an_idle_worker_takes_a_short_graph_of_known_prefixes():
    assert graph_reason(make()) == ""
    assert graph_reason(make(), keys=["sum-2", ("ones-1", 1)]) == ""  # several keys


@pytest.mark.parametrize("facts, expected", DECLINING_FACTS)
def test_a_graph_is_declined_for_the_worker_facts_a_task_is(facts: dict[str, Any], expected: str):
    assert graph_reason(make(), **facts) == expected


def test_a_busy_or_paused_worker_declines_a_graph():
    ws = make(nthreads=1)
    ws.handle(compute("a"))
    assert graph_reason(ws) == f"worker {ME} is busy"
    ws.handle(ok("a"))
    ws.handle(Pause("pause"))
    assert graph_reason(ws) == f"worker {ME} is paused"


def test_a_graph_must_come_dependencies_first_with_the_keys_asked_for_in_it():
    ws = make()
    backwards = [GRAPH[2], GRAPH[0], GRAPH[1]]
    assert "depends on ('ones-1', 0), which does not run before it" in graph_reason(ws, backwards)
    outside = [*GRAPH, spec("sum-3", "held-by-a-future")]
    assert "which does not run before it" in graph_reason(ws, outside, keys=["sum-3"])
    assert "appears twice" in graph_reason(ws, [*GRAPH, GRAPH[0]])
    assert "not in the graph: ['nope']" in graph_reason(ws, keys=["nope"])
    assert "not in the graph" in graph_reason(ws, keys=[])
    assert "graphs of 1 to 64 tasks, not 0" in graph_reason(ws, [])
    many = [spec(("ones-1", i)) for i in range(65)]
    assert "not 65" in graph_reason(ws, many, keys=[("ones-1", 0)])


@pytest.mark.parametrize(
    "change",
    [
        {"retries": 1},
        {"restrictions": m.TaskRestrictions(workers=["w"])},
        {"shuffle": m.ShuffleMark("s", "transfer", 0)},
        {"duration": 3.0},
        {"func": ""},
    ],
)
def test_every_task_of_a_graph_must_be_plain(change: dict[str, Any]):
    tasks = [GRAPH[0], msgspec.structs.replace(GRAPH[1], **change), GRAPH[2]]
    assert "only plain tasks" in graph_reason(make(), tasks)


def test_a_graph_goes_only_when_its_prefixes_durations_say_it_is_short():
    ws = make()
    assert graph_reason(ws, durations={"ones": 0.001}) == "no duration is known for 'sum' yet"
    # 2 x 0.001 + 0.002 = 0.004 s: within 0.004, not within 0.0039
    assert graph_reason(ws, limits=GraphLimits(expected=0.004)) == ""
    assert graph_reason(ws, limits=GraphLimits(expected=0.0039)) == (
        "the graph is expected to take 0.004s, past 0.0039s"
    )
    slow = {"ones": 0.015, "sum": 0.001}  # 31 ms against the default 20
    assert "expected to take 0.031s" in graph_reason(ws, durations=slow)


def test_a_task_is_counted_under_its_group_when_it_names_one():
    ws = make()
    grouped = [msgspec.structs.replace(GRAPH[0], group="other-9"), GRAPH[1], GRAPH[2]]
    assert graph_reason(ws, grouped) == "no duration is known for 'other' yet"
    assert task_prefix(grouped[0]) == "other" and task_prefix(GRAPH[0]) == "ones"


def test_a_graph_run_stops_past_its_time_or_its_bytes():
    limits = GraphLimits(expected=0.02, stop_after=0.1, max_bytes=1000)
    assert graph_stop_reason(limits, 0.1, 1000) == ""
    assert graph_stop_reason(limits, 0.1001, 0) == "the graph ran past 0.1s"
    assert graph_stop_reason(limits, 0.0, 1001) == (
        "the graph held 1001 bytes of results, past 1000"
    )
