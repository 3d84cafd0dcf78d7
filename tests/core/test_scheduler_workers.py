"""The scheduler state machine: workers leaving, missing and stale data, replicas, the
group and prefix counters, and the checks themselves (InvalidTransition, validate_state).
See ``test_scheduler.py`` for the basics."""

from __future__ import annotations

from collections import Counter

import pytest
from scheduler_harness import ARGS, FUNCS, W1, W2, W3, Sim

from shoal.core.scheduler.model import TASK_STATES
from shoal.core.story import InvalidState, InvalidTransition
from shoal.protocol.messages import (
    ComputeTask,
    DepInfo,
    FreeKeys,
    FunctionDefs,
    KeyInMemory,
    MissingData,
    ReleaseCompute,
    TaskErred,
    TaskFinished,
    WorkerInfo,
)


def busy_holder(nbytes: int = 8) -> Sim:
    """Key "a" in memory on W1 only, W1 busy with two root tasks, "b" (on "a") running on
    the idle W2, which has to fetch "a"."""
    sim = Sim({W1: 1})
    sim.submit({"a": []}, sid="s-a")
    sim.finish("a", nbytes=nbytes)
    sim.submit({"busy-1": [], "busy-2": []}, sid="s-busy")
    sim.add_worker(W2, 1)
    sim.submit({"b": ["a"]}, sid="s-b")
    assert sim.on(W1) == {"busy-1", "busy-2"} and sim.on(W2) == {"b"}
    sim.clear()
    return sim


# --- workers leaving ------------------------------------------------------------------------


def test_processing_tasks_of_a_removed_worker_run_elsewhere():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({f"r-{i}": [] for i in range(4)})
    assert sim.on(W1) == {"r-0", "r-2"} and sim.on(W2) == {"r-1", "r-3"}
    sim.clear()
    sim.remove_worker(W1, sid="gone")
    assert W1 not in sim.s.workers and W1 not in sim.comm.workers  # nothing sent to it
    assert sim.state("r-0") == sim.state("r-2") == "queued"  # W2 has no free slot
    assert [e[1:] for e in sim.s.story("r-0")][-3:] == [
        ("processing", "released", "gone"),
        ("released", "waiting", "gone"),
        ("waiting", "queued", "gone"),
    ]
    sim.finish("r-1")
    assert sim.computes(W2) == ["r-0"]
    sim.finish("r-3")
    assert sim.computes(W2) == ["r-2"]


def test_a_dependent_running_on_a_removed_worker_goes_to_another():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": [], "b": []})
    sim.finish("a", nbytes=10)
    sim.add_keys(W2, {"a": 10})
    sim.submit({"c": ["a"]})
    where = sim.worker_of("c")
    other = W2 if where == W1 else W1
    sim.clear()
    sim.remove_worker(where, sid="gone")
    assert sim.worker_of("c") == other
    assert sim.to_worker(other) == [
        ComputeTask(
            "c",
            "f",
            ARGS,
            sim.ts("c").priority,
            [DepInfo("a", 10, [other])],
            "gone",
            run_id=2,
            client_wants=True,
        )
    ]


def test_replicated_data_survives_its_worker():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=10)
    sim.add_keys(W2, {"a": 10})
    sim.clear()
    sim.remove_worker(W1)
    assert sim.state("a") == "memory"
    assert set(sim.ts("a").who_has) == {sim.ws(W2)}
    assert sim.s.groups["a"].nbytes == 10
    assert sim.to_client() == [] and sim.to_worker(W2) == []


def test_data_only_on_a_removed_worker_is_recomputed_and_dependents_wait_again():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": [], "z": []})
    assert sim.worker_of("a") == W1 and sim.worker_of("z") == W2
    sim.submit({"c": ["a", "z"]})
    sim.finish("a", nbytes=10)
    assert sim.state("c") == "waiting" and set(sim.ts("c").waiting_on) == {sim.ts("z")}
    sim.clear()
    sim.remove_worker(W1, sid="gone")
    assert sim.state("a") == "processing" and sim.worker_of("a") == W2
    assert set(sim.ts("c").waiting_on) == {sim.ts("a"), sim.ts("z")}
    assert sim.computes(W2) == ["a"]
    assert sim.s.groups["a"].nbytes == 0 and sim.s.prefixes["a"].nbytes == 0
    assert [e[1:3] for e in sim.s.story("a")][-4:] == [
        ("memory", "released"),
        ("released", "waiting"),
        ("waiting", "queued"),
        ("queued", "processing"),
    ]
    sim.finish("a", nbytes=10)
    sim.finish("z")
    assert sim.worker_of("c") == W2
    sim.finish("c")
    assert sim.states() == {"a": "memory", "z": "memory", "c": "memory"}


