"""Freeing results: the fast path (``memory -> released -> forgotten`` in one step)
records and does what the two transitions do."""

from __future__ import annotations

from typing import Any

from test_worker_state import compute, dep, make, ok, run

from shoal.core.worker.state import ExecuteSuccess
from shoal.protocol.messages import FreeKeys


def test_freeing_a_result_records_both_transitions_and_forgets_it():
    ws = make()
    sink: list[tuple[Any, ...]] = []
    ws.watch_transitions(sink)
    run(ws, compute("a"), ok("a", 42))
    sink.clear()
    assert ws.handle(FreeKeys(["a"], "free")) == []
    assert sink == [("a", "memory", "released", "free"), ("a", "released", "forgotten", "free")]
    story = [r for r in ws.story("a") if r[-1] == "free"]
    assert story == [
        ("a", "FreeKeys", "free"),
        ("a", "memory", "released", "free"),
        ("a", "released", "forgotten", "free"),
    ]
    assert ws.tasks == {} and dict(ws.data) == {} and ws.task_counts() == {}


def test_a_result_a_local_task_still_needs_is_kept_until_that_task_is_done():
    ws = make()
    run(ws, compute("a"), ok("a"), compute("b", dep("a", "tcp://me:1")))
    ws.handle(FreeKeys(["a"], "free"))
    assert ws.tasks["a"].state == "memory" and ws.task_counts() == {"memory": 1, "executing": 1}
    ws.handle(ExecuteSuccess("b", 2, 8, None, "int", 1.0, 2.0, "done-b"))
    assert "a" not in ws.tasks and "a" not in ws.data
    assert ws.task_counts() == {"memory": 1}
    ws.handle(FreeKeys(["b"], "free-b"))
    assert ws.tasks == {} and ws.task_counts() == {}
