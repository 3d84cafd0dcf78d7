"""Keeping the sibling tasks of a small tree together (core/scheduler/packing.py), driven
with events only: where roots go once their prefix's duration is measured, and that
long, unmeasured, restricted or independent work is placed as before.

Every scheduler runs with ``validate=True``. The random interleavings (with tiny
durations, so that packing happens) are in ``test_scheduler_property.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from scheduler_harness import ARGS, FUNCS, W1, W2, W3, Sim

from shoal.core.scheduler.ahead import AHEAD_PER_THREAD, TINY_AHEAD_PER_THREAD
from shoal.core.scheduler.packing import TRANSFER_LATENCY, related
from shoal.protocol.messages import Payload, SubmitTasks, TaskRestrictions, TaskSpec, WorkerStatus

TINY = 0.0001  # seconds: a task of ~0.1 ms, far below a transfer and a round trip


def tree(n: int, roots: int = 16, fan_in: int = 4) -> dict[str, list[str]]:
    """``da.ones((1000, 1000), chunks=250).sum()``'s shape: roots, partial sums of
    ``fan_in`` each, one aggregate. Keys of submission ``n``, prefixes shared."""
    dag: dict[str, list[str]] = {f"root-{n}-{i}": [] for i in range(roots)}
    partials = roots // fan_in
    for p in range(partials):
        dag[f"partial-{n}-{p}"] = [f"root-{n}-{fan_in * p + j}" for j in range(fan_in)]
    dag[f"aggregate-{n}"] = [f"partial-{n}-{p}" for p in range(partials)]
    return dag


def run(sim: Sim, duration: float) -> list[str]:
    """Finish every processing task, each taking ``duration``; the keys in order."""
    done = []
    for _ in range(10_000):
        sim.drain_all()
        runnable = sorted(sim.runnable(), key=repr)
        if not runnable:
            return done
        sim.finish(runnable[0], duration=duration)
        done.append(runnable[0])
    raise AssertionError("did not quiesce")


def simulate(sim: Sim, duration: float) -> tuple[float, dict[str, float]]:
    """Run every processing task to the end in simulated time, each worker's one
    thread taking its runnable tasks in rank order, each task ``duration``; the time
    it all took and each worker's busy time (transfers cost nothing here)."""
    free_at = dict.fromkeys(sim.s.workers, 0.0)
    busy = dict.fromkeys(sim.s.workers, 0.0)
    ends: dict[str, float] = {}
    now = 0.0
    for _ in range(10_000):
        sim.drain_all()
        for k in sorted(sim.runnable(), key=lambda k: sim.ts(k).rank):
            if k not in ends:
                w = sim.worker_of(k)
                free_at[w] = ends[k] = max(free_at[w], now) + duration
                busy[w] += duration
        if not ends:
            return now, busy
        k = min(ends, key=ends.__getitem__)
        now = ends.pop(k)
        sim.finish(k, duration=duration)
    raise AssertionError("did not quiesce")


def where(sim: Sim, keys: list[str]) -> Counter[str]:
    """How many of ``keys`` each worker runs (those processing now)."""
    return Counter(sim.worker_of(k) for k in keys if sim.state(k) == "processing")


def roots_of(dag: dict[str, list[str]]) -> list[str]:
    return [k for k, deps in dag.items() if not deps]


def measured(
    duration: float, workers: dict[str, int] | None = None, latency: float | None = None
) -> Sim:
    """A scheduler that has run one tree, each task taking ``duration``: its
    prefixes' durations are known."""
    sim = Sim(workers=workers or {W1: 1, W2: 1}, ahead=True)
    if latency is not None:
        sim.s.transfer_latency = latency
    sim.submit(tree(0), wanted=["aggregate-0"])
    run(sim, duration)
    sim.release("aggregate-0")
    sim.clear()
    return sim


