"""The worker state machine fetching replicas the scheduler asks for (CopyKeys: data
leaving a retiring worker). No network, no threads; validate=True throughout."""

from __future__ import annotations

from test_worker_state import compute, dep, gathered, make, ok, states

from shoal.core.worker.state import GatherDep, GatherFailure, SendMessage
from shoal.protocol.messages import AddKeys, CopyKeys, MissingData, TaskFinished


def test_copied_keys_are_fetched_kept_and_reported():
    ws = make()
    out = ws.handle(CopyKeys([dep("a", "w-old", nbytes=7), dep("b", "w-old")], "copy-1"))
    assert out == [GatherDep("w-old", ["a", "b"], 17, "copy-1")]
    assert ws.handle(gathered("w-old", sid="g", a=1, b=2)) == [
        SendMessage(AddKeys(["a", "b"], [5, 5], "g"), "g")
    ]
    assert states(ws) == {"a": "memory", "b": "memory"}
    assert ws.data == {"a": 1, "b": 2}


def test_copy_of_a_key_already_here_or_coming_is_not_fetched_again():
    ws = make()
    ws.handle(compute("x"))
    ws.handle(ok("x"))
    ws.handle(compute("y", dep("d", "w1")))  # d is in flight from w1
    assert ws.handle(CopyKeys([dep("x", "w-old"), dep("d", "w-old")], "copy")) == []
    assert states(ws)["d"] == "flight"


def test_copy_that_cannot_be_had_is_dropped_without_a_trace():
    ws = make()
    ws.handle(CopyKeys([dep("a", "w-old")], "copy"))
    out = ws.handle(GatherFailure("w-old", ["a"], "gone"))
    assert not any(isinstance(i, SendMessage) for i in out)
    assert ws.tasks == {} and ws.data == {}


def test_copy_naming_only_this_worker_is_ignored():
    ws = make()
    assert ws.handle(CopyKeys([dep("a", "tcp://me:1")], "copy")) == []
    assert ws.tasks == {}


def test_copied_key_later_used_by_a_task_is_not_fetched_twice():
    ws = make()
    ws.handle(CopyKeys([dep("a", "w-old")], "copy"))
    out = ws.handle(compute("b", dep("a", "w-old")))
    assert not any(isinstance(i, GatherDep) for i in out)
    out = ws.handle(gathered("w-old", sid="g", a=1))
    assert SendMessage(AddKeys(["a"], [5], "g"), "g") in out
    assert not any(
        isinstance(i, SendMessage) and isinstance(i.msg, MissingData | TaskFinished) for i in out
    )
    assert states(ws) == {"a": "memory", "b": "executing"}
