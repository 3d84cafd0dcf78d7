"""Placement restrictions in the scheduler core: ``workers=`` (by address, name or host),
``allow_other_workers=`` and ``resources=``, driven with events only.

Every scheduler runs with ``validate=True`` (see ``scheduler_harness.Sim``), so the
restriction invariants (resources in use, valid workers, nothing left queued that could
run) are checked after each event as well.
"""

from __future__ import annotations

import pytest
from scheduler_harness import W1, W2, W3, Sim

from shoal.core.story import InvalidState
from shoal.protocol.messages import ComputeTask, KeyErred, TaskRestrictions


def on(*workers: str, loose: bool = False, **resources: float) -> TaskRestrictions:
    return TaskRestrictions(list(workers), loose, resources)


def needs(**resources: float) -> TaskRestrictions:
    return TaskRestrictions(resources=resources)


def two_workers() -> Sim:
    """W1 named "first", W2 named "second", one thread each (hosts "w1" and "w2")."""
    sim = Sim(workers={})
    sim.add_worker(W1, 1, name="first")
    sim.add_worker(W2, 1, name="second")
    return sim


def gpu_cluster(gpus: float = 1) -> Sim:
    """W1 without resources, W2 with ``gpus`` GPUs; two threads each."""
    sim = Sim(workers={})
    sim.add_worker(W1, 2)
    sim.add_worker(W2, 2, resources={"GPU": gpus})
    return sim


# --- workers= ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", [W2, "w2:1", "second", "w2"], ids=["address", "no-scheme", "name", "host"]
)
def test_strict_restriction_runs_only_on_the_named_worker(name):
    sim = two_workers()
    keys = [f"r-{i}" for i in range(4)]
    sim.submit(dict.fromkeys(keys, []), restrictions=dict.fromkeys(keys, on(name)))
    # as in Dask, a restricted task does not wait for a free thread: all go to W2
    assert sim.on(W2) == set(keys) and sim.on(W1) == set()
    assert sim.computes(W2) == keys  # in priority order
    sim.run_all()
    assert all(sim.state(k) == "memory" for k in keys)
    assert sim.holds(W2) == set(keys)


def test_a_restricted_dependent_ignores_where_its_data_is():
    sim = two_workers()
    sim.submit({"a": []}, restrictions={"a": on("first")})
    sim.finish("a", nbytes=10**9)
    sim.submit({"b": ["a"]}, restrictions={"b": on("second")})
    assert sim.worker_of("b") == W2


def test_a_worker_matching_by_any_name_counts_once():
    sim = two_workers()
    sim.submit({"a": []}, restrictions={"a": on(W2, "second", "w2")})
    assert sim.computes(W2) == ["a"] and sim.computes(W1) == []


def test_with_no_matching_worker_the_task_waits_then_runs_when_one_joins():
    sim = two_workers()
    sim.submit({"r": [], "after": ["r"]}, restrictions={"r": on("tcp://w3:1")})
    sim.submit({"free": []})
    assert sim.state("r") == "queued" and sim.state("after") == "waiting"
    sim.run_all()  # the others do not wait for it
    assert sim.state("free") == "memory" and sim.state("r") == "queued"
    assert [m for m in sim.to_client() if isinstance(m, KeyErred)] == []
    sim.add_worker(W3, 1)
    assert sim.worker_of("r") == W3
    sim.finish("r")
    assert sim.state("after") == "processing"  # unrestricted: wherever is best


def test_a_task_pinned_to_a_worker_that_leaves_waits_for_it_to_come_back():
    sim = two_workers()
    sim.submit({"r": []}, restrictions={"r": on("second")})
    sim.clear()
    sim.remove_worker(W2, sid="gone")
    assert sim.state("r") == "queued" and sim.on(W1) == set()
    assert [e[1:] for e in sim.s.story("r")][-3:] == [
        ("processing", "released", "gone"),
        ("released", "waiting", "gone"),
        ("waiting", "queued", "gone"),
    ]
    sim.add_worker("tcp://w9:1", 1, name="second")  # same name, another address
    assert sim.worker_of("r") == "tcp://w9:1"


# --- allow_other_workers= ---------------------------------------------------------------


def test_loose_restriction_prefers_the_named_worker():
    sim = two_workers()
    keys = ["l-0", "l-1", "l-2"]
    sim.submit(dict.fromkeys(keys, []), restrictions=dict.fromkeys(keys, on("second", loose=True)))
    assert sim.on(W2) == set(keys)