def test_the_roots_of_a_small_tree_of_tiny_tasks_go_to_one_worker():
    sim = measured(TINY)
    ran_on_w2 = sim.ws(W2).tasks_run  # (while measuring: spread)
    dag = tree(1)
    sim.submit(dag, wanted=["aggregate-1"])
    assert where(sim, roots_of(dag)) == {W1: 16}
    # every partial sum has its inputs on W1: all four wait there ahead (their
    # measured work is far under the latency: more than AHEAD_PER_THREAD may)
    assert sim.ws(W1).ahead == {sim.ts(f"partial-1-{p}") for p in range(4)}
    run(sim, TINY)
    assert sim.state("aggregate-1") == "memory"
    # nothing was placed on W2: no result of the tree had to move between workers
    assert sim.ws(W2).tasks_run == ran_on_w2


def test_without_the_latency_the_same_roots_are_spread():
    """The same tree with packing off: today's placement, alternating workers."""
    sim = measured(TINY, latency=0.0)
    dag = tree(1)
    sim.submit(dag, wanted=["aggregate-1"])
    assert where(sim, roots_of(dag)) == {W1: 8, W2: 8}


def test_unmeasured_prefixes_are_placed_as_before():
    """A first compute (no duration known) places exactly as with packing off."""
    placements = []
    for latency in (TRANSFER_LATENCY, 0.0):
        sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
        sim.s.transfer_latency = latency
        dag = tree(0)
        sim.submit(dag, wanted=["aggregate-0"])
        placements.append(
            {k: sim.worker_of(k) for k in roots_of(dag) if sim.state(k) == "processing"}
        )
        assert sim.s.packed == 0
    assert placements[0] == placements[1]
    assert set(placements[0].values()) == {W1, W2}


def test_a_tree_whose_work_is_long_spreads_over_every_worker():
    spans = []
    for latency in (TRANSFER_LATENCY, 0.0):
        sim = measured(1.0, workers={W1: 1, W2: 1, W3: 1}, latency=latency)
        dag = tree(1)
        sim.submit(dag, wanted=["aggregate-1"])
        # each worker's slots: a sibling may follow another only to a worker no busier
        assert where(sim, roots_of(dag)) == {W1: 2, W2: 2, W3: 2}
        span, busy = simulate(sim, 1.0)
        assert sim.state("aggregate-1") == "memory"
        assert all(b >= 6.0 for b in busy.values()), busy  # 21 tasks: 7 s each at best
        spans.append(span)
    assert spans[0] == spans[1] == 8.0  # 16 roots in 6 rounds, the partials, the aggregate


def test_tiny_roots_pack_only_up_to_the_latency_in_work():
    """Tasks of 0.3 ms: a worker takes siblings while its work ahead exceeds the
    other's by at most the latency, then the other takes the rest."""
    d = 0.0003
    sim = measured(d)
    dag = tree(1)
    sim.submit(dag, wanted=["aggregate-1"])
    counts = where(sim, roots_of(dag))
    assert counts[W1] + counts[W2] == 16
    assert counts[W1] > 4 and counts[W2] > 4  # both work: neither took it all
    # the imbalance in work is bounded by the latency (plus the last task placed)
    assert abs(counts[W1] - counts[W2]) * d <= TRANSFER_LATENCY + d


def test_a_large_graph_of_tiny_tasks_keeps_every_worker_busy():
    sim = measured(TINY, workers={W1: 1, W2: 1})
    dag = tree(1, roots=1024)
    sim.submit(dag, wanted=["aggregate-1"])
    counts = where(sim, roots_of(dag))
    assert counts[W1] > 0 and counts[W2] > 0
    # each worker holds the work a free worker may hold, no more (20 ms per thread)
    assert max(counts.values()) * TINY <= 0.02 + 2 * TINY
    span, busy = simulate(sim, TINY)
    assert sim.state("aggregate-1") == "memory"
    # 1,365 tasks: half each at best; within the latency of it in simulated time
    assert span <= len(dag) * TINY / 2 + TRANSFER_LATENCY + 0.001, (span, busy)


def test_independent_tiny_roots_are_spread():
    """Roots that feed no common task gain nothing from sharing a worker."""
    sim = measured(TINY)
    packed = sim.s.packed
    dag = {f"root-1-{i}": [] for i in range(8)}
    sim.submit(dag)
    assert where(sim, list(dag)) == {W1: 4, W2: 4}
    assert sim.s.packed == packed


