"""The scheduler's part of the P2P shuffle, driven with events only (no network):
start, participants and the map of output partitions, restrictions, restarts when a
participant dies, bounded attempts, pins and events. Every scheduler validates its
invariants after each event (scheduler_harness.Sim)."""

from __future__ import annotations

import pytest
from scheduler_harness import ARGS, EXC, FUNCS, W1, W2, W3, Sim

from shoal.protocol.messages import (
    ComputeTask,
    KeyErred,
    ShuffleForget,
    ShuffleMark,
    ShuffleRestart,
    ShuffleRun,
    ShuffleStats,
    SubmitTasks,
    TaskErred,
    TaskSpec,
)
from shoal.shuffle._plan import owner

SID = "abc123"


def shuffle_graph(ninputs: int = 3, nout: int = 4, shuffle_id: str = SID) -> list[TaskSpec]:
    """("in", i) -> ("t", i) transfers -> "b" barrier -> ("u", p) unpacks."""
    specs = [TaskSpec(("in", i), "f", ARGS) for i in range(ninputs)]
    specs += [
        TaskSpec(("t", i), "f", ARGS, [("in", i)], shuffle=ShuffleMark(shuffle_id, "transfer", i))
        for i in range(ninputs)
    ]
    transfers = [("t", i) for i in range(ninputs)]
    specs.append(TaskSpec("b", "f", ARGS, transfers, shuffle=ShuffleMark(shuffle_id, "barrier")))
    specs += [
        TaskSpec(("u", p), "f", ARGS, ["b"], shuffle=ShuffleMark(shuffle_id, "unpack", p))
        for p in range(nout)
    ]
    return specs


def submit(sim: Sim, ninputs: int = 3, nout: int = 4) -> None:
    wanted = [("u", p) for p in range(nout)]
    sim.s.handle_client("c", SubmitTasks(shuffle_graph(ninputs, nout), wanted, FUNCS, "submit"))


def events(sim: Sim, action: str | None = None) -> list[dict]:
    found = [data for _, data in sim.s.get_events("p2p")["p2p"]]
    return [e for e in found if action is None or e["action"] == action]


def computes(sim: Sim, address: str) -> list[ComputeTask]:
    return [msg for msg in sim.to_worker(address) if isinstance(msg, ComputeTask)]


def finish_inputs(sim: Sim, ninputs: int = 3) -> None:
    for i in range(ninputs):
        sim.finish(("in", i))


def finish_transfers(sim: Sim, ninputs: int = 3) -> None:
    for i in range(ninputs):
        sim.finish(("t", i))


def two_workers() -> Sim:
    return Sim(workers={W1: 1, W2: 1})


def pinned_by_shuffle(sim: Sim, address: str) -> bool:
    return any(pin.owner == f"shuffle:{SID}" for pin in sim.s.pins_of(address))


# --- start -------------------------------------------------------------------------------


def test_a_shuffle_starts_when_its_first_transfer_is_ready():
    sim = two_workers()
    submit(sim)
    assert events(sim) == []  # inputs still running: nothing chosen yet
    assert sim.state(("t", 0)) == "waiting"
    sim.finish(("in", 0))
    (start,) = events(sim, "start")
    assert start["participants"] == [W1, W2]
    assert start["partitions"] == 4 and start["inputs"] == 3
    msgs = [m for a in (W1, W2) for m in computes(sim, a) if m.key == ("t", 0)]
    assert [m.shuffle for m in msgs] == [ShuffleRun(SID, start["run"], [W1, W2])]


def test_unpacks_run_on_the_owner_of_their_partition():
    sim = two_workers()
    submit(sim, nout=5)
    finish_inputs(sim)
    finish_transfers(sim)
    sim.finish("b")
    participants = events(sim, "start")[0]["participants"]
    sim.run_all()
    for p in range(5):
        assert sim.state(("u", p)) == "memory"
        assert sim.holds(owner(p, participants)) >= {("u", p)}


def test_unpacks_wait_for_a_free_thread_and_give_way_to_root_tasks_first_in_order():
    """Unpacks are not all sent to their owners at once (where they would run before
    root tasks that come first, e.g. the other side of a merge, and all hold their
    outputs): they take free threads, in priority order with the root tasks."""
    sim = two_workers()
    submit(sim, ninputs=2, nout=8)
    finish_inputs(sim, 2)
    finish_transfers(sim, 2)
    sim.finish("b")
    unpacks = [("u", p) for p in range(8)]
    sent = [k for k in unpacks if sim.state(k) == "processing"]
    assert len(sent) == 4  # two per one-thread worker (a thread and its next task)
    assert all(sim.state(k) == "queued" for k in unpacks if k not in sent)
    others = [("other", i) for i in range(3)]
    specs = [TaskSpec(k, "f", ARGS, priority=1) for k in others]  # before the unpacks
    sim.s.handle_client("c", SubmitTasks(specs, others, FUNCS, "later"))
    assert all(sim.state(k) == "queued" for k in others)  # no thread is free
    sim.finish(sent[0])
    assert sim.state(others[0]) == "processing"  # the freed thread goes to a root task
    assert sum(sim.state(k) == "processing" for k in unpacks) == 3
    sim.run_all()
    assert all(sim.state(k) == "memory" for k in unpacks + others)