def test_removing_the_holder_of_a_dependency_restarts_its_running_dependent():
    sim = busy_holder()
    sim.remove_worker(W1, sid="gone")
    # "b" cannot fetch "a" any more: it is stopped, and "a" is computed again first
    assert sim.state("b") == "waiting" and set(sim.ts("b").waiting_on) == {sim.ts("a")}
    msgs = sim.to_worker(W2)
    # W2's one thread may still run "b": nothing more goes there until it is free
    assert msgs == [ReleaseCompute("b", True, False, "gone")]
    sim.drained(W2, "b")
    assert sim.computes(W2) == ["a", "busy-1"]  # by priority, 2 slots
    assert sim.state("busy-2") == "queued"
    sim.finish("a", sid="a2")
    # not queued: a task with dependencies goes where they are, at once
    assert sim.to_worker(W2) == [
        ComputeTask(
            "b",
            "f",
            ARGS,
            sim.ts("b").priority,
            [DepInfo("a", 8, [W2])],
            "a2",
            run_id=2,
            client_wants=True,
        )
    ]


def test_chains_lost_with_a_worker_are_recomputed_from_the_bottom():
    """Both links of each chain were only on W1: no "b" may be sent off while its "a"
    still counts as in memory (held nowhere). Found by the property test."""
    sim = Sim({W1: 1, W2: 1})
    chains = 5
    for i in range(chains):
        sim.submit({f"a-{i}": []}, sid=f"sa-{i}")
        assert sim.worker_of(f"a-{i}") == W1
        sim.finish(f"a-{i}")
        sim.submit({f"b-{i}": [f"a-{i}"]}, sid=f"sb-{i}")
        assert sim.worker_of(f"b-{i}") == W1
        sim.finish(f"b-{i}")
    sim.clear()
    sim.remove_worker(W1, sid="gone")
    assert sim.to_worker(W2) == [
        FunctionDefs(FUNCS),  # W2's first task
        ComputeTask(
            "a-0", "f", ARGS, sim.ts("a-0").priority, [], "gone", run_id=2, client_wants=True
        ),
        ComputeTask(
            "a-1", "f", ARGS, sim.ts("a-1").priority, [], "gone", run_id=2, client_wants=True
        ),
    ]
    for i in range(chains):
        assert sim.state(f"b-{i}") == "waiting"
        assert set(sim.ts(f"b-{i}").waiting_on) == {sim.ts(f"a-{i}")}
    sim.run_all()
    assert set(sim.states().values()) == {"memory"}


def test_removing_every_worker_keeps_the_work_for_the_next():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "b": ["a"], "c": []})
    sim.finish("a")
    sim.remove_worker(W1)
    assert sim.states() == {"a": "queued", "b": "waiting", "c": "queued"}
    assert sim.s.free_workers == set()
    sim.add_worker(W2, 1)
    assert sim.computes(W2) == ["a", "c"]
    sim.run_all()
    assert set(sim.states().values()) == {"memory"}


def test_remove_unknown_worker_is_a_no_op_and_duplicates_are_refused():
    sim = Sim()
    sim.remove_worker("tcp://nobody:1")
    with pytest.raises(ValueError, match="already registered"):
        sim.add_worker(W1)


# --- missing data -----------------------------------------------------------------------------


