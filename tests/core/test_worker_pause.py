"""The worker state machine's memory events: pausing, and results that cannot be pickled.
Driven with events only (no network, no threads), validated after every batch."""

from __future__ import annotations

from shoal.core.worker.state import (
    Execute,
    GatherDep,
    Pause,
    SendMessage,
    Unpause,
    UnserializableData,
)
from shoal.protocol.messages import AddKeys, KeyUnserializable, WorkerStatus
from tests.core.test_worker_state import compute, dep, finished, gathered, make, ok, states

PEER = "tcp://peer:2"


def status(value: str, sid: str) -> SendMessage:
    return SendMessage(WorkerStatus(value, sid), sid)


def test_paused_worker_starts_nothing_and_resumes_in_priority_order():
    ws = make(nthreads=2)
    assert ws.handle(Pause("mem-1")) == [status("paused", "mem-1")]
    assert ws.paused
    assert ws.handle(compute("low", prio=(2,)), compute("high", prio=(1,))) == []
    assert states(ws) == {"low": "ready", "high": "ready"}
    assert ws.handle(Pause("mem-2")) == []  # already paused: nothing new to say
    out = ws.handle(Unpause("mem-3"))
    assert out == [status("running", "mem-3"), Execute("high", "mem-3"), Execute("low", "mem-3")]
    assert not ws.paused
    assert ws.handle(Unpause("mem-4")) == []


def test_running_task_finishes_while_paused_but_nothing_follows():
    ws = make(nthreads=1)
    assert ws.handle(compute("a"), compute("b", prio=(1,))) == [Execute("a", "compute-b")]
    ws.handle(Pause("mem"))
    assert ws.handle(ok("a", sid="done-a")) == [finished("a", "done-a")]  # reported, no Execute
    assert states(ws) == {"a": "memory", "b": "ready"}
    assert ws.handle(Unpause("mem-2")) == [status("running", "mem-2"), Execute("b", "mem-2")]


def test_paused_worker_fetches_no_dependency():
    ws = make()
    ws.handle(Pause("mem"))
    assert ws.handle(compute("c", dep("x", PEER))) == []
    assert states(ws) == {"c": "waiting", "x": "fetch"}
    out = ws.handle(Unpause("mem-2"))
    assert out == [status("running", "mem-2"), GatherDep(PEER, ["x"], 10, "mem-2")]
    # data in flight when the worker pauses still arrives and is used once it resumes
    ws.handle(Pause("mem-3"))
    assert ws.handle(gathered(PEER, "g", x=1)) == [SendMessage(AddKeys(["x"], [5], "g"), "g")]
    assert states(ws) == {"c": "ready", "x": "memory"}
    assert ws.handle(Unpause("mem-4")) == [status("running", "mem-4"), Execute("c", "mem-4")]


def test_unserializable_result_is_reported_once_and_dropped():
    ws = make()
    ws.handle(compute("a"))
    ws.handle(ok("a", object()))
    out = ws.handle(UnserializableData("a", "cannot pickle 'lock'", "spill-1"))
    assert out == [
        SendMessage(KeyUnserializable("a", "cannot pickle 'lock'", "spill-1"), "spill-1")
    ]
    assert ws.tasks == {} and "a" not in ws.data
    assert ws.handle(UnserializableData("a", "again", "spill-2")) == []  # gone: nothing to say


def test_unserializable_result_stays_for_the_local_task_that_needs_it():
    ws = make()
    ws.handle(compute("a"))
    ws.handle(ok("a", 41))
    ws.handle(Pause("mem"))  # so that "b" waits, ready, for its dependency
    ws.handle(compute("b", dep("a", "tcp://me:1")))
    assert states(ws) == {"a": "memory", "b": "ready"}
    out = ws.handle(UnserializableData("a", "no", "serve-1"))
    assert out == [SendMessage(KeyUnserializable("a", "no", "serve-1"), "serve-1")]
    assert ws.handle(UnserializableData("a", "no", "serve-2")) == []  # reported already
    assert ws.data["a"] == 41  # "b" still reads it here
    ws.handle(Unpause("mem-2"))
    ws.handle(ok("b", 42))
    assert states(ws) == {"b": "memory"} and dict(ws.data) == {"b": 42}


def test_state_machine_uses_the_mapping_it_is_given():
    data: dict = {}
    ws = make(data=data)
    ws.handle(compute("a"))
    ws.handle(ok("a", 5))
    assert ws.data is data and data == {"a": 5}
