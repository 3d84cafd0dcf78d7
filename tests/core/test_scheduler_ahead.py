"""Placing a task ahead on the worker computing its dependencies (core/scheduler/ahead.py),
driven with events only: what is sent ahead, and every way it is taken back.

Every scheduler runs with ``validate=True``: the ahead invariants (it waits only on tasks
processing for real on its own worker, and is in that worker's ``ahead`` set) are checked
after each event. The random interleavings are in ``test_scheduler_property.py``.
"""

from __future__ import annotations

from scheduler_harness import W1, W2, Sim

from shoal.core.scheduler.ahead import AHEAD_PER_THREAD
from shoal.protocol.messages import (
    ComputeTask,
    DepInfo,
    FreeKeys,
    KeyErred,
    KeyInMemory,
    MissingData,
    RegisterActor,
    ReleaseCompute,
    StealReply,
    StealRequest,
    TaskRestrictions,
    WorkerStatus,
)


def computes(msgs: list) -> list[ComputeTask]:
    return [msg for msg in msgs if isinstance(msg, ComputeTask)]


def chain() -> Sim:
    """a -> b on one worker; b is sent ahead with a."""
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"])
    return sim


def test_a_dependent_goes_with_its_dependency_and_starts_without_a_round_trip():
    sim = chain()
    assert sim.states() == {"a": "processing", "b": "processing"}
    sent = computes(sim.to_worker(W1))
    assert [c.key for c in sent] == ["a", "b"]  # the dependency first, on one stream
    assert sent[1].deps == [DepInfo("a", 0, [])]  # held nowhere yet: computing there
    assert sim.ws(W1).ahead == {sim.ts("b")} and sim.s.placed_ahead == 1
    assert sim.runnable() == ["a"]
    sim.finish("a")
    assert sim.to_worker(W1) == []  # b is already there: nothing to send
    assert sim.ws(W1).ahead == set() and not sim.ts("b").waiting_on
    sim.finish("b")
    assert sim.states() == {"a": "released", "b": "memory"}
    assert sim.to_worker(W1) == [FreeKeys(["a"], "done-b")]
    assert sim.to_client() == [KeyInMemory("b", None, "int", "done-b", [W1])]


def test_only_one_level_ahead():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"a": [], "b": ["a"], "c": ["b"]}, wanted=["c"])
    assert [c.key for c in computes(sim.to_worker(W1))] == ["a", "b"]
    assert sim.state("c") == "waiting"  # b waits ahead itself: nothing waits on b yet
    sim.finish("a")  # b now runs for real: c follows it
    assert [c.key for c in computes(sim.to_worker(W1))] == ["c"]
    assert sim.ws(W1).ahead == {sim.ts("c")}
    assert sim.run_all() == ["b", "c"]


def test_a_dependent_submitted_while_its_dependency_computes_goes_ahead_at_once():
    """``x = submit(f); y = submit(g, x)``: y comes in a later submission, while x
    runs; it goes ahead then, not a round trip after x finishes."""
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"x": []}, wanted=["x"])
    assert [c.key for c in computes(sim.to_worker(W1))] == ["x"]
    sim.submit({"y": ["x"]}, wanted=["y"])
    sent = computes(sim.to_worker(W1))
    assert [c.key for c in sent] == ["y"] and sent[0].deps == [DepInfo("x", 0, [])]
    assert sim.ws(W1).ahead == {sim.ts("y")}
    sim.finish("x")
    assert sim.to_worker(W1) == []  # y is there already
    assert sim.run_all() == ["y"]


def test_a_dependent_submitted_while_its_dependencies_compute_on_two_workers_waits():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit({"x": [], "z": []}, wanted=["x", "z"])
    assert {sim.worker_of("x"), sim.worker_of("z")} == {W1, W2}
    sim.to_worker(W1), sim.to_worker(W2)
    sim.submit({"y": ["x", "z"]}, wanted=["y"])
    assert computes(sim.to_worker(W1)) == computes(sim.to_worker(W2)) == []
    assert sim.state("y") == "waiting" and sim.s.placed_ahead == 0
    sim.finish("x")  # what is left computes on one worker, with x to fetch: ahead now
    assert [c.key for c in computes(sim.to_worker(sim.worker_of("z")))] == ["y"]


def test_a_dependent_submitted_while_its_dependency_is_queued_waits_for_it():
    sim = Sim(workers={W1: 1}, ahead=True)
    roots = {f"r{i}": [] for i in range(10)}
    sim.submit(roots, wanted=list(roots))
    assert sim.state("r9") == "queued"
    sim.to_worker(W1)
    sim.submit({"y": ["r9"]}, wanted=["y"])
    assert computes(sim.to_worker(W1)) == [] and sim.state("y") == "waiting"
    assert sim.s.placed_ahead == 0