def test_missing_data_recomputes_the_dependency_then_reruns_the_task():
    sim = busy_holder(nbytes=10)
    sim.missing("b", "a", sid="miss")
    # W1's copy is dropped; "a" is computed again (W2 is free) before "b" runs again
    assert sim.to_worker(W1) == [FreeKeys(["a"], "miss")]
    assert sim.to_worker(W2) == [
        FreeKeys(["b"], "miss"),
        ComputeTask("a", "f", ARGS, sim.ts("a").priority, [], "miss", run_id=2, client_wants=True),
    ]
    assert sim.state("a") == "processing" and sim.state("b") == "waiting"
    assert set(sim.ts("a").who_has) == set() and sim.holds(W1) == set()
    assert sim.ws(W1).nbytes == 0
    sim.finish("a", nbytes=10, sid="a2")
    assert sim.to_worker(W2) == [
        ComputeTask(
            "b",
            "f",
            ARGS,
            sim.ts("b").priority,
            [DepInfo("a", 10, [W2])],
            "a2",
            run_id=2,
            client_wants=True,
        )
    ]
    sim.finish("b")
    assert sim.states() == {
        "a": "memory",  # the client wants it
        "b": "memory",
        "busy-1": "processing",
        "busy-2": "processing",
    }


def test_missing_data_for_a_chain_recomputes_it_from_the_bottom():
    sim = Sim({W1: 1})
    sim.submit({"x": []})
    sim.finish("x")
    sim.submit({"y": ["x"]})
    sim.finish("y")
    sim.submit({"busy-1": [], "busy-2": []})
    sim.add_worker(W2, 1)
    sim.submit({"t": ["x", "y"]})
    assert sim.worker_of("t") == W2
    sim.clear()
    sim.missing("t", "y", "x", sid="miss")
    assert sorted(sim.freed(W1)) == ["x", "y"]
    assert sim.to_worker(W2) == [
        FreeKeys(["t"], "miss"),
        ComputeTask("x", "f", ARGS, sim.ts("x").priority, [], "miss", run_id=2, client_wants=True),
    ]
    assert sim.states() == {
        "x": "processing",
        "y": "waiting",
        "t": "waiting",
        "busy-1": "processing",
        "busy-2": "processing",
    }
    sim.finish("x", sid="x2")
    assert sim.to_worker(W2) == [
        ComputeTask(
            "y",
            "f",
            ARGS,
            sim.ts("y").priority,
            [DepInfo("x", 8, [W2])],
            "x2",
            run_id=2,
            client_wants=True,
        )
    ]


def test_missing_data_for_a_key_not_in_memory_only_reruns_the_task():
    sim = busy_holder()
    sim.missing("b", "nonsense", sid="miss")
    assert sim.to_worker(W1) == []
    msgs = sim.to_worker(W2)
    assert msgs[0] == FreeKeys(["b"], "miss")
    assert [m.key for m in msgs[1:] if isinstance(m, ComputeTask)] == ["b"]


def test_missing_data_never_drops_the_reporters_own_copy():
    sim = busy_holder()
    # a report about a task not running on W1, naming a key W1 holds itself
    sim.s.handle_worker(W1, MissingData("b", ["a"], "stale-miss"))
    assert sim.state("b") == "processing" and sim.worker_of("b") == W2
    assert sim.state("a") == "memory" and sim.holds(W1) == {"a"}
    assert sim.to_worker(W1) == sim.to_worker(W2) == []


# --- stale and replicated results ---------------------------------------------------------


def test_stale_task_finished_from_another_worker_is_freed():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.clear()
    sim.finish("a", worker=W2, sid="stale")
    assert sim.state("a") == "processing" and sim.worker_of("a") == W1
    assert sim.to_worker(W2) == [FreeKeys(["a"], "stale")]
    assert sim.to_client() == []


def test_stale_task_finished_for_a_key_in_memory_becomes_a_replica():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=10)
    sim.clear()
    sim.finish("a", nbytes=10, worker=W2, sid="late")
    assert set(sim.ts("a").who_has) == {sim.ws(W1), sim.ws(W2)}
    assert sim.ws(W2).nbytes == 10
    assert sim.to_worker(W2) == [] and sim.to_client() == []
    assert sim.s.groups["a"].nbytes == 10  # a replica is not more data


def test_stale_results_for_unknown_keys_are_freed():
    sim = Sim()
    sim.finish("ghost", worker=W1, sid="s1")
    sim.s.handle_worker(W1, TaskErred("ghost", ARGS, "", stimulus_id="s2"))
    sim.add_keys(W1, {"ghost": 3}, sid="s3")
    assert sim.to_worker(W1) == [
        FreeKeys(["ghost"], "s1"),
        FreeKeys(["ghost"], "s2"),
        FreeKeys(["ghost"], "s3"),
    ]
    assert sim.s.tasks == {}


