"""A task sent ahead of its dependencies (core/scheduler/ahead.py), as the worker state
machine takes it: the ComputeTask names dependencies held nowhere yet (``who_has=[]``)
that this worker is computing. It waits for them with no message, starts the moment
they are in memory, and is never run on a dependency that failed, was released, or is
not there. Events only, ``validate=True``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.core.worker.state import Execute, Pause, SendMessage, Unpause
from shoal.protocol.messages import (
    ComputeReleased,
    FreeKeys,
    MissingData,
    ReleaseCompute,
    TaskErred,
    TaskFinished,
)
from tests.core.test_worker_state import compute, dep, fail, finished, make, ok, run, states


def ahead(key: str, *deps: str, sid: str = "") -> Any:
    """The ComputeTask the scheduler sends ahead: its dependencies are held nowhere yet."""
    return compute(key, *(dep(d) for d in deps), sid=sid or f"ahead-{key}")


def test_it_waits_for_a_running_dependency_and_starts_when_it_finishes():
    ws = make()
    ws.handle(compute("a"))
    assert ws.handle(ahead("b", "a")) == []  # nothing fetched, nothing missing
    assert states(ws) == {"a": "executing", "b": "waiting"}
    assert ws.handle(ok("a", sid="da")) == [finished("a", "da"), Execute("b", "da")]


def test_it_waits_behind_a_dependency_not_started_yet():
    ws = make()
    run(ws, compute("x"), compute("a", prio=(1,)))
    assert states(ws) == {"x": "executing", "a": "ready"}
    assert ws.handle(ahead("b", "a")) == []
    assert ws.handle(ok("x", sid="dx")) == [finished("x", "dx"), Execute("a", "dx")]
    assert ws.handle(ok("a", sid="da")) == [finished("a", "da"), Execute("b", "da")]


def test_a_dependency_that_fails_never_starts_it_and_the_scheduler_frees_it():
    ws = make()
    run(ws, compute("a"), ahead("b", "a"))
    out = ws.handle(fail("a", sid="fa"))
    assert [type(i.msg) for i in out if isinstance(i, SendMessage)] == [TaskErred]
    assert not any(isinstance(i, Execute) for i in out)
    assert states(ws) == {"a": "error", "b": "waiting"}
    assert ws.handle(FreeKeys(["b"], "erred-a")) == []  # the scheduler erred b
    assert states(ws) == {"a": "error"}


def test_a_dependency_that_failed_before_it_came_is_missing():
    ws = make()
    run(ws, compute("a"), fail("a"))
    out = ws.handle(ahead("b", "a", sid="late"))
    assert out == [SendMessage(MissingData("b", ["a"], "late", [[]]), "late")]
    assert "b" not in ws.tasks


def test_freed_while_waiting_it_leaves_the_dependency_running():
    ws = make()
    run(ws, compute("a"), ahead("b", "a"))
    assert ws.handle(FreeKeys(["b"], "release")) == []
    assert states(ws) == {"a": "executing"}
    assert ws.handle(ok("a", sid="da")) == [finished("a", "da")]


def test_both_released_the_dependency_drains_and_nothing_else_runs():
    ws = make()
    run(ws, compute("a"), ahead("b", "a"))
    ws.handle(ReleaseCompute("a", True, False, "cancel"))
    assert ws.handle(FreeKeys(["b"], "cancel")) == []
    assert states(ws) == {"a": "cancelled"}
    out = ws.handle(ok("a", sid="da"))
    assert out == [SendMessage(ComputeReleased("a", "da"), "da")]
    assert ws.tasks == {}


def test_paused_it_does_not_start_until_unpaused():
    ws = make()
    run(ws, compute("a"), ahead("b", "a"))
    ws.handle(Pause("mem"))
    out = ws.handle(ok("a", sid="da"))
    assert finished("a", "da") in out and not any(isinstance(i, Execute) for i in out)
    assert states(ws) == {"a": "memory", "b": "ready"}
    assert Execute("b", "up") in ws.handle(Unpause("up"))


# --- random interleavings ------------------------------------------------------------------

EVENTS = ("ok_a", "fail_a", "free_b", "release_a", "free_a", "pause", "unpause", "ok_b")


@settings(max_examples=300, deadline=None)
@given(
    before=st.booleans(),  # b arrives before a has started or after a event
    events=st.lists(st.sampled_from(EVENTS), max_size=12),
)
def test_random_interleavings_never_run_it_on_a_failed_or_absent_dependency(
    before: bool, events: list[str]
) -> None:
    """Whatever the scheduler and the threads do around it, b executes only with a's
    value in memory here, and reports a result only after it executed."""
    ws = make()
    run(ws, compute("x"), compute("a", prio=(1,)))  # a waits behind x: "ready"
    a_done = False  # a's value was ever in memory (it stays: b depends on it)
    b_sent = False
    executing: set[str] = {"x"}
    pending = list(events)
    if before:
        ws.handle(ahead("b", "a"))
        b_sent = True
    else:
        pending.insert(len(pending) // 2, "send_b")
    ws.handle(ok("x", sid="dx"))  # a starts (unless paused below: it is not yet)
    executing = {"a"} if states(ws).get("a") == "executing" else set()
    for ev in pending:
        st_a = ws.tasks["a"].state if "a" in ws.tasks else None
        if ev == "send_b" and not b_sent:
            out = ws.handle(ahead("b", "a", sid="sb"))
            b_sent = True
        elif ev == "ok_a" and "a" in executing:
            out = ws.handle(ok("a", sid="oa"))
            executing.discard("a")
            a_done = a_done or st_a == "executing"
        elif ev == "fail_a" and "a" in executing:
            out = ws.handle(fail("a", sid="fa"))
            executing.discard("a")
        elif ev == "ok_b" and "b" in executing:
            out = ws.handle(ok("b", sid="ob"))
            executing.discard("b")
        elif ev == "free_b":
            out = ws.handle(FreeKeys(["b"], "fb"))
        elif ev == "free_a":
            out = ws.handle(FreeKeys(["a"], "fa2"))
        elif ev == "release_a":
            out = ws.handle(ReleaseCompute("a", False, False, "ra"))
        elif ev == "pause":
            out = ws.handle(Pause("p"))
        elif ev == "unpause":
            out = ws.handle(Unpause("u"))
        else:
            continue
        for inst in out:
            if isinstance(inst, Execute):
                executing.add(inst.key)
                if inst.key == "b":
                    assert "a" in ws.data, "b started without a's value"
            msg = inst.msg if isinstance(inst, SendMessage) else None
            if isinstance(msg, TaskFinished) and msg.key == "b":
                assert a_done, "a result for b though a never finished"
