"""The worker state machine, driven with events only: no network, no threads.

Every test runs with ``validate=True``, so every invariant is checked after each batch.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from shoal.core.story import InvalidState, InvalidTransition
from shoal.core.worker.state import (
    Execute,
    ExecuteFailure,
    ExecuteSuccess,
    GatherDep,
    GatherFailure,
    GatherSuccess,
    Instruction,
    Rejoin,
    ResumeThread,
    Secede,
    SendMessage,
    UpdateDataEvent,
    WorkerState,
)
from shoal.protocol.messages import (
    AddKeys,
    ComputeTask,
    DepInfo,
    FreeKeys,
    Key,
    MissingData,
    Payload,
    TaskErred,
    TaskFinished,
    TaskSeceded,
)

ME = "tcp://me:1"
ARGS = Payload(0, b"\x92\x90\x80")
EXC = Payload(1, b"exception")


def make(nthreads: int = 1, **kwargs: Any) -> WorkerState:
    return WorkerState(nthreads, ME, validate=True, **kwargs)


def dep(key: Key, *who_has: str, nbytes: int = 10) -> DepInfo:
    return DepInfo(key, nbytes, list(who_has))


def compute(key: Key, *deps: DepInfo, prio: tuple[int, ...] = (0,), sid: str = "") -> ComputeTask:
    return ComputeTask(key, "func", ARGS, prio, list(deps), stimulus_id=sid or f"compute-{key}")


def ok(key: Key, value: Any = 1, sid: str = "") -> ExecuteSuccess:
    return ExecuteSuccess(key, value, 8, None, "int", 1.0, 2.0, sid or f"done-{key}")


def fail(key: Key, sid: str = "") -> ExecuteFailure:
    return ExecuteFailure(key, EXC, "Traceback", 1.0, 2.0, sid or f"erred-{key}")


def finished(key: Key, sid: str) -> SendMessage:
    return SendMessage(TaskFinished(key, 8, 1.0, 2.0, None, "int", sid), sid)


def gathered(worker: str, sid: str = "g", missing: tuple[Key, ...] = (), **values: Any) -> Any:
    return GatherSuccess(worker, values, {k: 5 for k in values}, list(missing), sid)


def run(ws: WorkerState, *events: Any) -> list[Instruction]:
    """Handle events one call at a time (as a result can only follow its Execute)."""
    return [inst for ev in events for inst in ws.handle(ev)]


def states(ws: WorkerState) -> dict[Key, str]:
    return {k: ts.state for k, ts in ws.tasks.items()}


# --- computing ----------------------------------------------------------------------------


def test_compute_without_dependencies_executes():
    ws = make()
    assert ws.handle(compute("a", sid="s1")) == [Execute("a", "s1")]
    assert states(ws) == {"a": "executing"}
    assert ws.executing_count == 1 and ws.ready_count == 0
    assert ws.tasks["a"].run_spec == ("func", ARGS)
    assert ws.handle(ok("a", 42, sid="s2")) == [finished("a", "s2")]
    assert states(ws) == {"a": "memory"} and ws.data == {"a": 42}
    assert ws.executing_count == 0


def test_nthreads_limit_and_priority_order():
    ws = make(nthreads=2)
    out = ws.handle(
        compute("low", prio=(5,)),
        compute("high", prio=(0, 1)),
        compute("mid", prio=(1,)),
        compute("top", prio=(0, 0)),
        compute("last", prio=(9,)),
    )
    assert out == [Execute("top", "compute-last"), Execute("high", "compute-last")]
    assert ws.executing_count == 2 and ws.ready_count == 3
    assert ws.handle(ok("high")) == [finished("high", "done-high"), Execute("mid", "done-high")]
    assert ws.handle(compute("urgent", prio=(-1,))) == []  # both threads busy
    assert ws.handle(fail("top")) == [
        SendMessage(TaskErred("top", EXC, "Traceback", 1.0, 2.0, "erred-top"), "erred-top"),
        Execute("urgent", "erred-top"),
    ]
    assert ws.tasks["top"].state == "error"
    assert [i.key for i in ws.handle(ok("mid"), ok("urgent")) if isinstance(i, Execute)] == [
        "low",
        "last",
    ]


def test_short_tasks_are_pipelined_in_priority_order():
    ws = make(nthreads=1)
    run(ws, *[compute(f"k{i:02}", prio=(i,)) for i in range(100)])
    assert ws.executing_count == 1  # no durations measured yet: one per thread

    def quick(key: Key, duration: float = 1e-5) -> ExecuteSuccess:
        return ExecuteSuccess(key, 1, 8, None, "int", 0.0, duration, f"done-{key}")

    started, running = ["k00"], ["k00"]
    for _ in range(12):
        new = [i.key for i in ws.handle(quick(running.pop(0))) if isinstance(i, Execute)]
        started += new
        running += new
    assert ws.executing_count == len(running) > 2  # queued behind the running task
    assert started == sorted(started)  # in priority order
    # a slow task shrinks the window: what is queued drains, nothing new starts
    assert not [i for i in ws.handle(quick(running.pop(0), 5.0)) if isinstance(i, Execute)]
    while len(running) > 1:
        assert not [i for i in ws.handle(quick(running.pop(0), 5.0)) if isinstance(i, Execute)]
    out = ws.handle(quick(running.pop(0), 5.0))
    assert [i for i in out if isinstance(i, Execute)] == [
        Execute(f"k{len(started):02}", "done-" + started[-1])
    ]


def test_execute_failure_sends_task_erred():
    ws = make()
    ws.handle(compute("a"))
    assert ws.handle(fail("a", sid="boom")) == [
        SendMessage(TaskErred("a", EXC, "Traceback", 1.0, 2.0, "boom"), "boom")
    ]
    assert states(ws) == {"a": "error"} and ws.data == {}
    assert ws.handle(FreeKeys(["a"], "free")) == []
    assert ws.tasks == {}


def test_erred_task_is_computed_again_or_fetched_when_asked():
    ws = make()
    run(ws, compute("a"), fail("a"))
    assert ws.handle(compute("a", sid="retry")) == [Execute("a", "retry")]
    ws.handle(fail("a"))
    # the scheduler now says a peer holds "a": it is fetched for its dependent
    assert ws.handle(compute("b", dep("a", "w1"), sid="cb")) == [GatherDep("w1", ["a"], 10, "cb")]
    assert ws.handle(gathered("w1", sid="g", a=1)) == [
        SendMessage(AddKeys(["a"], [5], "g"), "g"),
        Execute("b", "g"),
    ]


def test_local_dependencies_in_memory_or_still_running():
    ws = make(nthreads=1)
    ws.handle(compute("a"))
    # "a" is executing here: "b" waits for it, nothing is fetched
    assert ws.handle(compute("b", dep("a", ME), sid="cb")) == []
    assert states(ws) == {"a": "executing", "b": "waiting"}
    assert ws.handle(ok("a", sid="da")) == [finished("a", "da"), Execute("b", "da")]
    # "a" is in memory: "c" is ready at once
    ws.handle(ok("b"))
    assert ws.handle(compute("c", dep("a", ME), dep("b", ME), sid="cc")) == [Execute("c", "cc")]
    assert ws.tasks["c"].dependencies == {ws.tasks["a"], ws.tasks["b"]}


def test_compute_for_key_in_memory_resends_task_finished():
    ws = make()
    run(ws, compute("a"), ok("a", sid="first"))
    out = ws.handle(compute("a", sid="again"))
    assert out == [
        SendMessage(TaskFinished("a", 8, 1.0, 2.0, type_name="int", stimulus_id="again"), "again")
    ]
    assert states(ws) == {"a": "memory"}
    assert ws.handle(compute("a", sid="dup"))[0].msg.stimulus_id == "dup"  # each is answered
    ws.handle(compute("b"))
    assert ws.handle(compute("b")) == []  # already executing: nothing new


def test_dependency_nobody_holds_is_missing_at_once():
    ws = make()
    out = ws.handle(compute("b", dep("x", ME), dep("y"), dep("z", "w1"), sid="s"))
    assert out == [SendMessage(MissingData("b", ["x", "y"], "s", [[ME], []]), "s")]
    assert ws.tasks == {}


# --- fetching dependencies ------------------------------------------------------------------


def test_gather_batches_keys_per_peer():
    ws = make()
    out = ws.handle(
        compute("b", dep("x", "w1"), dep("y", "w1", ME), dep("z", "w2"), sid="s"),
    )
    assert out == [GatherDep("w1", ["x", "y"], 20, "s"), GatherDep("w2", ["z"], 10, "s")]
    assert states(ws) == {"b": "waiting", "x": "flight", "y": "flight", "z": "flight"}
    assert ws.tasks["y"].who_has == {"w1"}  # our own address is never a source


def test_gather_success_sends_add_keys_then_executes():
    ws = make()
    ws.handle(compute("b", dep("x", "w1"), dep("y", "w1"), dep("z", "w2")))
    assert ws.handle(gathered("w2", sid="g2", z=3)) == [
        SendMessage(AddKeys(["z"], [5], "g2"), "g2")
    ]
    assert ws.handle(gathered("w1", sid="g1", x=1, y=2)) == [
        SendMessage(AddKeys(["x", "y"], [5, 5], "g1"), "g1"),
        Execute("b", "g1"),
    ]
    assert ws.data == {"x": 1, "y": 2, "z": 3}
    assert states(ws) == {"b": "executing", "x": "memory", "y": "memory", "z": "memory"}
    ws.handle(ok("b"))
    # fetched replicas stay until the scheduler frees them (it knows via AddKeys)
    assert set(ws.data) == {"b", "x", "y", "z"}
    ws.handle(FreeKeys(["x", "y", "z", "b"], "free"))
    assert ws.tasks == {} and ws.data == {}


def test_transfer_bytes_limit_batches_and_always_sends_one_key():
    ws = make(transfer_bytes_limit=100)
    deps = [dep(k, "w1", nbytes=n) for k, n in [("x", 40), ("y", 50), ("z", 40), ("big", 500)]]
    assert ws.handle(compute("b", *deps, sid="s")) == [GatherDep("w1", ["x", "y"], 90, "s")]
    assert ws.tasks["z"].state == "fetch" and ws.tasks["big"].state == "fetch"
    out = ws.handle(gathered("w1", sid="g", x=1, y=2))
    assert out == [
        SendMessage(AddKeys(["x", "y"], [5, 5], "g"), "g"),
        GatherDep("w1", ["z"], 40, "g"),
    ]
    out = ws.handle(gathered("w1", sid="g2", z=3))
    assert out[-1] == GatherDep("w1", ["big"], 500, "g2")


def test_transfer_limit_on_concurrent_gathers():
    ws = make(transfer_limit=2)
    out = ws.handle(compute("b", dep("x", "w1"), dep("y", "w2"), dep("z", "w3"), sid="s"))
    assert out == [GatherDep("w1", ["x"], 10, "s"), GatherDep("w2", ["y"], 10, "s")]
    assert ws.tasks["z"].state == "fetch"
    out = ws.handle(gathered("w2", sid="g", y=1))
    assert out == [SendMessage(AddKeys(["y"], [5], "g"), "g"), GatherDep("w3", ["z"], 10, "g")]
    # a peer already busy is not asked twice; the next transfer goes elsewhere
    out = ws.handle(compute("c", dep("u", "w1"), dep("v", "w1", "w4"), sid="c"))
    assert out == []  # two transfers in flight already
    out = ws.handle(gathered("w3", sid="g3", z=1))
    assert out[-1] == GatherDep("w4", ["v"], 10, "g3")
    assert ws.tasks["u"].state == "fetch"


def test_missing_data_with_another_holder_fetches_from_it():
    ws = make()
    ws.handle(compute("b", dep("x", "w1", "w2"), dep("y", "w1")))
    out = ws.handle(gathered("w1", sid="g", missing=("x",), y=1))
    assert out == [SendMessage(AddKeys(["y"], [5], "g"), "g"), GatherDep("w2", ["x"], 10, "g")]
    assert ws.tasks["x"].who_has == {"w2"}
    assert ws.handle(gathered("w2", sid="g2", x=2)) == [
        SendMessage(AddKeys(["x"], [5], "g2"), "g2"),
        Execute("b", "g2"),
    ]


def test_missing_data_without_holder_sends_missing_data_and_forgets_dependents():
    ws = make(transfer_limit=2)
    ws.handle(
        compute("b", dep("x", "w1"), dep("y", "w2"), dep("z", "w3")),
        compute("c", dep("x", "w1")),
        compute("d", dep("y", "w2")),
    )
    assert states(ws)["z"] == "fetch"
    ws.handle(gathered("w2", sid="g2", y=1))
    out = ws.handle(gathered("w1", sid="g1", missing=("x",)))
    assert out == [
        SendMessage(MissingData("b", ["x"], "g1", [["w1"]]), "g1"),
        SendMessage(MissingData("c", ["x"], "g1", [["w1"]]), "g1"),
    ]
    # b and c are forgotten with x; z, in flight, is cancelled; y was reported: it stays
    assert states(ws) == {"y": "memory", "d": "executing", "z": "cancelled"}
    assert ws.handle(gathered("w3", sid="g3", z=1)) == []
    assert states(ws) == {"y": "memory", "d": "executing"}


def test_missing_data_cancels_other_transfers_of_the_dependent():
    ws = make()
    ws.handle(compute("b", dep("x", "w1"), dep("y", "w2")))
    assert ws.handle(gathered("w1", sid="g", missing=("x",))) == [
        SendMessage(MissingData("b", ["x"], "g", [["w1"]]), "g")
    ]
    assert states(ws) == {"y": "cancelled"}
    assert ws.handle(gathered("w2", sid="late", y=1)) == []  # discarded, nothing sent
    assert ws.tasks == {} and ws.data == {}


def test_missing_data_leaves_a_stub_for_local_dependents():
    ws = make()
    ws.handle(compute("b", dep("x", "w1")), compute("c", dep("b", ME)))
    assert ws.handle(gathered("w1", sid="g", missing=("x",))) == [
        SendMessage(MissingData("b", ["x"], "g", [["w1"]]), "g")
    ]
    # c still waits on b: the scheduler sends b again, or frees c
    assert states(ws) == {"b": "released", "c": "waiting"}
    assert ws.handle(compute("b", dep("x", "w2"), sid="again")) == [
        GatherDep("w2", ["x"], 10, "again")
    ]
    assert states(ws) == {"b": "waiting", "c": "waiting", "x": "flight"}
    ws.handle(GatherFailure("w2", ["x"], "fail"))
    assert states(ws) == {"b": "released", "c": "waiting"}
    ws.handle(FreeKeys(["c"], "free"))
    assert ws.tasks == {}


def test_gather_failure_removes_the_peer_everywhere():
    ws = make(transfer_limit=1, transfer_bytes_limit=10)
    ws.handle(
        compute("b", dep("x", "w1")),
        compute("c", dep("z", "w1"), dep("y", "w2", "w1")),
        compute("e", dep("v", "w1", "w3")),
    )
    assert states(ws) == {
        "b": "waiting", "x": "flight", "c": "waiting", "z": "fetch", "y": "fetch",
        "e": "waiting", "v": "fetch",
    }  # fmt: skip
    out = ws.handle(GatherFailure("w1", ["x"], "fail"))
    # z (waiting to be fetched) and x (in flight) have no other holder: their dependents
    # are given up, and y with c; v is fetched from w3 instead
    assert out == [
        SendMessage(MissingData("c", ["z"], "fail", [["w1"]]), "fail"),
        SendMessage(MissingData("b", ["x"], "fail", [["w1"]]), "fail"),
        GatherDep("w3", ["v"], 10, "fail"),
    ]
    assert states(ws) == {"e": "waiting", "v": "flight"}
    assert ws.tasks["v"].who_has == {"w3"}
    assert "w1" not in ws._has_what


def test_gather_failure_with_alternative_holders():
    ws = make(transfer_limit=1, transfer_bytes_limit=10)
    ws.handle(compute("b", dep("x", "w1", "w2"), dep("y", "w1", "w3")))
    assert states(ws) == {"b": "waiting", "x": "flight", "y": "fetch"}
    out = ws.handle(GatherFailure("w1", ["x"], "fail"))
    assert out == [GatherDep("w3", ["y"], 10, "fail")]  # w3 was waiting longer
    assert ws.tasks["x"].who_has == {"w2"} and ws.tasks["y"].who_has == {"w3"}
    out = ws.handle(gathered("w3", sid="g", y=1))
    assert out == [SendMessage(AddKeys(["y"], [5], "g"), "g"), GatherDep("w2", ["x"], 10, "g")]


# --- freeing ------------------------------------------------------------------------------


def test_free_keys_in_memory_waiting_ready_fetch_and_unknown():
    ws = make(nthreads=1, transfer_limit=1, transfer_bytes_limit=1)
    run(ws, compute("run"), compute("mem"), ok("run"))
    assert states(ws) == {"run": "memory", "mem": "executing"}
    ws.handle(compute("rdy"), compute("wait", dep("x", "w1"), dep("f", "w1")))
    assert states(ws) == {
        "run": "memory", "mem": "executing", "rdy": "ready", "wait": "waiting",
        "x": "flight", "f": "fetch",
    }  # fmt: skip
    assert ws.handle(FreeKeys(["run", "rdy", "wait", "nope"], "free")) == []
    assert states(ws) == {"mem": "executing", "x": "cancelled"}
    assert ws.data == {} and ws.ready_count == 0


def test_free_executing_cancels_and_discards_the_result():
    ws = make()
    ws.handle(compute("a"))
    assert ws.handle(FreeKeys(["a"], "free")) == []
    assert states(ws) == {"a": "cancelled"}
    assert ws.executing_count == 1  # the thread is still busy
    assert ws.handle(compute("b")) == []
    assert ws.handle(ok("a", sid="late")) == [Execute("b", "late")]
    assert "a" not in ws.tasks and "a" not in ws.data
    ws.handle(FreeKeys(["b"], "free"))
    assert ws.handle(fail("b")) == []  # a failure of a cancelled task is not reported
    assert ws.tasks == {}


def test_free_flight_cancels_and_discards_the_data():
    ws = make()
    ws.handle(compute("b", dep("x", "w1")))
    assert ws.handle(FreeKeys(["b", "x"], "free")) == []
    assert states(ws) == {"x": "cancelled"}
    assert ws.handle(gathered("w1", x=1)) == []
    assert ws.tasks == {} and ws.data == {}
    # a cancelled transfer that fails is forgotten as well
    run(ws, compute("c", dep("y", "w2")), FreeKeys(["c"], "free"))
    assert states(ws) == {"y": "cancelled"}
    # freed within the batch that created it, a dependency is never even fetched
    assert ws.handle(compute("d", dep("u", "w3")), FreeKeys(["d"], "free")) == []
    assert states(ws) == {"y": "cancelled"}
    assert ws.handle(GatherFailure("w2", ["y"], "f")) == []
    assert ws.tasks == {}


def test_freed_task_requested_again_while_running_is_reported():
    ws = make()
    run(ws, compute("a"), FreeKeys(["a"], "free"), compute("a", sid="again"))
    assert states(ws) == {"a": "executing"}
    assert ws.handle(ok("a", sid="d")) == [finished("a", "d")]
    run(ws, compute("b", dep("x", "w1")), FreeKeys(["b"], "f"))
    assert states(ws)["x"] == "cancelled"
    ws.handle(compute("c", dep("x", "w1")))  # needed again: the transfer counts again
    assert states(ws)["x"] == "flight"
    assert ws.handle(gathered("w1", sid="g", x=1)) == [
        SendMessage(AddKeys(["x"], [5], "g"), "g"),
        Execute("c", "g"),
    ]


def test_dependency_kept_while_a_dependent_runs():
    ws = make()
    run(ws, compute("a"), ok("a"), compute("b", dep("a", ME)))
    assert states(ws) == {"a": "memory", "b": "executing"}
    ws.handle(FreeKeys(["a"], "free"))
    assert "a" in ws.data  # the thread may still read it
    ws.handle(FreeKeys(["b"], "free"))
    assert "a" in ws.data  # cancelled, but the thread may still read it
    ws.handle(ok("b"))
    assert ws.tasks == {} and ws.data == {}


def test_compute_for_key_in_flight_computes_it_if_the_transfer_fails():
    ws = make()
    ws.handle(compute("b", dep("x", "w1")))
    assert ws.handle(compute("x", sid="cx")) == []
    out = ws.handle(gathered("w1", sid="g", missing=("x",)))
    assert out == [Execute("x", "g")]
    assert ws.handle(ok("x", sid="dx")) == [finished("x", "dx"), Execute("b", "dx")]
    # and if it succeeds, the scheduler hears of it as a finished task
    run(ws, compute("c", dep("y", "w1")), compute("y"))
    assert states(ws) == {"x": "memory", "b": "executing", "c": "waiting", "y": "flight"}
    assert ws.handle(gathered("w1", sid="g2", y=1)) == [
        SendMessage(TaskFinished("y", 5, 0.0, 0.0, stimulus_id="g2"), "g2")
    ]
    ws.handle(ok("b"))
    assert states(ws)["c"] == "executing"


# --- scattered data ---------------------------------------------------------------------


def test_update_data_puts_keys_in_memory_without_messages():
    ws = make()
    ws.handle(compute("b", dep("x", "w1"), dep("s", "w2")))
    assert ws.handle(UpdateDataEvent({"s": 10, "new": 11}, {"s": 3, "new": 4}, "scatter")) == []
    assert ws.data == {"s": 10, "new": 11}
    assert ws.tasks["new"].run_spec is None and ws.tasks["new"].nbytes == 4
    # the transfer of "s" ends later: its data is ignored
    ws.handle(gathered("w2", s=99))
    assert ws.data["s"] == 10
    assert ws.handle(gathered("w1", sid="g", x=1))[-1] == Execute("b", "g")


def test_update_data_over_a_running_task_waits_for_its_thread():
    ws = make()
    run(ws, compute("a"), UpdateDataEvent({"a": 7}, {"a": 1}, "scatter"))
    assert states(ws) == {"a": "memory"} and ws.executing_count == 1
    ws.handle(FreeKeys(["a"], "free"))
    assert states(ws) == {"a": "cancelled"} and ws.data == {}
    assert ws.handle(compute("b")) == []
    assert ws.handle(ok("a", sid="d")) == [Execute("b", "d")]
    assert "a" not in ws.tasks


def test_update_data_over_an_assigned_task_reports_it_finished():
    """The running task's own result is dropped, so the scheduler, which awaits one,
    hears of the scattered value instead (untimed); otherwise it would wait forever."""
    ws = make()
    run(ws, compute("a"), compute("b"))  # one thread: "b" is ready, not running
    assert states(ws) == {"a": "executing", "b": "ready"}
    out = ws.handle(UpdateDataEvent({"a": 7, "b": 8, "c": 9}, {"a": 1, "b": 2, "c": 3}, "s"))
    assert out == [
        SendMessage(TaskFinished("a", 1, 0.0, 0.0, stimulus_id="s"), "s"),
        SendMessage(TaskFinished("b", 2, 0.0, 0.0, stimulus_id="s"), "s"),
    ]
    assert states(ws) == {"a": "memory", "b": "memory", "c": "memory"}
    assert ws.handle(ok("a")) == []  # the thread's result is dropped
    assert ws.data == {"a": 7, "b": 8, "c": 9}


# --- transitions, story, validation ------------------------------------------------------


def test_invalid_transition_carries_the_story():
    ws = make()
    ws.handle(compute("b", dep("x", "w1"), sid="s1"))
    with pytest.raises(InvalidTransition) as info:
        ws.handle(ok("b", sid="bogus"))
    e = info.value
    assert (e.key, e.start, e.finish) == ("b", "waiting", "memory")
    assert ("b", "ComputeTask", "s1") in e.story
    assert ("b", "released", "waiting", "s1") in e.story
    assert ("b", "ExecuteSuccess", "bogus") in e.story
    with pytest.raises(InvalidTransition) as info:
        ws._transition(ws.tasks["x"], "executing", "test")
    assert info.value.story == ws.story("x")
    assert ws.story("x") == [("x", "released", "fetch", "s1"), ("x", "fetch", "flight", "s1")]


def test_story_records_events_and_transitions_with_stimulus_ids():
    ws = make()
    run(ws, compute("a", sid="c"), ok("a", sid="d"))
    assert ws.story("a") == [
        ("a", "ComputeTask", "c"),
        ("a", "released", "ready", "c"),
        ("a", "ready", "executing", "c"),
        ("a", "ExecuteSuccess", "d"),
        ("a", "executing", "memory", "d"),
    ]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda ws: ws.data.pop("a"),
        lambda ws: ws.data.__setitem__("ghost", 1),
        lambda ws: ws.tasks["b"].waiting_for_data.clear(),
        lambda ws: ws.tasks["x"].who_has.add("w9"),
        lambda ws: ws.tasks["x"].dependents.clear(),
        lambda ws: setattr(ws.tasks["a"], "state", "ready"),
        lambda ws: ws._executing.clear(),
        lambda ws: setattr(ws, "_n_ready", 3),
    ],
)
def test_validate_state_catches_corruption(corrupt):
    ws = make(nthreads=2)
    run(ws, compute("a"), ok("a"), compute("b", dep("x", "w1")), compute("c"))
    ws.validate_state()
    corrupt(ws)
    with pytest.raises(InvalidState):
        ws.validate_state()


def test_validate_runs_after_every_handle():
    ws = make()
    ws.handle(compute("a"))
    ws.tasks["a"].state = "memory"
    with pytest.raises(InvalidState):
        ws.handle()


# --- property test -------------------------------------------------------------------------

PEERS = ["w1", "w2", "w3"]
GPUS = 2.0  # the worker's resources


@st.composite
def graphs(draw: Any) -> list[dict[str, Any]]:
    """Tasks t0..tn. Local ones can be computed here (from earlier tasks); the scheduler
    names holders for each task (maybe us), some of which do not actually hold it."""
    n = draw(st.integers(1, 9))
    tasks = []
    for i in range(n):
        local = draw(st.booleans())
        who_has = [ME] if local and draw(st.integers(0, 3)) else []
        who_has += draw(st.lists(st.sampled_from(PEERS), max_size=3, unique=True))
        if not local and draw(st.integers(0, 3)) == 0:
            who_has.append(ME)
        tasks.append(
            {
                "key": f"t{i}",
                "local": local,
                "deps": draw(st.lists(st.integers(0, i - 1), max_size=4, unique=True))
                if i and local
                else [],
                "who_has": who_has,
                "holds": [w for w in who_has if w != ME and draw(st.integers(0, 3))],
                "nbytes": draw(st.integers(1, 30)),
                "prio": (draw(st.integers(0, 3)), i),
                "gpus": draw(st.sampled_from([0, 0, 1, 2])) if local else 0,
            }
        )
    return tasks


def drive(ws: WorkerState, batch: list[Any], pending: dict[str, Any]) -> None:
    """Handle a batch, record the new instructions and check them.

    Messages are checked against the state only after a batch of one event: within a
    batch, later events may change what an earlier message described."""
    wanted = pending["wanted"] | pending["asked"]  # wanted at any point of the batch
    pending["asked"] = set()
    single = len(batch) == 1
    out = ws.handle(*batch)
    for inst in out:
        if isinstance(inst, Execute):
            assert inst.key not in pending["execute"], f"{inst.key} executed twice at once"
            pending["execute"].append(inst.key)
        elif isinstance(inst, GatherDep):
            assert inst.worker not in pending["gather"], f"two transfers from {inst.worker}"
            assert inst.keys and inst.worker != ME
            pending["gather"][inst.worker] = inst.keys
        elif isinstance(inst, ResumeThread):
            # a thread, not a place in the queue of tasks run ahead, must be free for it
            assert len(pending["execute"]) < ws.nthreads, f"{inst.key} resumed, threads busy"
            pending["rejoining"].remove(inst.key)  # its thread counts again
            pending["execute"].append(inst.key)
            pending["resumed"].add(inst.key)
        else:
            msg = inst.msg
            if isinstance(msg, TaskFinished | TaskErred):
                assert msg.key in wanted, f"{msg.key} reported but not wanted"
                assert not single or (msg.key in ws.data) == isinstance(msg, TaskFinished)
            elif isinstance(msg, AddKeys):
                assert not single or all(k in ws.data for k in msg.keys)
            elif isinstance(msg, TaskSeceded):
                assert msg.key in wanted, f"{msg.key} seceded but not wanted"
            else:
                assert isinstance(msg, MissingData)
                # the scheduler reschedules it, unless a later event of the batch asked again
                sids = [ev.stimulus_id for ev in batch]
                again = pending["last_ask"].get(msg.key)
                if again not in sids or sids.index(again) <= sids.index(msg.stimulus_id):
                    pending["wanted"].discard(msg.key)
                # not computed here; still fetched if a local task needs it
                st = ws.tasks[msg.key].state if msg.key in ws.tasks else "forgotten"
                assert not single or st in ("forgotten", "released", "fetch", "flight")
    assert len(pending["gather"]) <= ws.transfer_limit
    assert ws.executing_count == len(pending["execute"])
    # The pool's threads take whatever is handed out; a rejoined task runs on a thread of
    # its own: together never more than nthreads tasks at once.
    resumed = [k for k in pending["execute"] if k in pending["resumed"]]
    pool = len(pending["execute"]) - len(resumed)
    assert not resumed or pool + len(resumed) <= ws.nthreads, "more threads than nthreads"
    assert ws.seceded_count == len(pending["seceded"]) + len(pending["rejoining"])
    # every thread still running holds its GPUs, whatever became of its task (seceded too)
    threads = pending["execute"] + pending["seceded"] + pending["rejoining"]
    assert sum(pending["gpus"][k] for k in threads) <= GPUS


@settings(max_examples=sized(ci=100, full=300), suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=graphs(),
    data=st.data(),
    nthreads=st.integers(1, 3),
    transfer_limit=st.integers(1, 3),
    bytes_limit=st.sampled_from([1, 40, 1000]),
)
def test_random_interleavings_keep_the_state_valid(
    graph, data, nthreads, transfer_limit, bytes_limit
):
    ws = WorkerState(
        nthreads,
        ME,
        validate=True,
        transfer_limit=transfer_limit,
        transfer_bytes_limit=bytes_limit,
        resources={"GPU": GPUS},
    )
    by_key = {t["key"]: t for t in graph}
    pending: dict[str, Any] = {
        "execute": [],  # counted threads
        "seceded": [],  # threads that seceded
        "rejoining": [],  # seceded threads waiting for ResumeThread
        "resumed": set(),  # rejoined: running on threads of their own again
        "gather": {},
        "wanted": set(),
        "asked": set(),
        "last_ask": {},
        "gpus": {t["key"]: t["gpus"] for t in graph},
    }

    def compute_msg(t: dict[str, Any], sid: str) -> ComputeTask:
        deps = [by_key[f"t{d}"] for d in t["deps"]]
        infos = [DepInfo(d["key"], d["nbytes"], d["who_has"]) for d in deps]
        resources = {"GPU": float(t["gpus"])} if t["gpus"] else {}
        return ComputeTask(t["key"], "f", ARGS, t["prio"], infos, sid, resources)

    def answer_gather(worker: str, sid: str, lose: bool, honest: bool) -> GatherSuccess:
        keys = pending["gather"].pop(worker)
        has = [k for k in keys if worker in by_key[k]["holds"] or (honest and not lose)]
        if lose and has:
            has = has[1:]
        return GatherSuccess(
            worker, {k: k for k in has}, {k: 3 for k in has}, [k for k in keys if k not in has], sid
        )

    local = [t for t in graph if t["local"]]

    def event(sid: str) -> Any:
        actions = ["compute", "compute", "free", "scatter"] if local else ["free", "scatter"]
        if pending["execute"]:
            actions += ["exec_ok", "exec_ok", "exec_fail", "secede"]
        if pending["seceded"]:
            actions += ["rejoin", "seceded_ok"]
        if pending["gather"]:
            actions += ["gather_ok", "gather_ok", "gather_fail"]
        action = data.draw(st.sampled_from(actions))
        if action == "compute":
            t = data.draw(st.sampled_from(local))
            pending["wanted"].add(t["key"])
            pending["asked"].add(t["key"])
            pending["last_ask"][t["key"]] = sid
            return compute_msg(t, sid)
        if action == "free":
            keys = data.draw(st.lists(st.sampled_from(list(by_key)), min_size=1, max_size=3))
            pending["wanted"].difference_update(keys)
            return FreeKeys(keys, sid)
        if action == "scatter":
            key = data.draw(st.sampled_from(list(by_key)))
            pending["wanted"].add(key)  # the scheduler hears of it from the client
            pending["asked"].add(key)
            pending["last_ask"][key] = sid
            return UpdateDataEvent({key: "scattered"}, {key: 1}, sid)
        if action == "secede":
            key = pending["execute"].pop(data.draw(st.integers(0, len(pending["execute"]) - 1)))
            pending["resumed"].discard(key)
            pending["seceded"].append(key)
            return Secede(key, sid)
        if action in ("rejoin", "seceded_ok"):
            key = pending["seceded"].pop(data.draw(st.integers(0, len(pending["seceded"]) - 1)))
            if action == "seceded_ok":  # it ends without rejoining
                return ExecuteSuccess(key, key, 8, None, "int", 1.0, 2.0, sid)
            pending["rejoining"].append(key)
            return Rejoin(key, sid)
        if action.startswith("exec"):
            key = pending["execute"].pop(data.draw(st.integers(0, len(pending["execute"]) - 1)))
            pending["resumed"].discard(key)
            if action == "exec_fail":
                return fail(key, sid)
            # short tasks run ahead (0.01) or get pipelined (1e-5)
            took = data.draw(st.sampled_from([1.0, 0.01, 1e-5]))
            return ExecuteSuccess(key, key, 8, None, "int", 1.0, 1.0 + took, sid)
        worker = data.draw(st.sampled_from(sorted(pending["gather"])))
        if action == "gather_fail":
            return GatherFailure(worker, pending["gather"].pop(worker), sid)
        return answer_gather(worker, sid, data.draw(st.booleans()), False)

    for step in range(data.draw(st.integers(0, 50))):
        # several events in one batch, as the server feeds them
        pending["asked"] = set(pending["wanted"])
        batch = [event(f"step-{step}-{i}") for i in range(data.draw(st.integers(1, 3)))]
        drive(ws, batch, pending)

    def drain(tag: str) -> None:
        for i in range(1000):
            if not (pending["execute"] or pending["gather"] or pending["seceded"]):
                assert not pending["rejoining"]  # resumed once the counted threads ended
                return
            ending = pending["execute"] + pending["seceded"]
            events: list[Any] = [ok(k, k, f"{tag}-{i}") for k in ending]
            pending["execute"], pending["seceded"] = [], []
            pending["resumed"].clear()
            events += [answer_gather(w, f"{tag}-{i}", False, True) for w in list(pending["gather"])]
            drive(ws, events, pending)
        raise AssertionError("the state machine never settles")

    drain("drain")
    # Settled: everything is done, or waits on something the scheduler must resolve
    # (a key it freed or erred here, or a stub whose data went missing).
    for ts in ws.tasks.values():
        assert ts.state in ("memory", "error", "waiting", "released"), ts
        if ts.state == "waiting":
            assert all(d.state in ("waiting", "released", "error") for d in ts.waiting_for_data)
    for key, value in ws.data.items():
        assert value in (key, "scattered")
    # Freeing every key leaves nothing behind once running work has ended.
    drive(ws, [FreeKeys(list(by_key), "free-all")], pending)
    drain("end")
    assert ws.tasks == {} and ws.data == {}
    assert ws.executing_count == 0 and ws.ready_count == 0 and ws.seceded_count == 0
    assert not ws._has_what and not ws._data_needed and not ws._in_flight