def test_stale_task_erred_does_not_touch_the_task():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.fail("a", worker=W2, sid="stale")
    assert sim.state("a") == "processing"
    assert sim.to_worker(W2) == [FreeKeys(["a"], "stale")]


def test_add_keys_records_replicas():
    sim = Sim({W1: 1, W2: 1, W3: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=10)
    sim.add_keys(W2, {"a": 10})
    sim.add_keys(W2, {"a": 10})  # twice is once
    assert set(sim.ts("a").who_has) == {sim.ws(W1), sim.ws(W2)}
    assert sim.holds(W2) == {"a"} and sim.ws(W2).nbytes == 10
    assert sim.s.who_has(["a", "nope"]) in (
        [("a", [W1, W2]), ("nope", [])],
        [("a", [W2, W1]), ("nope", [])],
    )
    sim.clear()
    sim.release("a", sid="r")
    assert sim.to_worker(W1) == sim.to_worker(W2) == [FreeKeys(["a"], "r")]
    assert sim.to_worker(W3) == []


def test_a_replica_reported_with_another_size_keeps_the_books_straight():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=100)
    sim.add_keys(W2, {"a": 120})
    assert sim.ws(W1).nbytes == 100
    assert sim.ws(W2).nbytes == sim.ts("a").nbytes
    sim.release("a")
    assert sim.ws(W1).nbytes == sim.ws(W2).nbytes == 0
    assert sim.s.prefixes["a"].nbytes == 0


def test_add_keys_for_a_key_not_in_memory_is_freed():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.add_keys(W2, {"a": 5}, sid="add")
    assert sim.to_worker(W2) == [FreeKeys(["a"], "add")]
    assert set(sim.ts("a").who_has) == set()


# --- counters -------------------------------------------------------------------------------


def recount(sim: Sim) -> None:
    """Every group and prefix counter equals a count over the tasks."""
    groups: dict[str, Counter] = {}
    prefixes: dict[str, Counter] = {}
    for ts in sim.s.tasks.values():
        groups.setdefault(ts.group.name, Counter())[ts.state] += 1
        prefixes.setdefault(ts.prefix.name, Counter())[ts.state] += 1
    assert set(sim.s.groups) == set(groups)
    for name, tg in sim.s.groups.items():
        live = {s: n for s, n in tg.states.items() if n and s != "forgotten"}
        assert live == dict(groups[name]), name
        assert tg.alive == sum(groups[name].values())
        in_memory = [ts for ts in sim.s.tasks.values() if ts.group is tg and ts.state == "memory"]
        assert tg.nbytes == sum(ts.nbytes for ts in in_memory)
        assert tg.prefix is sim.s.prefixes[tg.prefix.name]
    for name, tp in sim.s.prefixes.items():
        live = {s: n for s, n in tp.states.items() if n and s != "forgotten"}
        assert live == dict(prefixes.get(name, {})), name
        assert tp.alive == sum(prefixes.get(name, Counter()).values())
        assert tp.ngroups == sum(1 for tg in sim.s.groups.values() if tg.prefix is tp)
        in_memory = [ts for ts in sim.s.tasks.values() if ts.prefix is tp and ts.state == "memory"]
        assert tp.nbytes == sum(ts.nbytes for ts in in_memory)
        assert set(tp.states) == set(TASK_STATES)