def test_loose_restriction_falls_back_when_no_named_worker_is_connected():
    sim = two_workers()
    sim.submit({"l": []}, restrictions={"l": on("tcp://nowhere:1", loose=True)})
    assert sim.state("l") == "processing"
    sim.run_all()
    assert sim.state("l") == "memory"


def test_loose_task_moves_on_when_its_worker_leaves():
    sim = two_workers()
    sim.submit({"l": [], "s": []}, restrictions={"l": on("second", loose=True), "s": on("second")})
    assert sim.on(W2) == {"l", "s"}
    sim.remove_worker(W2)
    assert sim.worker_of("l") == W1  # loose: anywhere now
    assert sim.state("s") == "queued"  # strict: waits for "second"


def test_loose_restriction_never_loosens_resources():
    sim = gpu_cluster()
    sim.add_worker(W3, 1, resources={"GPU": 4})
    # the named worker has no GPU: the task goes to a worker that does, W3 the least busy
    sim.submit({"g": []}, restrictions={"g": on("w1", loose=True, GPU=1)})
    assert sim.worker_of("g") in (W2, W3)
    sim.submit({"x": []}, restrictions={"x": on("tcp://nowhere:1", loose=True, TPU=1)})
    assert sim.state("x") == "queued"  # no worker anywhere has a TPU


# --- resources= -------------------------------------------------------------------------


def test_resource_tasks_go_only_to_workers_with_the_resource_and_carry_it():
    sim = gpu_cluster(gpus=4)
    keys = [f"g-{i}" for i in range(3)]
    sim.submit(dict.fromkeys(keys, []), restrictions=dict.fromkeys(keys, needs(GPU=1)))
    assert sim.on(W2) == set(keys) and sim.on(W1) == set()
    computes = [m for m in sim.to_worker(W2) if isinstance(m, ComputeTask)]
    assert [m.resources for m in computes] == [{"GPU": 1.0}] * 3
    assert sim.ws(W2).used_resources == {"GPU": 3.0}


def test_unrestricted_compute_task_carries_no_resources():
    sim = gpu_cluster()
    sim.submit({"u": []})
    (compute,) = [m for m in sim.to_worker(sim.worker_of("u")) if isinstance(m, ComputeTask)]
    assert compute.resources == {}
    assert sim.ts("u").restrictions is None


def test_resources_limit_concurrency_and_are_released_on_finish_error_and_cancel():
    sim = gpu_cluster(gpus=1)
    keys = ["g-0", "g-1", "g-2", "g-3"]
    sim.submit(dict.fromkeys(keys, []), restrictions=dict.fromkeys(keys, needs(GPU=1)))
    assert sim.on(W2) == {"g-0"}
    assert [sim.state(k) for k in keys[1:]] == ["queued"] * 3
    sim.clear()
    sim.finish("g-0")
    assert sim.computes(W2) == ["g-1"]
    sim.fail("g-1")
    assert sim.state("g-1") == "erred" and sim.computes(W2) == ["g-2"]
    sim.cancel("g-2")
    assert sim.state("g-2") == "forgotten" and sim.computes(W2) == ["g-3"]
    sim.finish("g-3")
    assert sim.ws(W2).used_resources == {"GPU": 0.0}


def test_a_retried_task_releases_its_resources_and_queues_for_them_again():
    sim = gpu_cluster(gpus=1)
    restrictions = {"g": needs(GPU=1), "h": needs(GPU=1)}
    sim.submit({"g": [], "h": []}, restrictions=restrictions, retries={"g": 1})
    assert sim.on(W2) == {"g"} and sim.state("h") == "queued"
    sim.clear()
    sim.fail("g")  # retried: it competes again, and its priority is still the better one
    assert sim.computes(W2) == ["g"] and sim.state("h") == "queued"
    assert sim.ws(W2).used_resources == {"GPU": 1.0}
    sim.finish("g")
    assert sim.computes(W2) == ["h"]


def test_resources_released_when_the_worker_leaves_and_used_on_a_new_one():
    sim = gpu_cluster(gpus=1)
    sim.submit({"g-0": [], "g-1": []}, restrictions={k: needs(GPU=1) for k in ("g-0", "g-1")})
    sim.remove_worker(W2)
    assert sim.state("g-0") == sim.state("g-1") == "queued"
    assert sim.on(W1) == set()
    sim.add_worker(W3, 2, resources={"GPU": 2})
    assert sim.on(W3) == {"g-0", "g-1"}