def test_tiny_roots_do_not_queue_behind_long_work():
    """W1 runs a task of a measured 10 s: the tree goes to W2, though W1 has a slot."""
    sim = measured(TINY)
    sim.submit({"long-0": []})
    sim.finish("long-0", duration=10.0)
    sim.submit({"long-1": []})
    busy = sim.worker_of("long-1")
    other = W2 if busy == W1 else W1
    dag = tree(1)
    sim.submit(dag, wanted=["aggregate-1"])
    assert where(sim, roots_of(dag)) == {other: 16}


def test_a_paused_worker_gets_no_packed_task():
    sim = measured(TINY)
    sim.s.handle_worker(W1, WorkerStatus("paused", "pause"))
    dag = tree(1)
    sim.submit(dag, wanted=["aggregate-1"])
    assert where(sim, roots_of(dag)) == {W2: 16}


def test_restricted_roots_keep_their_restrictions():
    sim = measured(TINY)
    dag = tree(1)
    on_w2 = TaskRestrictions([W2])
    sim.submit(dag, wanted=["aggregate-1"], restrictions=dict.fromkeys(roots_of(dag), on_w2))
    assert where(sim, roots_of(dag)) == {W2: 16}
    run(sim, TINY)
    assert sim.state("aggregate-1") == "memory"


def test_a_task_stays_with_its_inputs_when_moving_them_costs_more_than_waiting():
    """The latency term of _decide_worker: W1 holds both inputs and has 0.5 ms of tiny
    work queued; W2 is idle. Fetching to W2 would cost more than waiting on W1."""
    for latency, expected in ((TRANSFER_LATENCY, W1), (0.0, W2)):
        sim = measured(TINY, latency=latency)
        sim.scatter(W1, {"x": 8, "y": 8})
        on_w1 = TaskRestrictions([W1])
        queued = {f"root-1-{i}": [] for i in range(5)}
        sim.submit(queued, restrictions=dict.fromkeys(queued, on_w1))
        assert sim.ws(W1).occupancy == pytest.approx(5 * TINY)
        sim.submit({"aggregate-1": ["x", "y"]}, wanted=["aggregate-1"])
        assert sim.worker_of("aggregate-1") == expected


def test_related_means_a_common_dependent_or_grand_dependent():
    sim = Sim(workers={W1: 1})
    sim.submit(tree(0, roots=8, fan_in=2) | {"other": []})
    ts = sim.ts
    assert related(ts("root-0-0"), ts("root-0-1"))  # one partial
    assert related(ts("root-0-0"), ts("root-0-7"))  # the same aggregate, two levels up
    assert not related(ts("root-0-0"), ts("other"))


def test_a_slow_first_run_of_a_prefix_soon_stops_counting():
    """Durations are the prefix's recent ones: a first compute of 50 ms per task
    (imports, cold caches) does not keep its tiny tasks apart for long."""
    sim = measured(0.05)
    for n in (1, 2):
        sim.submit(tree(n), wanted=[f"aggregate-{n}"])
        run(sim, TINY)
        sim.release(f"aggregate-{n}")
    assert sim.s.prefixes["root"].recent_duration == pytest.approx(TINY, rel=0.01)
    dag = tree(3)
    sim.submit(dag, wanted=["aggregate-3"])
    assert where(sim, roots_of(dag)) == {W1: 16}


def test_roots_carrying_large_arguments_are_spread():
    """A partition carried in the graph (df.b.sum()'s roots: MBs each) takes longer to
    receive than a transfer costs: such roots are spread, though their run is tiny."""
    sim = measured(TINY)
    packed = sim.s.packed
    big = Payload(0, b"\x92\x90\x80" + bytes(1_000_000))  # 10 ms at the assumed bandwidth
    dag = tree(1)
    sim.s.handle_client(
        "c",
        SubmitTasks(
            [TaskSpec(k, "f", big if not deps else ARGS, deps) for k, deps in dag.items()],
            ["aggregate-1"],
            dict(FUNCS),
            "submit-big",
        ),
    )
    assert where(sim, roots_of(dag)) == {W1: 8, W2: 8}
    assert sim.s.packed == packed