def test_group_and_prefix_counters_match_a_recount():
    sim = Sim({W1: 2, W2: 1})
    inc = {("inc-0a1b2c3d", i): [] for i in range(5)}
    dbl = {("double-9f8e7d6c", i): [("inc-0a1b2c3d", i)] for i in range(5)}
    total = {"sum-00112233": list(dbl)}
    other = {("inc-44556677", 0): []}
    sim.submit({**inc, **dbl, **total, **other}, wanted=["sum-00112233", ("inc-44556677", 0)])
    assert set(sim.s.groups) == {"inc-0a1b2c3d", "double-9f8e7d6c", "sum-00112233", "inc-44556677"}
    assert set(sim.s.prefixes) == {"inc", "double", "sum"}
    assert sim.s.prefixes["inc"].ngroups == 2
    recount(sim)
    durations: dict[str, list[float]] = {}
    step = 0
    while sim.processing():
        key = sorted(sim.processing(), key=repr)[0]
        duration = 0.25 * (1 + step % 3)
        sim.finish(key, nbytes=10 + step, duration=duration)
        durations.setdefault(sim.ts(key).group.name, []).append(duration)
        step += 1
        recount(sim)
    for name, tg in sim.s.groups.items():
        assert tg.duration_count == len(durations[name])
        assert tg.duration_sum == pytest.approx(sum(durations[name]))
    inc_durations = durations["inc-0a1b2c3d"] + durations["inc-44556677"]
    assert sim.s.prefixes["inc"].duration_count == 6
    assert sim.s.prefixes["inc"].mean_duration == pytest.approx(sum(inc_durations) / 6)
    assert sim.s.groups["inc-0a1b2c3d"].states["released"] == 5  # freed intermediates
    assert sim.s.groups["sum-00112233"].states["memory"] == 1
    # forgetting everything deletes the groups; prefixes keep their measurements
    sim.release("sum-00112233")
    recount(sim)
    assert set(sim.s.groups) == {"inc-44556677"}
    assert sim.s.prefixes["inc"].ngroups == 1 and sim.s.prefixes["double"].ngroups == 0
    sim.release(("inc-44556677", 0))
    assert sim.s.tasks == {} and sim.s.groups == {}
    assert sim.s.prefixes["double"].duration_count == 5
    recount(sim)


def test_errors_count_durations_and_erred_states():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]}, group={"a": "g-a", "b": "g-b"})
    sim.fail("a")
    assert sim.s.groups["g-a"].states["erred"] == 1 and sim.s.groups["g-b"].states["erred"] == 1
    assert sim.s.groups["g-a"].duration_count == 1  # the worker measured 1 s
    assert sim.s.groups["g-b"].duration_count == 0
    recount(sim)


def test_measured_durations_set_occupancy_estimates():
    sim = Sim()
    sim.submit({"x-1": []})
    assert sim.ts("x-1").estimate == 0.5
    sim.finish("x-1", duration=0.25)
    sim.submit({"x-2": [], "x-3": []})
    assert sim.ts("x-2").estimate == 0.25
    assert sim.ws(W1).occupancy == pytest.approx(0.5)


def test_worker_infos():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "b": []})
    sim.finish("a", nbytes=7)
    assert sim.s.worker_infos() == [WorkerInfo(W1, "w1:1", "w1", 2, 2**30, 1, 7, 1)]


# --- the checks themselves --------------------------------------------------------------------


def test_invalid_transition_carries_the_story():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]}, sid="sub")
    with pytest.raises(InvalidTransition) as info:
        sim.s._transition(sim.ts("b"), "memory", "bad")
    err = info.value
    assert (err.key, err.start, err.finish) == ("b", "waiting", "memory")
    assert err.story == sim.s.story("b") == [("b", "released", "waiting", "sub")]
    assert "'waiting' -> 'memory'" in str(err) and "('b', 'released', 'waiting', 'sub')" in str(err)
    with pytest.raises(InvalidTransition, match="'processing' -> 'queued'"):
        sim.s._transition(sim.ts("a"), "queued", "bad")


def corrupt_processing(sim: Sim) -> None:
    sim.ws(W1).processing.discard(sim.ts("a"))


def corrupt_queue_count(sim: Sim) -> None:
    sim.s.nqueued += 1


def corrupt_who_has(sim: Sim) -> None:
    sim.ts("m").who_has = ()


def corrupt_group_counter(sim: Sim) -> None:
    sim.ts("m").group.states["memory"] += 1


def corrupt_worker_bytes(sim: Sim) -> None:
    sim.ws(W1).nbytes += 1


def corrupt_total_bytes(sim: Sim) -> None:
    sim.s.total_nbytes += 1


def corrupt_prefix_groups(sim: Sim) -> None:
    sim.ts("m").prefix.groups.clear()


def corrupt_free_set(sim: Sim) -> None:
    sim.s.free_workers.add(sim.ws(W1))


def corrupt_waiting_on(sim: Sim) -> None:
    sim.ts("w").waiting_on = ()


def corrupt_waiters(sim: Sim) -> None:
    sim.ts("a").waiters = ()


def corrupt_wants(sim: Sim) -> None:
    sim.s.clients["c"].wants.discard(sim.ts("m"))