def test_a_dependent_of_tasks_on_two_workers_is_not_sent_ahead():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit({"a": [], "b": [], "c": ["a", "b"]}, wanted=["c"])
    assert {sim.worker_of("a"), sim.worker_of("b")} == {W1, W2}
    assert sim.state("c") == "waiting" and sim.s.placed_ahead == 0


def test_once_one_side_of_a_reduction_is_done_it_goes_ahead_to_the_other():
    """The aggregate of inputs on two workers: once those on one are in memory (a
    little data), it goes ahead to the worker computing the rest, which fetches the
    done ones meanwhile instead of after a round trip through the scheduler."""
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit({"a": [], "b": [], "c": ["a", "b"]}, wanted=["c"])
    first, last = sim.worker_of("a"), sim.worker_of("b")
    sim.clear()
    sim.finish("a", nbytes=80_000)  # x.T @ x's partial of 100 x 100 floats
    assert sim.state("c") == "processing" and sim.worker_of("c") == last
    assert sim.ws(last).ahead == {sim.ts("c")} and sim.s.placed_ahead == 1
    (sent,) = computes(sim.to_worker(last))
    assert sorted(sent.deps, key=lambda d: d.key) == [
        DepInfo("a", 80_000, [first]),  # fetched from there now
        DepInfo("b", 0, []),  # computing here
    ]
    assert computes(sim.to_worker(first)) == []
    sim.finish("b")
    assert sim.ws(last).ahead == set() and sim.to_worker(last) == []  # c is there already
    sim.finish("c")
    assert sim.state("c") == "memory"


def test_much_data_elsewhere_keeps_a_task_from_going_ahead():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit({"a": [], "b": [], "c": ["a", "b"]}, wanted=["c"])
    sim.finish("a", nbytes=10_000_000)  # 0.1 s at the assumed bandwidth
    assert sim.state("c") == "waiting" and sim.s.placed_ahead == 0
    sim.finish("b")
    assert sim.state("c") == "processing" and not sim.ts("c").waiting_on  # placed as usual


PART = 20_000_000  # bytes: a dataframe partition, 0.2 s at the assumed bandwidth


def partitions(
    on: dict[str, str], done: list[str], *, queued: int = 0, beyond_latency: bool = True
) -> Sim:
    """``part-*`` pinned to their workers (``on``), ``concat`` of them all, the parts in
    ``done`` finished with ``PART`` bytes each; ``queued`` more tasks pinned behind the
    last part's worker. Every duration is 10 ms: the queues are short."""
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.s.ahead_beyond_latency = beyond_latency
    pinned = {key: TaskRestrictions([w]) for key, w in on.items()}
    sim.submit(
        {**{key: [] for key in on}, "concat": list(on)},
        wanted=["concat"],
        restrictions=pinned,
        durations=dict.fromkeys([*on, "concat"], 0.01),
        group=dict.fromkeys(on, "part"),  # one layer, as a dataframe's partitions
    )
    if queued:
        last = on[max(on)]
        sim.submit(
            {f"q-{i}": [] for i in range(queued)},
            restrictions={f"q-{i}": TaskRestrictions([last]) for i in range(queued)},
            durations={f"q-{i}": 0.01 for i in range(queued)},
        )
    for key in done:
        sim.finish(key, nbytes=PART, duration=0.01)
    return sim


def test_a_concatenation_goes_ahead_where_it_moves_no_more_than_it_would_elsewhere():
    """``df.merge(small).compute()``'s last step: four partitions, two on each worker,
    three done. Once the fourth is done, W1 would need 40 MB moved (the part W2 has, and
    the fourth, estimated at its group's mean), as many as W2 needs now: it goes ahead
    to W2, which fetches while it computes the fourth, instead of after a round trip."""
    on = {"part-0": W1, "part-1": W1, "part-2": W2, "part-3": W2}
    sim = partitions(on, ["part-0", "part-1", "part-2"])
    assert sim.state("part-3") == "processing" and sim.worker_of("part-3") == W2
    assert sim.state("concat") == "processing" and sim.worker_of("concat") == W2
    assert sim.ws(W2).ahead == {sim.ts("concat")}
    (sent,) = [c for c in computes(sim.to_worker(W2)) if c.key == "concat"]
    assert sorted(sent.deps, key=lambda d: d.key) == [
        DepInfo("part-0", PART, [W1]),  # fetched while part-3 computes
        DepInfo("part-1", PART, [W1]),
        DepInfo("part-2", PART, [W2]),
        DepInfo("part-3", 0, []),  # computing here
    ]
    sim.finish("part-3", nbytes=PART)
    assert sim.ws(W2).ahead == set() and not sim.ts("concat").waiting_on
    sim.finish("concat")
    assert sim.state("concat") == "memory"


