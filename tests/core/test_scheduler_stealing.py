"""Work stealing in the scheduler state machine, with no network: an idle worker gets a
queued task from a busy one only when the busy one says it had not started ("ok"), and
only when moving it is cheap; a "too late" answer, or an answer about an assignment that
ended meanwhile, changes nothing; while every worker is busy nothing is asked."""

from __future__ import annotations

from scheduler_harness import W1, W2, W3, Sim

from shoal.core.comm import RecordingComm
from shoal.core.scheduler.state import SchedulerState
from shoal.protocol.messages import ComputeTask, Key, StealReply, StealRequest, TaskRestrictions


def requests(sim: Sim, address: str) -> list[StealRequest]:
    return [msg for msg in sim.to_worker(address) if isinstance(msg, StealRequest)]


def reply(sim: Sim, victim: str, req: StealRequest, ok: bool) -> None:
    sim.s.handle_worker(victim, StealReply(req.key, req.run_id, ok, f"steal-reply-{req.key}"))


def crowded(nbytes: int = 8, n: int = 4, restrictions: TaskRestrictions | None = None) -> Sim:
    """W1 (one thread) processes ``n`` tasks that need "x", held there; then W2 joins."""
    sim = Sim(workers={W1: 1})
    sim.scatter(W1, {"x": nbytes})
    dag: dict[Key, list[Key]] = {f"t-{i}": ["x"] for i in range(n)}
    r = dict.fromkeys(dag, restrictions) if restrictions is not None else None
    sim.submit(dag, restrictions=r)
    assert sim.on(W1) == set(dag)
    sim.add_worker(W2, 1)
    sim.clear()
    return sim


def test_an_idle_worker_gets_a_queued_task_the_busy_one_gives_back():
    sim = crowded()
    assert sim.s.balance("balance-1") == 1  # W2 has one thread
    (req,) = requests(sim, W1)
    # the last to run on W1 (its worker runs lower priorities first)
    assert req.key == max(sim.on(W1), key=lambda k: sim.ts(k).priority)
    assert sim.s.balance("balance-2") == 0  # asked already: W2's thread is spoken for
    reply(sim, W1, req, ok=True)
    assert sim.computes(W2) == [req.key]
    assert sim.worker_of(req.key) == W2
    assert req.key not in sim.on(W1) and sim.s.steals_done == 1
    done = sim.run_all()
    assert sorted(done) == sorted(f"t-{i}" for i in range(4))  # each ran once
    assert all(sim.state(f"t-{i}") == "memory" for i in range(4))


def test_too_late_changes_nothing():
    sim = crowded()
    sim.s.balance()
    (req,) = requests(sim, W1)
    reply(sim, W1, req, ok=False)
    assert sim.worker_of(req.key) == W1 and sim.to_worker(W2) == []
    assert sim.s.steals_refused == 1 and not sim.s.steals


def test_an_answer_about_an_ended_assignment_is_ignored():
    sim = crowded()
    sim.s.balance()
    (req,) = requests(sim, W1)
    sim.finish(req.key, worker=W1)  # it finished before the request arrived
    reply(sim, W1, req, ok=True)  # (a worker would say too late; even "ok" is ignored)
    assert sim.state(req.key) == "memory" and sim.to_worker(W2) == []
    assert sim.holds(W1) >= {req.key}


def test_the_thief_left_meanwhile_the_task_is_placed_anew():
    sim = crowded()
    sim.add_worker(W3, 1)
    sim.clear()
    assert sim.s.balance() == 2
    reqs = requests(sim, W1)
    sim.remove_worker(W2)
    sim.remove_worker(W3)
    sim.clear()
    for req in reqs:
        reply(sim, W1, req, ok=True)
    for req in reqs:
        assert sim.worker_of(req.key) == W1  # the only worker left
    assert sorted(m.key for m in sim.to_worker(W1) if isinstance(m, ComputeTask)) == sorted(
        r.key for r in reqs
    )
    assert len(sim.run_all()) == 4


def test_nothing_is_asked_while_every_worker_is_busy():
    sim = Sim(workers={W1: 1, W2: 1})
    sim.scatter(W1, {"x": 8})
    sim.scatter(W2, {"y": 8})
    sim.submit({**{f"a-{i}": ["x"] for i in range(3)}, **{f"b-{i}": ["y"] for i in range(3)}})
    assert len(sim.on(W1)) >= 2 and len(sim.on(W2)) >= 2
    sim.clear()
    assert sim.s.balance() == 0
    assert sim.to_worker(W1) == [] and sim.to_worker(W2) == []


def test_a_task_whose_data_costs_more_to_move_than_to_wait_is_not_stolen():
    sim = crowded(nbytes=10**9)  # 10 s at the assumed bandwidth, for a task of 0.5 s
    assert sim.s.balance() == 0 and requests(sim, W1) == []


def test_measured_durations_decide():
    """A move pays when the task would start sooner elsewhere: its transfer takes less
    than the tasks ahead of it on its worker."""
    sim = crowded(nbytes=20 * 10**6)  # 0.2 s to move
    prefix = sim.ts("t-0").prefix
    prefix.add_duration(0.05)  # the last of four waits 3 x 0.05 s: less than the move
    assert sim.s.balance() == 0
    prefix.add_duration(3.95)  # now 2 s on average: worth the move
    assert sim.s.balance() == 1


def test_tiny_tasks_stay():
    sim = crowded()
    sim.ts("t-0").prefix.add_duration(0.001)
    assert sim.s.balance() == 0


def test_strict_restrictions_stay_loose_ones_move():
    strict = crowded(restrictions=TaskRestrictions(workers=[W1]))
    assert strict.s.balance() == 0
    loose = crowded(restrictions=TaskRestrictions(workers=[W1], allow_other_workers=True))
    assert loose.s.balance() == 1


def test_stealing_off():
    sim = Sim(workers={})
    sim.s = SchedulerState(RecordingComm(), validate=True, stealing=False)
    sim.comm = sim.s.comm  # type: ignore[assignment]
    sim.s.add_client("c")
    sim.add_worker(W1, 1)
    sim.scatter(W1, {"x": 8})
    sim.submit({f"t-{i}": ["x"] for i in range(4)})
    sim.add_worker(W2, 1)
    assert sim.s.balance() == 0