def corrupt_occupancy(sim: Sim) -> None:
    sim.ws(W1).occupancy += 1


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (corrupt_processing, "not in its worker's processing"),
        (corrupt_queue_count, "queue count"),
        (corrupt_who_has, "who_has vs memory"),
        (corrupt_group_counter, "counters"),
        (corrupt_worker_bytes, "nbytes of"),
        (corrupt_total_bytes, "total nbytes"),
        (corrupt_prefix_groups, "groups"),
        (corrupt_free_set, "free set"),
        (corrupt_waiting_on, "waiting on nothing"),
        (corrupt_waiters, "does not know it is needed"),
        (corrupt_wants, "who_wants vs client"),
        (corrupt_occupancy, "occupancy"),
    ],
)
def test_validate_state_detects_corruption(corrupt, message):
    sim = Sim({W1: 1})
    sim.submit({"m": []})
    sim.finish("m")
    sim.submit({"a": [], "w": ["a"], "q1": [], "q2": []})
    assert sim.states() == {
        "m": "memory",
        "a": "processing",
        "w": "waiting",
        "q1": "processing",
        "q2": "queued",
    }
    sim.s.validate_state()
    corrupt(sim)
    with pytest.raises(InvalidState, match=message):
        sim.s.validate_state()


def test_validation_runs_after_every_event():
    sim = Sim()
    sim.submit({"a": []})
    sim.ws(W1).processing.clear()
    with pytest.raises(InvalidState):
        sim.submit({"b": []})


def test_client_and_worker_may_not_send_each_others_messages():
    sim = Sim()
    with pytest.raises(TypeError, match="a client may not send TaskErred"):
        sim.s.handle_client("c", TaskErred("a", ARGS, ""))
    with pytest.raises(TypeError, match="a worker may not send KeyInMemory"):
        sim.s.handle_worker(W1, KeyInMemory("a"))


def test_untimed_completion_leaves_the_duration_statistics_alone():
    # A worker that fetched a key it was asked to compute reports it with start=stop=0.0:
    # nothing ran there, so the prefix's measured duration must not move towards zero.
    sim = Sim({W1: 1})
    sim.submit({"a-1f2e3d4c": [], "a-5a6b7c8d": []})
    sim.finish("a-1f2e3d4c", duration=0.5)
    tp = sim.s.prefixes["a"]
    assert (tp.duration_count, tp.mean_duration) == (1, pytest.approx(0.5))
    key = "a-5a6b7c8d"
    sim.s.handle_worker(sim.worker_of(key), TaskFinished(key, 8, 0.0, 0.0, None, "int", "fetched"))
    assert sim.state(key) == "memory"
    assert (tp.duration_count, tp.mean_duration) == (1, pytest.approx(0.5))


def test_missing_data_keeps_copies_made_after_the_task_was_sent():
    """A dependent was sent with "a" on W1 only; W1 retired (its copy went to W3) before
    the fetch. The worker names W1 as the holder it tried: the copy on W3 is not lost,
    nothing is recomputed, and the dependent runs again told of W3 (found by the scaling
    property test)."""
    sim = busy_holder()
    sim.add_worker(W3, 1)
    sim.add_keys(W3, {"a": 8}, sid="copied")
    sim.remove_worker(W1, sid="retired")
    sim.clear()
    sim.s.handle_worker(W2, MissingData("b", ["a"], "miss", tried=[[W1]]))
    assert sim.state("a") == "memory" and sim.holds(W3) == {"a"}
    assert not any(e[1:3] == ("memory", "released") for e in sim.s.story("a"))
    assert sim.to_worker(W2) == [FreeKeys(["b"], "miss")]  # the task it could not run
    [msg] = sim.to_worker(W3)  # b goes where a's copy is; that copy is not dropped
    assert isinstance(msg, ComputeTask)
    assert msg.key == "b" and msg.deps == [DepInfo("a", 8, [W3])]


def test_missing_data_drops_the_copies_the_worker_tried():
    sim = busy_holder()
    sim.add_worker(W3, 1)
    sim.add_keys(W3, {"a": 8}, sid="copied")
    sim.clear()
    sim.s.handle_worker(W2, MissingData("b", ["a"], "miss", tried=[[W1, W3]]))
    assert sim.to_worker(W1) == sim.to_worker(W3) == [FreeKeys(["a"], "miss")]
    assert sim.state("a") != "memory"  # no copy left: computed again