def test_switched_off_only_what_moves_within_the_latency_goes_ahead():
    on = {"part-0": W1, "part-1": W1, "part-2": W2, "part-3": W2}
    # (the switch of benchmarks/packing_ab.py --rule ahead-data)
    sim = partitions(on, ["part-0", "part-1", "part-2"], beyond_latency=False)
    assert sim.state("concat") == "waiting" and sim.s.placed_ahead == 0


def test_much_data_elsewhere_keeps_a_task_with_dependents_waiting():
    """The same four partitions, the concatenation feeding one more task: pinned early,
    it would take the choice of a less loaded worker away from the work after it."""
    on = {"part-0": W1, "part-1": W1, "part-2": W2, "part-3": W2}
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit(
        {**{key: [] for key in on}, "concat": list(on), "after": ["concat"]},
        wanted=["after"],
        restrictions={key: TaskRestrictions([w]) for key, w in on.items()},
        durations=dict.fromkeys([*on, "concat", "after"], 0.01),
        group=dict.fromkeys(on, "part"),
    )
    for key in ("part-0", "part-1", "part-2"):
        sim.finish(key, nbytes=PART, duration=0.01)
    assert sim.state("concat") == "waiting" and sim.s.placed_ahead == 0


def test_a_task_waits_when_another_worker_would_move_less_once_ready():
    """Three partitions done on W1, the fourth computing on W2: W2 would fetch 60 MB,
    W1 only the fourth (20 MB, estimated): placed as usual once ready."""
    on = {"part-0": W1, "part-1": W1, "part-2": W1, "part-3": W2}
    sim = partitions(on, ["part-0", "part-1", "part-2"])
    assert sim.state("part-3") == "processing" and sim.state("concat") == "waiting"
    assert sim.s.placed_ahead == 0
    sim.finish("part-3", nbytes=PART)
    assert sim.state("concat") == "processing" and sim.worker_of("concat") == W1


def test_an_unknown_size_counts_as_nothing_so_much_data_elsewhere_waits():
    """Nothing of the computing input's group is in memory: its size is taken as 0, so
    W1 (which holds the 20 MB done) would need nothing moved: no going ahead to W2."""
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit(
        {"a": [], "b": [], "c": ["a", "b"]},
        wanted=["c"],
        restrictions={"a": TaskRestrictions([W1]), "b": TaskRestrictions([W2])},
        durations=dict.fromkeys("abc", 0.01),
    )
    sim.finish("a", nbytes=PART, duration=0.01)
    assert sim.state("c") == "waiting" and sim.s.placed_ahead == 0


def test_much_data_does_not_go_ahead_to_a_worker_with_a_queue():
    """The same four partitions, but W2 has more queued behind the fourth: what it
    would fetch would sit there unused meanwhile, so the concatenation waits."""
    on = {"part-0": W1, "part-1": W1, "part-2": W2, "part-3": W2}
    sim = partitions(on, ["part-0", "part-1", "part-2"], queued=3)
    assert not sim.s._is_free(sim.ws(W2))
    assert sim.state("concat") == "waiting" and sim.s.placed_ahead == 0


def test_nothing_goes_ahead_to_a_worker_with_a_queue_when_an_input_is_done():
    """A graph that keeps the workers busy gains nothing from it: a task waiting on a
    worker with a queue stays waiting when another of its inputs comes into memory."""
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit({"a": [], "b": [], "c": ["a", "b"]}, wanted=["c"])
    busy = sim.worker_of("b")
    pinned = {f"q-{i}": TaskRestrictions([busy]) for i in range(3)}
    sim.submit({f"q-{i}": [] for i in range(3)}, restrictions=pinned)  # 0.5 s each
    assert not sim.s._is_free(sim.ws(busy))
    sim.finish("a")
    assert sim.state("c") == "waiting" and sim.s.placed_ahead == 0