def test_a_worker_that_joins_mid_shuffle_takes_no_part():
    sim = two_workers()
    submit(sim, ninputs=6)
    sim.finish(("in", 0))
    sim.add_worker(W3, 4)
    sim.run_all()
    assert all(sim.state(("u", p)) == "memory" for p in range(4))
    assert W3 not in {ts.processing_on for ts in sim.s.tasks.values()}
    assert not [m for m in computes(sim, W3) if m.shuffle is not None]
    assert len(events(sim, "finish")) == 1


def test_graphs_without_shuffles_carry_nothing_of_them():
    sim = two_workers()
    sim.submit({"a": [], "b": ["a"]})
    sim.run_all()
    assert sim.s.shuffle_tasks == {} and sim.s.shuffles == {}
    assert all(m.shuffle is None for a in (W1, W2) for m in computes(sim, a))


def test_an_unknown_role_is_refused():
    sim = two_workers()
    spec = TaskSpec("x", "f", ARGS, shuffle=ShuffleMark(SID, "teleport"))
    with pytest.raises(ValueError, match="unknown shuffle role 'teleport'"):
        sim.s.handle_client("c", SubmitTasks([spec], ["x"], FUNCS, "submit"))


# --- finish, failure, forget --------------------------------------------------------


def test_finish_reports_bytes_moved_and_spilled_and_tells_workers():
    sim = two_workers()
    submit(sim)
    finish_inputs(sim)
    run = events(sim, "start")[0]["run"]
    sim.s.handle_worker(W1, ShuffleStats(SID, run, sent=1000, spilled=10))
    sim.s.handle_worker(W2, ShuffleStats(SID, run, sent=500, spilled=0))
    sim.clear()
    sim.run_all()
    (fin,) = events(sim, "finish")
    assert fin["bytes_moved"] == 1500 and fin["bytes_spilled"] == 10
    assert fin["run"] == run and fin["restarts"] == 0
    for a in (W1, W2):  # each participant drops the run's data
        forgets = [m for m in sim.to_worker(a) if isinstance(m, ShuffleForget)]
        assert [(m.id, m.run) for m in forgets] == [(SID, run)]
    assert not sim.s.shuffles[SID].running


def test_a_failing_transfer_fails_the_shuffle_and_every_unpack():
    sim = two_workers()
    submit(sim)
    finish_inputs(sim)
    sim.fail(("t", 1))
    (failed,) = events(sim, "failed")
    assert "('t', 1)" in failed["why"]
    assert all(sim.state(("u", p)) == "erred" for p in range(4))
    assert not sim.s.shuffles[SID].running


def test_releasing_the_shuffle_forgets_it():
    sim = two_workers()
    submit(sim)
    finish_inputs(sim)
    sim.clear()
    sim.release(*[("u", p) for p in range(4)])
    assert SID not in sim.s.shuffles and sim.s.shuffle_tasks == {}
    assert events(sim, "forgotten")
    forgets = [m for a in (W1, W2) for m in sim.to_worker(a) if isinstance(m, ShuffleForget)]
    assert len(forgets) == 2


def test_an_unpack_lost_after_the_finish_starts_a_new_run():
    sim = two_workers()
    submit(sim, nout=2)
    sim.run_all()
    first = events(sim, "start")[0]["run"]
    holder = sim.s.tasks[("u", 1)].who_has[0].address
    sim.remove_worker(holder)  # its result is lost: recomputed by a new run
    sim.run_all()
    starts = events(sim, "start")
    assert len(starts) == 2 and starts[1]["run"] > first
    assert starts[1]["participants"] == [a for a in (W1, W2) if a != holder]
    assert sim.state(("u", 0)) == sim.state(("u", 1)) == "memory"
    assert len(events(sim, "finish")) == 2


# --- restarts -------------------------------------------------------------------------


def test_a_participant_that_dies_restarts_the_shuffle_on_the_others():
    sim = Sim(workers={W1: 1, W2: 1, W3: 1})
    submit(sim, ninputs=4, nout=6)
    finish_inputs(sim, 4)
    first = events(sim, "start")[0]["run"]
    sim.finish(("t", 0))
    sim.clear()
    sim.remove_worker(W2, sid="w2-died")
    (restart,) = events(sim, "restart")
    assert W2 in restart["why"] and restart["run"] > first
    assert restart["participants"] == [W1, W3]
    # the survivors drop the older run; every transfer runs again in the new run
    for a in (W1, W3):
        msgs = sim.to_worker(a)
        assert ShuffleRestart(SID, restart["run"], "w2-died") in msgs
        for msg in msgs:
            if isinstance(msg, ComputeTask):
                assert msg.shuffle == ShuffleRun(SID, restart["run"], [W1, W3])
    # (a transfer whose input was lost with W2 waits for it to be computed again)
    # (or waits for a free thread: "queued")
    assert all(sim.state(("t", i)) in ("processing", "queued", "waiting") for i in range(4))
    assert {sim.state(("t", i)) for i in range(4) if sim.state(("in", i)) == "memory"} <= {
        "processing",
        "queued",
    }
    sim.run_all()
    for p in range(6):
        assert sim.state(("u", p)) == "memory"
        holder = sim.s.tasks[("u", p)].who_has[0].address
        assert holder == owner(p, [W1, W3])
    assert len(events(sim, "finish")) == 1


