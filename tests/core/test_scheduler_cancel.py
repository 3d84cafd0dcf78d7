"""Cancelling (or otherwise releasing) a processing task, in the scheduler state machine
with no network: the worker's thread that may still run it counts busy ("draining")
until the worker answers ComputeReleased, so nothing queues up behind a thread that is
not free; ``CancelKeys(force=True)`` asks the worker to interrupt it."""

from __future__ import annotations

from scheduler_harness import W1, W2, Sim

from shoal.protocol.messages import (
    CancelKeys,
    ComputeReleased,
    FreeKeys,
    MissingData,
    ReleaseCompute,
    TaskRestrictions,
    TaskSeceded,
)


def roots(n: int, prefix: str = "r") -> dict[str, list[str]]:
    return {f"{prefix}-{i}": [] for i in range(n)}


def test_the_thread_of_a_cancelled_task_counts_until_the_worker_answers():
    """The issue's scenario: a task that sleeps forever, cancelled; later tasks must
    not be sent to the one thread it still holds."""
    sim = Sim({W1: 1})
    sim.submit({"sleep": []})
    sim.cancel("sleep", sid="cancel")
    assert sim.to_worker(W1)[-1] == ReleaseCompute("sleep", True, False, "cancel")
    assert sim.ws(W1).draining == {"sleep": 1} and sim.ws(W1).slot_threads == 0
    sim.submit(roots(5))
    assert sim.computes(W1) == [] and sim.s.nqueued == 5  # none waits behind "sleep"
    sim.drained(W1, "sleep", sid="thread-ended")
    assert sim.computes(W1) == ["r-0", "r-1"]  # min_slots of a one-thread worker
    assert sim.ws(W1).draining == {} and sim.ws(W1).slot_threads == 1


def test_queued_tasks_go_to_another_worker_meanwhile():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"sleep": []}, priority={"sleep": 10})
    stuck = sim.worker_of("sleep")
    other = W2 if stuck == W1 else W1
    sim.cancel("sleep")
    sim.clear()
    sim.submit(roots(4))
    assert sim.on(stuck) == set() and len(sim.on(other)) == 2
    for _ in range(4):
        sim.finish(sorted(sim.on(other))[0])
    assert sim.states() == dict.fromkeys(roots(4), "memory")


def test_a_draining_thread_leaves_the_others_of_its_worker_usable():
    sim = Sim({W1: 2})
    sim.submit({"a": []})
    sim.cancel("a")
    assert sim.ws(W1).slot_threads == 1 and sim.ws(W1).min_slots == 2
    sim.submit(roots(5))
    assert len(sim.on(W1)) == 2  # one thread's worth (and one queued behind it)


def test_cancelled_submitted_again_and_cancelled_again_counts_two_threads():
    """The same key on the same worker, twice released while one thread may run it:
    a multiset, emptied by one answer per release, in any order."""
    sim = Sim({W1: 2})
    sim.submit({"k": []})
    sim.cancel("k", sid="c1")
    sim.submit({"k": []}, sid="again")
    assert sim.worker_of("k") == W1
    sim.cancel("k", sid="c2")
    assert sim.ws(W1).draining == {"k": 2} and sim.ws(W1).slot_threads == 0
    sim.drained(W1, "k")
    assert sim.ws(W1).draining == {"k": 1} and sim.ws(W1).slot_threads == 1
    sim.drained(W1, "k")
    assert sim.ws(W1).draining == {} and sim.ws(W1).slot_threads == 2
    sim.drained(W1, "k")  # an answer never asked for is ignored
    assert sim.ws(W1).draining == {} and sim.ws(W1).slot_threads == 2


def test_an_answer_may_come_while_the_key_processes_there_again():
    """Released, then the same key sent to the same worker: the worker answers once
    the new ComputeTask took the running execution over; the new one stays processing."""
    sim = Sim({W1: 2})
    sim.submit({"k": []})
    sim.cancel("k")
    sim.submit({"k": []})
    assert sim.worker_of("k") == W1
    sim.drained(W1, "k")
    assert sim.state("k") == "processing" and sim.ws(W1).draining == {}
    sim.finish("k")
    assert sim.state("k") == "memory"


def test_a_late_result_of_a_released_task_is_stale_and_the_thread_still_drains():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.release("a")
    sim.clear()
    sim.finish("a", worker=W1, sid="late")  # sent before the worker got the release
    assert sim.to_worker(W1) == [FreeKeys(["a"], "late")]
    assert sim.ws(W1).draining == {"a": 1}  # the answer to the release comes next
    sim.drained(W1, "a")
    assert sim.ws(W1) in sim.s.free_workers


def test_a_worker_that_leaves_takes_its_draining_threads_with_it():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": [], "b": []})
    sim.cancel("a", "b")
    assert sim.ws(W1).draining and sim.ws(W2).draining
    sim.remove_worker(W1)
    sim.drained(W1, "a")  # a removed worker's last messages are ignored
    sim.submit(roots(3))
    assert sim.on(W2) == set()  # W2's thread is still draining
    sim.add_worker(W1, 1)  # back, afresh
    assert len(sim.on(W1)) == 2