def test_unrestricted_tasks_share_a_resource_worker_freely():
    sim = gpu_cluster(gpus=1)
    sim.submit({"g": []}, restrictions={"g": needs(GPU=1)})
    sim.submit({f"u-{i}": [] for i in range(6)})
    assert len(sim.on(W2)) == 3 and "g" in sim.on(W2)  # 2 threads: 3 slots


def test_task_needing_more_than_any_worker_has_waits_for_a_bigger_one():
    sim = gpu_cluster(gpus=1)
    sim.submit({"big": []}, restrictions={"big": needs(GPU=2)})
    assert sim.state("big") == "queued"
    sim.add_worker(W3, 1, resources={"GPU": 2})
    assert sim.worker_of("big") == W3


def test_every_resource_must_be_declared_and_free():
    sim = Sim(workers={})
    sim.add_worker(W1, 2, resources={"GPU": 1})
    sim.add_worker(W2, 2, resources={"GPU": 1, "MEM": 100})
    sim.submit({"a": [], "b": []}, restrictions={"a": needs(GPU=1, MEM=60), "b": needs(MEM=60)})
    # one of them runs on W2; the other waits for its MEM (W1 has none)
    assert len(sim.on(W2)) == 1 and sim.on(W1) == set()
    first = next(iter(sim.on(W2)))
    sim.finish(first)
    assert sim.on(W2) == {"a", "b"} - {first}


def test_zero_amount_still_needs_the_resource_declared():
    sim = gpu_cluster()
    sim.submit({"z": []}, restrictions={"z": needs(GPU=0)})
    assert sim.worker_of("z") == W2


def test_fractional_amounts_add_up_without_rounding_errors():
    sim = Sim(workers={})
    sim.add_worker(W1, 4, resources={"GPU": 0.3})
    keys = ["f-0", "f-1", "f-2", "f-3"]
    sim.submit(dict.fromkeys(keys, []), restrictions=dict.fromkeys(keys, needs(GPU=0.1)))
    # 0.3 - (0.1 + 0.1) is 0.0999...: three fit all the same, the fourth waits
    assert sim.on(W1) == {"f-0", "f-1", "f-2"} and sim.state("f-3") == "queued"


def test_tasks_competing_for_a_resource_go_in_priority_order_across_restrictions():
    sim = gpu_cluster(gpus=1)
    sim.submit({"hold": []}, restrictions={"hold": needs(GPU=1)})
    # queued in the opposite order of their priorities, each with other restrictions
    sim.submit({"low": []}, restrictions={"low": needs(GPU=1)}, priority={"low": 0})
    sim.submit({"mid": []}, restrictions={"mid": on("w2", GPU=1)}, priority={"mid": 1})
    sim.submit({"high": []}, restrictions={"high": on(W2, GPU=1)}, priority={"high": 2})
    sim.clear()
    order = []
    for _ in range(3):
        (running,) = sim.on(W2)
        sim.finish(running)
        order += sim.computes(W2)
    assert order == ["high", "mid", "low"]


# --- not blocking others ------------------------------------------------------------------


def test_restricted_queued_root_task_does_not_starve_unrestricted_ones():
    sim = Sim(workers={})
    sim.add_worker(W1, 1, resources={"GPU": 1})
    sim.submit({"gpu-0": []}, restrictions={"gpu-0": needs(GPU=1)})
    # higher priority than everything after it, but no GPU is free and no worker is named
    urgent = {"gpu-1": needs(GPU=1), "pinned": on("tcp://w9:1")}
    sim.submit(dict.fromkeys(urgent, []), restrictions=urgent, priority=dict.fromkeys(urgent, 10))
    roots = [f"u-{i}" for i in range(6)]
    sim.submit(dict.fromkeys(roots, []))
    assert sim.s.nqueued == 5  # the root-task queue holds only unrestricted tasks
    done = sim.run_all()
    assert set(roots) <= set(done)
    assert done.index("gpu-1") > done.index("gpu-0")
    assert sim.state("pinned") == "queued"


def test_restricted_tasks_with_dependencies_wait_like_the_others():
    sim = gpu_cluster(gpus=1)
    sim.submit(
        {"a": [], "g-0": ["a"], "g-1": ["a"]},
        restrictions={"g-0": needs(GPU=1), "g-1": needs(GPU=1)},
    )
    assert sim.state("g-0") == sim.state("g-1") == "waiting"
    sim.finish("a")
    assert len(sim.on(W2) & {"g-0", "g-1"}) == 1
    queued = ({"g-0", "g-1"} - sim.on(W2)).pop()
    assert sim.state(queued) == "queued"
    sim.release(queued)  # nobody wants it any more: it leaves its queue
    assert sim.state(queued) == "forgotten"
    assert sim.s.restricted == {}


