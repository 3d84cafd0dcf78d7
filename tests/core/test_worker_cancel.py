"""Tasks the scheduler takes back while they run (ReleaseCompute), in the worker state
machine with no network: the answer (ComputeReleased) comes exactly once per release
with ``drain``, only once no counted thread runs the task any more; an interrupted
(force-cancelled) execution is never taken over again, and what wants its key again
waits for its thread to end."""

from __future__ import annotations

from typing import Any

from test_worker_state import compute, dep, fail, finished, gathered, make, ok, run

from shoal.core.worker.state import (
    Execute,
    GatherDep,
    GatherFailure,
    Interrupt,
    InterruptExpired,
    RestartWorker,
    Secede,
    SendMessage,
)
from shoal.protocol.messages import ComputeReleased, Key, MissingData, ReleaseCompute

PEER = "tcp://peer:1"


def release(key: Key, drain: bool = True, interrupt: bool = False, sid: str = "") -> Any:
    return ReleaseCompute(key, drain, interrupt, sid or f"release-{key}")


def answered(out: list[Any]) -> list[Key]:
    """Keys answered with ComputeReleased, in order."""
    return [i.msg.key for i in out if isinstance(i, SendMessage) and type(i.msg) is ComputeReleased]


def sent(out: list[Any]) -> list[str]:
    return [type(i.msg).__name__ for i in out if isinstance(i, SendMessage)]


def executed(out: list[Any]) -> list[Key]:
    return [i.key for i in out if isinstance(i, Execute)]


def interrupts(out: list[Any]) -> list[Interrupt]:
    return [i for i in out if isinstance(i, Interrupt)]


# --- the answer: once, when no counted thread runs the task ----------------------------


def test_a_task_not_started_is_answered_at_once():
    ws = make(1)
    run(ws, compute("busy"), compute("a"))
    assert ws.tasks["a"].state == "ready"
    out = ws.handle(release("a"))
    assert answered(out) == ["a"] and "a" not in ws.tasks


def test_an_unknown_key_is_answered_at_once():
    """The worker may have dropped it already (MissingData, a result sent and freed)."""
    ws = make(1)
    assert answered(ws.handle(release("ghost"))) == ["ghost"]


def test_a_task_in_memory_is_answered_at_once_and_dropped():
    ws = make(1)
    run(ws, compute("a"), ok("a"))
    out = ws.handle(release("a"))
    assert answered(out) == ["a"] and "a" not in ws.tasks and ws.data == {}


def test_a_running_task_is_answered_when_its_thread_ends():
    ws = make(1)
    run(ws, compute("a"), compute("b"))
    out = ws.handle(release("a"))
    assert answered(out) == [] and ws.tasks["a"].state == "cancelled"
    assert ws.executing_count == 1  # the thread still counts: "b" does not start
    assert executed(out) == []
    out = ws.handle(ok("a", sid="a-ended"))
    # its result is dropped, the scheduler learns the thread is free, "b" starts
    assert out == [SendMessage(ComputeReleased("a", "a-ended"), "a-ended"), Execute("b", "a-ended")]
    assert "a" not in ws.tasks and ws.data == {}


def test_a_failing_released_task_is_answered_and_its_error_dropped():
    ws = make(1)
    run(ws, compute("a"), release("a"))
    out = ws.handle(fail("a"))
    assert sent(out) == ["ComputeReleased"] and "a" not in ws.tasks


def test_without_drain_no_answer_is_ever_sent():
    """A seceded task holds no slot at the scheduler: it asks for no answer."""
    ws = make(1)
    run(ws, compute("a"))
    assert answered(ws.handle(release("a", drain=False))) == []
    assert answered(ws.handle(ok("a"))) == []
    assert answered(ws.handle(release("b", drain=False))) == []


def test_taken_over_again_by_a_compute_task_answers_at_once():
    """The same key computed here again: the running execution counts for it, so the
    thread is the new task's, and the scheduler counts it as processing."""
    ws = make(1)
    run(ws, compute("a"), release("a"))
    out = ws.handle(compute("a", sid="again"))
    assert answered(out) == ["a"] and ws.tasks["a"].state == "executing"
    assert executed(out) == []  # no second run
    assert ws.handle(ok("a", sid="end")) == [finished("a", "end")]


def test_released_twice_while_running_is_answered_twice():
    """Cancelled, submitted again, cancelled again: one answer per release, each when
    the thread it counted is free."""
    ws = make(1)
    run(ws, compute("a"), release("a", sid="r1"))
    assert answered(ws.handle(compute("a", sid="again"))) == ["a"]
    assert answered(ws.handle(release("a", sid="r2"))) == []
    assert answered(ws.handle(ok("a"))) == ["a"]
    assert ws.tasks == {}


def test_a_task_kept_for_a_local_dependent_is_answered_when_its_thread_ends():
    """Still executing for a local task that needs it: its thread is busy."""
    ws = make(2)
    run(ws, compute("a"), compute("b", dep("a", PEER)))
    assert ws.tasks["b"].state == "waiting"
    assert answered(ws.handle(release("a"))) == []
    assert ws.tasks["a"].state == "executing" and not ws.tasks["a"].wanted
    out = ws.handle(ok("a"))
    assert answered(out) == ["a"] and executed(out) == ["b"]