def test_a_seceded_task_holds_no_slot_so_its_release_drains_nothing():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.s.handle_worker(W1, TaskSeceded("a", "secede"))
    sim.clear()
    sim.cancel("a", sid="cancel")
    assert sim.to_worker(W1) == [FreeKeys(["a"], "cancel")]
    assert sim.ws(W1).draining == {} and sim.ws(W1) in sim.s.free_workers


def test_force_cancel_asks_the_worker_to_interrupt_what_it_releases():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "b": [], "c": ["a"]})
    sim.clear()
    sim.s.handle_client("c", CancelKeys(["a"], "force", force=True))
    msgs = sim.to_worker(W1)
    assert msgs == [ReleaseCompute("a", True, True, "force")]  # "c" was waiting
    assert sim.ws(W1).draining == {"a": 1}
    sim.cancel("b", sid="gently")  # force is per request
    assert sim.to_worker(W1) == [ReleaseCompute("b", True, False, "gently")]


def test_force_cancel_interrupts_a_seceded_task_and_asks_no_answer():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.s.handle_worker(W1, TaskSeceded("a", "secede"))
    sim.clear()
    sim.s.handle_client("c", CancelKeys(["a"], "force", force=True))
    assert sim.to_worker(W1) == [ReleaseCompute("a", False, True, "force")]
    assert sim.ws(W1).draining == {}


def test_force_cancel_does_not_interrupt_what_another_client_wants():
    sim = Sim({W1: 1}, clients=("c", "d"))
    sim.submit({"a": []}, client="c")
    sim.submit({"a": []}, client="d")
    sim.clear()
    sim.s.handle_client("c", CancelKeys(["a"], "force", force=True))
    assert sim.to_worker(W1) == [] and sim.state("a") == "processing"


def test_a_task_whose_thread_is_over_releases_without_draining():
    """A failure to retry and a task the worker could not start: its thread is over."""
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []}, retries={"a": 1})
    where = sim.worker_of("a")
    sim.clear()
    sim.fail("a", sid="boom")
    assert sim.freed(where) == ["a"] and sim.ws(where).draining == {}
    sim.submit({"x": []})
    sim.finish("x")
    sim.submit({"y": ["x"]})
    held = sim.worker_of("y")
    sim.clear()
    sim.s.handle_worker(held, MissingData("y", [], "miss"))
    assert [m for m in sim.to_worker(held) if isinstance(m, FreeKeys)] == [FreeKeys(["y"], "miss")]
    assert sim.ws(held).draining == {}


def test_a_task_with_dependencies_avoids_a_worker_whose_threads_all_drain():
    """Where its dependency is would win, but that worker has no thread to run it."""
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"x": []})
    held = sim.worker_of("x")
    other = W2 if held == W1 else W1
    sim.finish("x", nbytes=10**9)
    sim.submit({"stuck": []}, priority={"stuck": 10})
    if sim.worker_of("stuck") != held:  # put the stuck task where "x" is
        sim.finish("stuck")
        sim.submit({"stuck2": []}, priority={"stuck2": 10})
        stuck = "stuck2"
    else:
        stuck = "stuck"
    assert sim.worker_of(stuck) == held
    sim.cancel(stuck)
    assert sim.ws(held).slot_threads == 0
    sim.submit({"y": ["x"]})
    assert sim.worker_of("y") == other


def test_a_restricted_task_prefers_a_worker_with_a_free_thread():
    sim = Sim({})
    sim.add_worker(W1, 1, resources={"GPU": 1})
    sim.add_worker(W2, 1, resources={"GPU": 1})
    gpu = TaskRestrictions(resources={"GPU": 1})
    sim.submit({"g0": []}, restrictions={"g0": gpu})
    stuck = sim.worker_of("g0")
    sim.cancel("g0")
    sim.submit({"g1": []}, restrictions={"g1": gpu})
    assert sim.worker_of("g1") != stuck


def test_the_release_of_a_dependency_failure_drains_too():
    """A running task erred because its dependency did (its result cannot be sent):
    its thread may still run, so it drains like a release."""
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.finish("a")
    sim.submit({"b": ["a"]})
    assert sim.worker_of("b") == W1
    sim.clear()
    from shoal.protocol.messages import KeyUnserializable

    sim.s.handle_worker(W1, KeyUnserializable("a", "no pickle", "unpickleable"))
    assert sim.states() == {"a": "erred", "b": "erred"}
    assert ReleaseCompute("b", True, False, "unpickleable") in sim.to_worker(W1)
    assert sim.ws(W1).draining == {"b": 1}
    sim.s.handle_worker(W1, ComputeReleased("b", "ended"))
    assert sim.ws(W1).draining == {}