def test_a_restart_replaces_unpacks_not_done_and_keeps_those_done():
    sim = two_workers()
    submit(sim, nout=4)
    finish_inputs(sim)
    finish_transfers(sim)
    sim.finish("b")
    done_on_w1 = [("u", p) for p in range(4) if owner(p, [W1, W2]) == W1]
    for key in done_on_w1:
        sim.finish(key)
    running_on_w2 = sorted(sim.on(W2), key=repr)
    assert running_on_w2
    sim.remove_worker(W2)
    assert all(sim.state(k) == "memory" for k in done_on_w1)
    assert events(sim, "restart")[0]["participants"] == [W1]
    sim.run_all()
    assert all(sim.state(("u", p)) == "memory" for p in range(4))


def test_restarts_are_bounded_then_every_unpack_errs_saying_why():
    sim = Sim(workers={W1: 1, W2: 1, W3: 1})
    sim.s.shuffle_max_restarts = 1
    submit(sim)
    finish_inputs(sim)
    sim.remove_worker(W3)
    assert len(events(sim, "restart")) == 1
    sim.clear()
    sim.remove_worker(W2)
    (failed,) = events(sim, "failed")
    assert "restarted 1 times" in failed["why"] and W2 in failed["why"]
    assert all(sim.state(("u", p)) == "erred" for p in range(4))
    errs = [m for m in sim.to_client() if isinstance(m, KeyErred)]
    assert {m.key for m in errs} == {("u", p) for p in range(4)}
    assert not sim.s.shuffles[SID].running


def test_with_every_participant_gone_the_shuffle_waits_for_a_worker():
    sim = two_workers()
    submit(sim)
    finish_inputs(sim)
    sim.remove_worker(W1)
    sim.remove_worker(W2)
    assert not sim.s.shuffles[SID].running
    sim.add_worker(W3)
    sim.run_all()
    starts = events(sim, "start")
    assert starts[-1]["participants"] == [W3]
    assert all(sim.state(("u", p)) == "memory" for p in range(4))


def test_a_result_of_an_older_run_is_ignored():
    sim = Sim(workers={W1: 1, W2: 1, W3: 1})
    submit(sim)
    finish_inputs(sim)
    old = {k: sim.worker_of(("t", k)) for k in range(3)}
    sim.remove_worker(W3)
    sim.drain_all()
    # a transfer of the first run that ends now does not count for the new run
    survivor = next(a for k, a in old.items() if a != W3)
    key = next(("t", k) for k, a in old.items() if a == survivor)
    sim.s.handle_worker(survivor, TaskErred(key, EXC, "", 0.0, 0.0, "late", run_id=1))
    assert sim.state(key) in ("processing", "queued") and not events(sim, "failed")


# --- pins (the core's pins API) -----------------------------------------------------


def test_participants_are_pinned_until_the_shuffle_finishes():
    sim = Sim(workers={W1: 1, W2: 1})
    submit(sim)
    finish_inputs(sim)
    assert pinned_by_shuffle(sim, W1) and pinned_by_shuffle(sim, W2)
    sim.run_all()
    assert not pinned_by_shuffle(sim, W1) and not pinned_by_shuffle(sim, W2)


def test_pins_follow_a_restart_and_go_when_it_fails_or_is_forgotten():
    sim = Sim(workers={W1: 1, W2: 1, W3: 1})
    sim.s.shuffle_max_restarts = 1
    submit(sim)
    finish_inputs(sim)
    sim.remove_worker(W3)
    assert pinned_by_shuffle(sim, W1) and pinned_by_shuffle(sim, W2)
    sim.remove_worker(W2)
    assert not pinned_by_shuffle(sim, W1)
    sim2 = Sim(workers={W1: 4})
    submit(sim2)
    finish_inputs(sim2)
    assert pinned_by_shuffle(sim2, W1)
    sim2.release(*[("u", p) for p in range(4)])
    assert not pinned_by_shuffle(sim2, W1)


def test_a_shuffle_started_again_finishes_only_when_all_its_unpacks_are_done_again():
    sim = Sim(workers={W1: 2})
    submit(sim, ninputs=1, nout=2)
    sim.run_all()
    sim.remove_worker(W1)  # every result is lost: the shuffle runs again from scratch
    sim.add_worker(W2, 2)
    sim.finish(("in", 0))
    sim.finish(("t", 0))
    sim.finish("b")
    sim.finish(("u", 0))
    assert sim.s.shuffles[SID].running  # ("u", 1) still to come
    assert pinned_by_shuffle(sim, W2)
    sim.finish(("u", 1))
    assert [e["action"] for e in events(sim)][-1] == "finish"
    assert len(events(sim, "finish")) == 2 and not pinned_by_shuffle(sim, W2)