def groups_split(sim: Sim, dag: dict[str, list[str]]) -> list[str]:
    """The partials whose roots were placed on more than one worker (each such partial
    fetches an input: a transfer and a round trip on a small tree's critical path)."""
    return [
        k
        for k, deps in dag.items()
        if deps and k.startswith("partial") and len({sim.worker_of(d) for d in deps}) > 1
    ]


def measured_tree(duration: float, roots: int, fan_in: int) -> Sim:
    sim = Sim(workers={W1: 1, W2: 1}, ahead=True)
    sim.submit(tree(0, roots=roots, fan_in=fan_in), wanted=["aggregate-0"])
    run(sim, duration)
    sim.release("aggregate-0")
    sim.clear()
    return sim


def test_tiny_roots_switch_workers_between_groups_of_siblings_not_inside_one():
    """``tall.T @ tall``'s shape: 10 roots of ~0.4 ms, partials of 4, 4 and 2, one
    aggregate. Both workers take work, but each partial's inputs are all on one
    worker: the partials wait there ahead, and only the aggregate fetches."""
    d = 0.0004
    sim = measured_tree(d, roots=10, fan_in=4)
    dag = tree(1, roots=10, fan_in=4)
    dag["partial-1-2"] = ["root-1-8", "root-1-9"]  # (the fan_in-wide tree drops these)
    dag["aggregate-1"].append("partial-1-2")
    sim.submit(dag, wanted=["aggregate-1"])
    counts = where(sim, roots_of(dag))
    assert sum(counts.values()) == 10 and set(counts) == {W1, W2}
    assert groups_split(sim, dag) == []
    assert all(sim.state(f"partial-1-{p}") == "processing" for p in range(3))  # ahead
    run(sim, d)
    assert sim.state("aggregate-1") == "memory"


def test_a_group_of_siblings_switches_workers_at_its_boundary():
    """16 roots of 0.3 ms in groups of 4: two groups on each worker, none split, the
    work even."""
    d = 0.0003
    sim = measured(d)
    dag = tree(1)
    sim.submit(dag, wanted=["aggregate-1"])
    assert where(sim, roots_of(dag)) == {W1: 8, W2: 8}
    assert groups_split(sim, dag) == []


def test_a_group_whose_work_exceeds_the_latency_is_still_spread():
    """One partial of 16 roots of 0.3 ms (4.8 ms, above the latency): it is split over
    both workers as before, the imbalance bounded by the latency."""
    d = 0.0003
    sim = measured_tree(d, roots=16, fan_in=16)
    dag = tree(1, roots=16, fan_in=16)
    sim.submit(dag, wanted=["aggregate-1"])
    counts = where(sim, roots_of(dag))
    assert counts[W1] + counts[W2] == 16 and counts[W1] > 4 and counts[W2] > 4
    assert abs(counts[W1] - counts[W2]) * d <= TRANSFER_LATENCY + d


def test_tasks_ahead_beyond_two_per_thread_only_while_their_work_is_tiny():
    """0.8 ms partials: two fill most of the latency, so no third waits ahead; tiny
    ones: at most TINY_AHEAD_PER_THREAD of a wide fan-out."""
    sim = measured(0.0008, workers={W1: 1})
    sim.submit(tree(1), wanted=["aggregate-1"])
    assert len(sim.ws(W1).ahead) == AHEAD_PER_THREAD
    run(sim, 0.0008)
    assert sim.state("aggregate-1") == "memory"

    sim = measured(TINY, workers={W1: 1})
    sim.submit({"root-1-0": [], **{f"partial-1-{i}": ["root-1-0"] for i in range(40)}})
    assert len(sim.ws(W1).ahead) == TINY_AHEAD_PER_THREAD
    assert sum(sim.state(f"partial-1-{i}") == "waiting" for i in range(40)) == 40 - 16
    run(sim, TINY)
    assert all(sim.state(f"partial-1-{i}") == "memory" for i in range(40))


def test_without_the_latency_two_per_thread_wait_ahead():
    sim = measured(TINY, latency=0.0)
    sim.submit(tree(1), wanted=["aggregate-1"])
    assert sum(len(sim.ws(w).ahead) for w in (W1, W2)) <= 2 * AHEAD_PER_THREAD
    assert all(len(sim.ws(w).ahead) <= AHEAD_PER_THREAD for w in (W1, W2))