def test_only_with_little_data_elsewhere():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.scatter(W1, {"x": 8})
    sim.scatter(W2, {"y": 1_000_000})
    sim.scatter(W1, {"z": 8})
    sim.scatter(W2, {"z": 8})  # a replica on each
    sim.submit({"a": [], "b": ["a", "x", "y"], "c": ["a", "z"]}, wanted=["b", "c"])
    w = sim.worker_of("a")
    # b needs a megabyte on the other worker: placed once ready, where it is best then
    assert sim.state("b") == "waiting"
    assert sim.worker_of("c") == w  # z is in memory there too
    (sent,) = [c for c in computes(sim.to_worker(w)) if c.key == "c"]
    assert sorted(sent.deps, key=lambda d: d.key) == [
        DepInfo("a", 0, []),
        DepInfo("z", 8, [W1, W2]),
    ]


def test_a_little_data_elsewhere_is_fetched_while_the_rest_computes():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.scatter(W2, {"y": 8})
    sim.submit({"a": [], "b": ["a", "y"]}, wanted=["b"], restrictions={"a": TaskRestrictions([W1])})
    assert sim.worker_of("b") == W1 and sim.ts("b") in sim.ws(W1).ahead
    (sent,) = [c for c in computes(sim.to_worker(W1)) if c.key == "b"]
    assert sorted(sent.deps, key=lambda d: d.key) == [DepInfo("a", 0, []), DepInfo("y", 8, [W2])]


def test_at_most_two_per_thread_ahead_on_a_worker():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"a": [], **{f"d-{i}": ["a"] for i in range(5)}})
    assert len(sim.ws(W1).ahead) == AHEAD_PER_THREAD == 2
    assert sum(sim.state(f"d-{i}") == "waiting" for i in range(5)) == 3
    sim.finish("a")  # the rest are placed as usual
    assert all(sim.state(f"d-{i}") == "processing" for i in range(5))
    assert sorted(sim.run_all()) == [f"d-{i}" for i in range(5)]


def test_tasks_ahead_hold_no_slot():
    """Root tasks still go to a worker whose tasks ahead only wait."""
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"a": [], "b": ["a"], "r1": [], "r2": [], "r3": []})
    ws = sim.ws(W1)
    assert ws.ahead == {sim.ts("b")} and sim.on(W1) == {"a", "b", "r1"}
    sim.finish("r1")  # a thread's worth of slots is free again, b aside
    assert sim.on(W1) == {"a", "b", "r2"}
    assert len(ws.processing) - len(ws.ahead) == ws.min_slots


def test_a_dependency_that_errs_errs_the_task_ahead_and_the_worker_drops_it():
    sim = chain()
    sim.clear()
    sim.fail("a")
    assert sim.state("b") == "erred" and sim.state("a") != "processing"
    # b never held a thread: no ComputeReleased owed, the worker just drops it
    assert sim.to_worker(W1) == [FreeKeys(["b"], "erred-a")]
    assert sim.ws(W1).draining == {} and sim.ws(W1).processing == set()
    (note,) = sim.to_client()
    assert isinstance(note, KeyErred) and note.key == "b" and note.blamed == "a"


def test_a_dependency_cancelled_takes_the_task_ahead_back():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"a": [], "b": ["a"]}, wanted=["a", "b"])
    sim.clear()
    sim.cancel("a")  # with everything built on it
    assert sim.states() == {}
    freed = sim.to_worker(W1)
    assert ReleaseCompute("a", True, False, "cancel") in freed  # a ran: its thread drains
    assert FreeKeys(["b"], "cancel") in freed  # b held none
    assert sim.ws(W1).draining == {"a": 1}


def test_the_task_ahead_released_by_its_client_leaves_the_dependency_running():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"a": [], "b": ["a"]}, wanted=["a", "b"])
    sim.clear()
    sim.release("b")
    assert sim.states() == {"a": "processing"}
    assert sim.to_worker(W1) == [FreeKeys(["b"], "release")]
    assert sim.ws(W1).draining == {} and sim.ws(W1).ahead == set()
    sim.finish("a")
    assert sim.states() == {"a": "memory"}


def test_the_worker_dying_puts_both_back_and_blames_only_what_ran():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.s.allowed_failures = 0  # one death under a task that ran there errs it
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"])
    w = sim.worker_of("a")
    assert sim.worker_of("b") == w
    other = W2 if w == W1 else W1
    sim.clear()
    sim.remove_worker(w)
    # a ran there (KilledWorker); b never started: not suspected, erred for a
    assert sim.state("b") == "erred" and sim.ts("b").exception_blame is sim.ts("a")
    assert sim.ts("a") in sim.s.suspicious and sim.ts("b") not in sim.s.suspicious
    assert sim.to_worker(other) == []