def test_a_queued_restricted_task_whose_dependency_is_lost_waits_for_it_again():
    sim = gpu_cluster(gpus=1)
    sim.submit({"hold": []}, restrictions={"hold": needs(GPU=1)})
    sim.submit({"a": [], "g": ["a"]}, restrictions={"a": on("w1"), "g": needs(GPU=1)})
    sim.finish("a")
    assert sim.state("g") == "queued"  # the GPU is held
    sim.remove_worker(W1)  # "a" lived only there
    assert sim.state("g") == "waiting" and sim.state("a") == "queued"  # pinned to w1
    sim.add_worker(W1, 1)
    sim.finish("a")
    sim.finish("hold")
    assert sim.worker_of("g") == W2


# --- sharing and forgetting -----------------------------------------------------------------


def test_tasks_with_equal_restrictions_share_one_record_that_goes_with_them():
    sim = gpu_cluster(gpus=2)
    sim.submit({"a": [], "b": []}, restrictions={"a": needs(GPU=1), "b": needs(GPU=1.0)})
    sim.submit({"c": []}, restrictions={"c": on("w2", "second", GPU=1)})
    sim.submit({"d": []}, restrictions={"d": on("second", "w2", GPU=1)})
    assert sim.ts("a").restrictions is sim.ts("b").restrictions
    assert sim.ts("c").restrictions is sim.ts("d").restrictions
    assert sim.ts("a").restrictions is not sim.ts("c").restrictions
    assert len(sim.s._interned) == 2
    sim.run_all()
    sim.release("a", "b", "c", "d")
    assert sim.s.tasks == {} and len(sim.s._interned) == 0


def test_allow_other_workers_without_workers_is_no_restriction():
    sim = gpu_cluster()
    sim.submit({"x": []}, restrictions={"x": TaskRestrictions(allow_other_workers=True)})
    assert sim.ts("x").restrictions is None
    assert sim.state("x") == "processing"


# --- worker info and validation -------------------------------------------------------------


def test_worker_infos_show_resources():
    sim = gpu_cluster(gpus=2)
    infos = {info.address: info.resources for info in sim.s.worker_infos()}
    assert infos == {W1: {}, W2: {"GPU": 2}}


def corrupt_resource_count(sim: Sim) -> None:
    sim.ws(W2).used_resources["GPU"] += 1


def corrupt_totals_below_use(sim: Sim) -> None:
    sim.ws(W2).resources["GPU"] = 0.5


def corrupt_double_booking(sim: Sim) -> None:
    ts = sim.ts("g-1")  # queued for the GPU "g-0" holds: start it there all the same
    sim.s._dequeue(ts)
    ts.state = "processing"
    sim.s._add_processing(ts, sim.ws(W2))


def corrupt_queue_count(sim: Sim) -> None:
    r = sim.ts("g-1").restrictions
    assert r is not None
    r.nqueued += 1


def corrupt_room_left_unused(sim: Sim) -> None:
    sim.ws(W2).resources["GPU"] = 2.0  # as if a GPU were free and nobody used it


def corrupt_placement(sim: Sim) -> None:
    ts, ws = sim.ts("p"), sim.ws(W2)
    sim.ws(W1).processing.discard(ts)
    sim.ws(W1).occupancy -= ts.estimate
    ts.processing_on = ws
    ws.processing.add(ts)
    ws.occupancy += ts.estimate
    sim.s.free_workers = {w for w in sim.s.workers.values() if sim.s._is_free(w)}


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (corrupt_resource_count, "resources in use on"),
        (corrupt_totals_below_use, "without its resources"),
        (corrupt_double_booking, "more resources in use on tcp://w2:1 than it has"),
        (corrupt_queue_count, "queue count"),
        (corrupt_room_left_unused, "queued although"),
        (corrupt_placement, "processing on a worker not named"),
    ],
)
def test_validate_state_detects_corrupted_restrictions(corrupt, message):
    sim = gpu_cluster(gpus=1)
    sim.submit({"g-0": [], "g-1": []}, restrictions={"g-0": needs(GPU=1), "g-1": needs(GPU=1)})
    sim.submit({"p": []}, restrictions={"p": on("w1")})
    assert sim.states() == {"g-0": "processing", "g-1": "queued", "p": "processing"}
    sim.s.validate_state()
    corrupt(sim)
    with pytest.raises(InvalidState, match=message):
        sim.s.validate_state()
