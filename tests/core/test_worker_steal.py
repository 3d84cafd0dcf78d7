"""A steal request in the worker state machine, with no network: a task that has not
started is given back (answered ``ok`` and dropped, never run here); one that runs or
ran is "too late"; a request about another assignment is refused."""

from __future__ import annotations

from typing import Any

from test_worker_state import compute, dep, make, ok, run

from shoal.core.worker.state import Execute, GatherDep, SendMessage
from shoal.protocol.messages import Key, StealReply, StealRequest

PEER = "tcp://peer:1"


def steal(ws: Any, key: Key, run_id: int | None = None) -> list[Any]:
    if run_id is None:
        run_id = ws.tasks[key].run_id if key in ws.tasks else 0
    return ws.handle(StealRequest(key, run_id, f"steal-{key}"))


def replies(out: list[Any]) -> list[tuple[Key, bool]]:
    return [
        (i.msg.key, i.msg.ok)
        for i in out
        if isinstance(i, SendMessage) and type(i.msg) is StealReply
    ]


def test_a_ready_task_is_given_back_and_never_runs_here():
    ws = make(1)
    run(ws, compute("busy"), compute("a"))
    assert ws.tasks["a"].state == "ready"
    out = steal(ws, "a")
    assert replies(out) == [("a", True)]
    assert "a" not in ws.tasks
    out = ws.handle(ok("busy"))  # the thread frees: nothing else is started
    assert [i for i in out if isinstance(i, Execute)] == []


def test_a_task_waiting_for_data_is_given_back():
    ws = make(1)
    out = run(ws, compute("a", dep("x", PEER)))
    assert any(isinstance(i, GatherDep) for i in out)
    out = steal(ws, "a")
    assert replies(out) == [("a", True)]
    assert "a" not in ws.tasks
    assert ws.tasks["x"].state in ("flight", "cancelled")  # nobody here needs it now


def test_a_running_task_is_too_late_and_runs_on():
    ws = make(1)
    out = run(ws, compute("a"))
    assert out == [Execute("a", "compute-a")]
    out = steal(ws, "a")
    assert replies(out) == [("a", False)]
    assert ws.tasks["a"].state == "executing"
    out = ws.handle(ok("a"))
    assert ws.tasks["a"].state == "memory"


def test_a_finished_or_unknown_task_is_too_late():
    ws = make(1)
    run(ws, compute("a"), ok("a"))
    assert replies(steal(ws, "a")) == [("a", False)]
    assert ws.tasks["a"].state == "memory"
    assert replies(steal(ws, "ghost")) == [("ghost", False)]


def test_a_request_about_another_assignment_is_refused():
    ws = make(1)
    run(ws, compute("busy"), compute("a"))
    run_id = ws.tasks["a"].run_id
    assert replies(steal(ws, "a", run_id + 1)) == [("a", False)]
    assert ws.tasks["a"].state == "ready"