def test_the_worker_dying_reschedules_the_pair_elsewhere():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"])
    w = sim.worker_of("a")
    other = W2 if w == W1 else W1
    sim.clear()
    sim.remove_worker(w)
    assert sim.states() == {"a": "processing", "b": "processing"}
    assert sim.worker_of("a") == sim.worker_of("b") == other
    assert sim.ts("b") in sim.ws(other).ahead
    assert sim.run_all() == ["a", "b"]
    assert sim.state("b") == "memory"


def test_a_lost_dependency_in_memory_takes_the_task_ahead_back():
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.scatter(W1, {"x": 8})
    on = {k: TaskRestrictions([w]) for k, w in (("a", W1), ("c", W2))}
    sim.submit({"a": [], "b": ["a", "x"], "c": ["x"]}, wanted=["b", "c"], restrictions=on)
    assert sim.ts("b") in sim.ws(W1).ahead and sim.worker_of("c") == W2
    sim.clear()
    # W2 finds no copy of x on W1: x is lost (scattered: not recomputable)
    sim.s.handle_worker(W2, MissingData("c", ["x"], "miss", [[W1]]))
    assert sim.state("b") == "erred" and sim.state("c") == "erred"
    assert FreeKeys(["b"], "miss") in sim.to_worker(W1)
    assert sim.ws(W1).ahead == set()


def test_a_task_ahead_is_not_stolen_nor_what_it_waits_on():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.scatter(W1, {"x": 8})
    # a and b come last: the first a busy worker would give away
    sim.submit({**{f"t-{i}": ["x"] for i in range(4)}, "a": ["x"], "b": ["a"]})
    assert sim.ws(W1).ahead == {sim.ts("b")}
    for k in ("t-0", "a", "b"):
        sim.ts(k).prefix.add_duration(1.0)
    sim.add_worker(W2, 1)
    sim.clear()
    assert sim.s.balance("balance") == 1
    (req,) = [m for m in sim.to_worker(W1) if isinstance(m, StealRequest)]
    assert req.key == "t-3"


def test_no_task_waits_ahead_on_a_dependency_with_a_steal_request_out():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.s.ahead_per_thread = 0  # nothing ahead while the steal is set up
    sim.scatter(W1, {"x": 8})
    keys = ["a", "r1", "r2", "r3"]
    sim.submit(dict.fromkeys(keys, ["x"]), wanted=keys)
    for k in keys:
        sim.ts(k).prefix.add_duration(1.0)
    sim.add_worker(W2, 1)
    sim.clear()
    sim.s.balance("balance")
    (req,) = [m for m in sim.to_worker(W1) if isinstance(m, StealRequest)]
    sim.s.ahead_per_thread = AHEAD_PER_THREAD
    sim.submit({"b": [req.key]}, wanted=["b"], sid="later")
    sim.s._ahead_from.append(sim.ts(req.key))  # as if it had just started
    sim.s._done("consider")
    assert sim.state("b") == "waiting"  # not sent ahead of a task that may move
    sim.s.handle_worker(W1, StealReply(req.key, req.run_id, True, "stolen"))
    assert sim.worker_of(req.key) == W2
    assert sim.ts("b") in sim.ws(W2).ahead  # it follows the task where it now runs
    assert sorted(sim.run_all()) == sorted([*keys, "b"])


def test_nothing_is_sent_ahead_to_a_paused_worker_and_what_is_there_stays():
    sim = chain()
    sim.s.handle_worker(W1, WorkerStatus("paused", "mem-high"))
    assert sim.worker_of("b") == W1 and sim.ts("b") in sim.ws(W1).ahead
    sim.submit({"c": ["a"]}, wanted=["c"], sid="more")
    assert sim.state("c") == "waiting"
    sim.finish("a")  # c must wait for a runnable worker now; b is there already
    assert sim.state("b") == "processing" and sim.ws(W1).ahead == set()


def test_an_early_result_of_a_task_ahead_is_not_taken():
    sim = chain()
    sim.finish("b")  # cannot happen (the worker reports in order): ignored
    assert sim.state("b") == "processing" and sim.ts("b").waiting_on
    assert sim.run_all() == ["a", "b"]


def test_an_actor_is_not_sent_ahead():
    sim = Sim(workers={W1: 1}, ahead=True)
    sim.submit({"r1": [], "r2": []})  # W1's slots are taken: a waits in the queue
    sim.submit({"a": [], "b": ["a"], "c": ["a"]}, wanted=["b", "c"], sid="more")
    assert sim.state("a") == "queued"
    sim.s.handle_client("c", RegisterActor(["b"], "actor"))
    sim.finish("r1")  # a starts: c follows it, the actor b waits for its turn
    assert sim.worker_of("a") == W1 and sim.ws(W1).ahead == {sim.ts("c")}
    assert sim.state("b") == "waiting"