def test_a_seceded_task_is_answered_at_once():
    ws = make(1)
    run(ws, compute("a"), Secede("a", "sec"))
    assert answered(ws.handle(release("a"))) == ["a"]
    assert ws.tasks["a"].state == "cancelled"
    assert answered(ws.handle(ok("a"))) == []


def test_a_released_task_that_secedes_is_answered_then():
    ws = make(1)
    run(ws, compute("a"), release("a"))
    out = ws.handle(Secede("a", "sec"))
    assert answered(out) == ["a"] and "TaskSeceded" not in sent(out)
    assert answered(ws.handle(ok("a"))) == []


# --- interrupts ------------------------------------------------------------------------


def test_force_release_of_a_running_task_interrupts_its_thread():
    ws = make(1)
    run(ws, compute("a"), compute("b"))
    out = ws.handle(release("a", interrupt=True, sid="force"))
    assert interrupts(out) == [Interrupt("a", 1, "force")] and answered(out) == []
    out = ws.handle(fail("a", sid="interrupted"))  # TaskInterrupted in its thread
    assert sent(out) == ["ComputeReleased"] and executed(out) == ["b"]  # no TaskErred
    assert "a" not in ws.tasks


def test_force_release_of_a_task_not_running_interrupts_nothing():
    ws = make(1)
    run(ws, compute("busy"), compute("a"))
    out = ws.handle(release("a", interrupt=True))
    assert interrupts(out) == [] and answered(out) == ["a"]


def test_force_release_of_a_seceded_task_interrupts_it_without_an_answer():
    ws = make(1)
    run(ws, compute("a"), Secede("a", "sec"))
    out = ws.handle(release("a", drain=False, interrupt=True))
    assert len(interrupts(out)) == 1 and answered(out) == []


def test_an_interrupted_run_is_not_taken_over_the_key_runs_afresh_after_it():
    """The interruption must never become the result of the same key submitted again."""
    ws = make(1)
    run(ws, compute("a"), release("a", interrupt=True))
    out = ws.handle(compute("a", sid="again"))
    assert out == [] and ws.tasks["a"].state == "cancelled"  # waits: no answer, no run
    out = ws.handle(fail("a", sid="interrupted"))
    assert answered(out) == ["a"] and "TaskErred" not in sent(out)
    assert executed(out) == ["a"] and ws.tasks["a"].state == "executing"
    assert ws.handle(ok("a", sid="fresh")) == [finished("a", "fresh")]


def test_an_interrupted_run_released_again_is_forgotten_when_it_ends():
    ws = make(1)
    run(ws, compute("a"), release("a", interrupt=True), compute("a"))
    out = ws.handle(release("a", interrupt=True, sid="again"))
    assert interrupts(out) == [] and answered(out) == []  # interrupted once; two owed
    assert answered(ws.handle(fail("a"))) == ["a", "a"]
    assert ws.tasks == {}


def test_a_local_task_needing_an_interrupted_key_waits_then_fetches_it():
    ws = make(2)
    run(ws, compute("a"), release("a", interrupt=True))
    out = ws.handle(compute("b", dep("a", PEER)))
    assert ws.tasks["a"].state == "cancelled" and ws.tasks["b"].state == "waiting"
    assert not [i for i in out if isinstance(i, GatherDep)]
    out = ws.handle(fail("a", sid="interrupted"))
    assert [i.keys for i in out if isinstance(i, GatherDep)] == [["a"]]
    out = ws.handle(gathered(PEER, a=41))
    assert executed(out) == ["b"]


def test_a_local_task_needing_an_interrupted_key_held_nowhere_is_given_up():
    ws = make(2)
    run(ws, compute("a"), release("a", interrupt=True), compute("b", dep("a", PEER)))
    run(ws, GatherFailure(PEER, [], "peer-gone"))  # the only holder is gone meanwhile
    assert not ws.tasks["a"].who_has
    out = ws.handle(fail("a", sid="interrupted"))
    msgs = [i.msg for i in out if isinstance(i, SendMessage)]
    assert MissingData("b", ["a"], "interrupted", [[PEER]]) in msgs
    assert ws.tasks == {}


def test_a_thread_that_does_not_stop_asks_for_a_restart():
    ws = make(1)
    run(ws, compute("a"), release("a", interrupt=True))
    out = ws.handle(InterruptExpired("a", 1, "grace-over"))
    assert [type(i) for i in out] == [RestartWorker]
    # the slot stays counted until the thread really ends
    assert ws.executing_count == 1 and answered(out) == []


def test_a_grace_period_over_after_the_thread_ended_does_nothing():
    ws = make(1)
    run(ws, compute("a"), release("a", interrupt=True), fail("a"))
    assert ws.handle(InterruptExpired("a", 1, "late")) == []
    # the same key interrupted again: an old grace period is not the new one's
    run(ws, compute("a"), release("a", interrupt=True))
    assert ws.handle(InterruptExpired("a", 1, "old")) == []
    assert [type(i) for i in ws.handle(InterruptExpired("a", 2, "new"))] == [RestartWorker]
