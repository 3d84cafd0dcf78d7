"""Walltime in the scheduler core: worker deadlines and task budgets, with simulated
time (``tick``), no network. Every scheduler validates after each event."""

from __future__ import annotations

import pytest
from scheduler_harness import W1, W2, W3, Sim

from shoal.core.scheduler.model import UNKNOWN_DURATION
from shoal.core.scheduler.walltime import SCHEDULING_TOPIC
from shoal.protocol.messages import (
    AddKeys,
    ComputeTask,
    CopyKeys,
    TaskRestrictions,
    TaskUnplaceable,
    WorkerLeaving,
)

T0 = 1_000_000.0  # the scheduler's wall clock when the workers join


def sim_at(t: float = T0, **kw) -> Sim:
    sim = Sim(workers={}, **kw)
    sim.s.tick(t)
    return sim


def scheduling_events(sim: Sim) -> list[dict]:
    return [data for _, data in sim.s.get_events(SCHEDULING_TOPIC)[SCHEDULING_TOPIC]]


def unplaceable_notes(sim: Sim, client: str = "c") -> list[TaskUnplaceable]:
    return [msg for msg in sim.to_client(client) if isinstance(msg, TaskUnplaceable)]


def test_a_long_task_goes_to_the_worker_with_time_left_not_the_idle_short_one():
    sim = sim_at()
    sim.add_worker(W1, nthreads=4, lifetime=100.0)
    sim.add_worker(W2, nthreads=1, lifetime=10_000.0)
    sim.submit({"long-1": [], "short-1": []}, durations={"long-1": 1000.0, "short-1": 1.0})
    assert sim.worker_of("long-1") == W2
    assert sim.state("short-1") == "processing"


def test_the_deadline_moves_with_the_clock():
    sim = sim_at()
    sim.add_worker(W1, lifetime=100.0)
    sim.submit({"a-1": []}, durations={"a-1": 50.0})
    assert sim.worker_of("a-1") == W1
    sim.finish("a-1", duration=50.0)
    sim.s.tick(T0 + 60)  # 40 s left: a 50 s task no longer fits
    sim.submit({"a-2": []}, durations={"a-2": 50.0})
    assert sim.state("a-2") == "queued"
    assert sim.ts("a-2") in sim.s.parked
    sim.submit({"b-1": []}, durations={"b-1": 39.0})
    assert sim.worker_of("b-1") == W1  # a shorter task behind it still goes


def test_a_task_fitting_no_worker_waits_says_so_once_and_goes_to_a_fresh_worker():
    sim = sim_at()
    sim.add_worker(W1, lifetime=3600.0)
    sim.clear()
    sim.submit({"big-1": [], "big-2": []}, durations={"big-1": 4 * 3600.0, "big-2": 4 * 3600.0})
    assert sim.states() == {"big-1": "queued", "big-2": "queued"}
    assert sim.computes(W1) == []
    events = scheduling_events(sim)
    assert len(events) == 1  # one episode for the prefix, not one per task
    (event,) = events
    assert event["action"] == "unplaceable"
    assert event["prefix"] == "big"
    assert event["key"] in ("big-1", "big-2")
    assert event["duration"] == 4 * 3600.0
    assert event["longest_left"] == pytest.approx(3600.0)
    assert "14400s" in event["reason"] and "3600s" in event["reason"]
    (note,) = unplaceable_notes(sim)
    assert note.prefix == "big" and note.longest_left == pytest.approx(3600.0)
    # Time passing does not make it fit; a fresh worker with five hours does.
    sim.s.tick(T0 + 100)
    sim.submit({"small-1": []})
    assert sim.worker_of("small-1") == W1
    sim.add_worker(W2, lifetime=5 * 3600.0)
    assert sim.worker_of("big-1") == W2 and sim.worker_of("big-2") == W2
    assert not sim.s.parked and not sim.s.parked_prefixes
    assert scheduling_events(sim)[-1] == {"action": "placeable", "prefix": "big"}
    # A new episode says so again.
    sim.submit({"big-3": []}, durations={"big-3": 10 * 3600.0})
    assert sim.state("big-3") == "queued"
    assert [e["action"] for e in scheduling_events(sim)].count("unplaceable") == 2


def test_a_measured_mean_counts_when_there_is_no_hint():
    sim = sim_at()
    sim.add_worker(W1, lifetime=10_000.0)
    sim.submit({"slow-1": []})
    sim.finish("slow-1", duration=500.0)  # the prefix "slow" runs 500 s
    sim.add_worker(W2, lifetime=300.0)
    sim.submit({"slow-2": [], "slow-3": []})
    assert sim.worker_of("slow-2") == W1 and sim.worker_of("slow-3") == W1
    assert W2 not in {sim.worker_of(k) for k in ("slow-2", "slow-3")}
    # Never measured: the unknown default, which fits.
    sim.submit({"new-1": []}, wanted=["new-1"])
    assert sim.s.expected_duration(sim.ts("new-1")) == UNKNOWN_DURATION


def test_a_hint_wins_over_the_measured_mean():
    sim = sim_at()
    sim.add_worker(W1, lifetime=10_000.0)
    sim.submit({"f-1": []})
    sim.finish("f-1", duration=500.0)
    sim.submit({"f-2": []}, durations={"f-2": 2.0})
    assert sim.s.expected_duration(sim.ts("f-2")) == 2.0
    sim.s.tick(T0 + 9_990)  # 10 s left: 2 s fits, 500 s would not
    sim.clear()
    assert sim.worker_of("f-2") == W1


def test_a_dependent_does_not_follow_its_data_to_a_worker_without_time():
    sim = sim_at()
    sim.add_worker(W1, lifetime=100.0)
    sim.submit({"x-1": []}, durations={"x-1": 1.0})
    sim.finish("x-1", nbytes=10**9)  # a GB on W1
    sim.add_worker(W2, lifetime=10_000.0)
    sim.submit({"y-1": ["x-1"]}, durations={"y-1": 1000.0})
    assert sim.worker_of("y-1") == W2
    sim.submit({"z-1": ["x-1"]}, durations={"z-1": 1.0})
    assert sim.worker_of("z-1") == W1  # a short one still goes where the data is


def test_a_dependent_fitting_no_worker_is_parked_and_placed_when_one_comes():
    sim = sim_at()
    sim.add_worker(W1, lifetime=100.0)
    sim.submit({"x-1": []}, durations={"x-1": 1.0})
    sim.finish("x-1")
    sim.submit({"y-1": ["x-1"]}, durations={"y-1": 1000.0})
    assert sim.ts("y-1") in sim.s.parked
    sim.add_worker(W2)  # no lifetime at all
    assert sim.worker_of("y-1") == W2


def test_restricted_tasks_respect_deadlines_and_a_parked_one_does_not_block_the_rest():
    sim = sim_at()
    sim.add_worker(W1, nthreads=2, lifetime=100.0, resources={"GPU": 1})
    sim.add_worker(W2, nthreads=2, lifetime=10_000.0, resources={"GPU": 1})
    gpu = TaskRestrictions(resources={"GPU": 1})
    sim.submit({"g-1": []}, restrictions={"g-1": gpu}, durations={"g-1": 1000.0})
    assert sim.worker_of("g-1") == W2
    only_w1 = TaskRestrictions(workers=[W1])
    sim.submit(
        {"long-1": [], "short-1": []},
        restrictions={"long-1": only_w1, "short-1": only_w1},
        durations={"long-1": 1000.0, "short-1": 1.0},
        priority={"long-1": 10},  # first in line
    )
    assert sim.ts("long-1") in sim.s.parked
    assert sim.worker_of("short-1") == W1
    # A loose restriction runs elsewhere when no named worker has the time.
    loose = TaskRestrictions(workers=[W1], allow_other_workers=True)
    sim.submit({"loose-1": []}, restrictions={"loose-1": loose}, durations={"loose-1": 1000.0})
    assert sim.state("loose-1") in ("queued", "processing")


def test_a_worker_with_k_tasks_of_budget_is_given_k_and_never_more():
    sim = sim_at()
    sim.add_worker(W1, nthreads=4, max_tasks=3)
    sim.submit({f"t-{i}": [] for i in range(10)})
    assert len(sim.on(W1)) == 3
    assert sim.ws(W1).assigned == 3
    for key in list(sim.on(W1)):
        sim.finish(key)
    assert sim.on(W1) == set()  # spent: idle, but given nothing
    assert sim.ws(W1) not in sim.s.free_workers
    # Dependents of its results go elsewhere once a worker comes, not there.
    sim.add_worker(W2, nthreads=2)
    ran = sim.run_all()
    assert len(ran) == 7
    assert sim.ws(W1).assigned == 3


def test_budget_counts_every_assignment_also_a_task_sent_again():
    sim = sim_at()
    sim.add_worker(W1, max_tasks=2)
    sim.submit({"a-1": []})
    sim.cancel("a-1")  # released while it ran: the worker counted it too
    sim.drain_all()
    sim.submit({"a-1": []})
    sim.submit({"b-1": []})
    assert sim.ws(W1).assigned == 2
    assert sim.state("b-1") == "queued"
    assert sim.ts("b-1") in sim.s.parked
    (event,) = [e for e in scheduling_events(sim) if e["action"] == "unplaceable"]
    assert "task budget" in event["reason"]


def test_budget_holds_on_the_dependency_path():
    sim = sim_at()
    sim.add_worker(W1, nthreads=2, max_tasks=2)
    sim.submit({"x-1": []})
    sim.finish("x-1", nbytes=10**9)
    sim.add_worker(W2, nthreads=2)
    sim.submit({f"y-{i}": ["x-1"] for i in range(6)})
    on_w1 = sim.on(W1)
    assert len(on_w1) == 1  # one task of budget was left there
    assert sim.ws(W1).assigned == 2


def test_scheduler_info_shows_time_and_tasks_left():
    sim = sim_at()
    sim.add_worker(W1, lifetime=600.0, max_tasks=5)
    sim.add_worker(W2)
    sim.submit({"a-1": []})
    sim.s.tick(T0 + 100)
    infos = {w.address: w for w in sim.s.worker_infos()}
    assert infos[W1].lifetime_left == pytest.approx(500.0)
    assert infos[W1].tasks_left == (4 if sim.worker_of("a-1") == W1 else 5)
    assert infos[W2].lifetime_left is None and infos[W2].tasks_left is None


def test_workers_without_limits_take_no_walltime_path():
    sim = sim_at()
    sim.add_worker(W1, nthreads=2)
    sim.add_worker(W2, nthreads=2)
    sim.submit({f"t-{i}": [] for i in range(8)}, durations={"t-0": 10**9})
    assert sim.s.nlimited == 0
    assert not sim.s.parked  # a huge hint is no problem without lifetimes
    assert sim.ws(W1).assigned == 0  # nothing counted without a budget
    assert len(sim.run_all()) == 8


def test_a_leaving_limited_worker_is_no_longer_counted():
    sim = sim_at()
    sim.add_worker(W1, lifetime=100.0)
    sim.add_worker(W2, max_tasks=5)
    sim.add_worker(W3)
    assert sim.s.nlimited == 2
    sim.remove_worker(W1)
    assert sim.s.nlimited == 1


def test_a_parked_task_released_ends_its_episode():
    sim = sim_at()
    sim.add_worker(W1, lifetime=10.0)
    sim.submit({"big-1": []}, durations={"big-1": 100.0})
    assert sim.s.parked_prefixes == {"big": 1}
    sim.release("big-1")
    assert sim.state("big-1") == "forgotten"
    assert not sim.s.parked and not sim.s.parked_prefixes
    assert not sim.s.hints


def test_the_event_goes_to_every_client_when_nobody_wants_the_task():
    sim = sim_at(clients=("c", "d"))
    sim.add_worker(W1, lifetime=10.0)
    sim.submit({"dep-1": [], "out-1": ["dep-1"]}, wanted=["out-1"], durations={"dep-1": 100.0})
    assert sim.state("dep-1") == "queued"
    assert [n.key for n in unplaceable_notes(sim, "c")] == ["dep-1"]
    assert [n.key for n in unplaceable_notes(sim, "d")] == ["dep-1"]


def test_a_parked_task_is_queued_again_when_its_measured_duration_falls():
    sim = sim_at()
    sim.add_worker(W1, lifetime=1000.0)
    sim.add_worker(W2)
    sim.submit({"p-1": []}, durations={"p-1": 1.0})
    sim.finish("p-1", duration=5000.0)  # prefix "p" measured at 5000 s
    sim.remove_worker(W2)
    sim.submit({"p-2": []})
    assert sim.ts("p-2") in sim.s.parked
    sim.submit({"p-3": []}, durations={"p-3": 1.0})
    sim.finish("p-3", duration=1.0)
    sim.submit({"p-4": []}, durations={"p-4": 1.0})
    sim.finish("p-4", duration=1.0)  # mean now (5000 + 1 + 1) / 3 ~ 1667 s: still too long
    for i in range(5, 15):
        sim.submit({f"p-{i}": []}, durations={f"p-{i}": 1.0})
        sim.finish(f"p-{i}", duration=1.0)
    assert sim.ts("p-2").prefix.mean_duration < 1000.0 - 200
    sim.s.tick(T0 + 200)  # past the periodic recheck
    sim.submit({"other-1": []}, durations={"other-1": 1.0})  # any event
    assert sim.worker_of("p-2") == W1


def test_bad_worker_limits_are_refused():
    sim = sim_at()
    with pytest.raises(ValueError, match="remaining lifetime"):
        sim.add_worker(W1, lifetime=-1.0)
    with pytest.raises(ValueError, match="task budget"):
        sim.add_worker(W1, max_tasks=-1)
    assert not sim.s.workers


def test_computes_never_exceed_budget_under_churn():
    """Many tasks, two budget-limited workers joining and leaving: count ComputeTasks."""
    sim = sim_at()
    sent: dict[str, int] = {}
    budgets = {W1: 4, W2: 7}
    for address, budget in budgets.items():
        sim.add_worker(address, nthreads=3, max_tasks=budget)
    sim.submit({f"t-{i}": [] for i in range(30)})
    for _ in range(50):
        for address in budgets:
            if address in sim.s.workers:
                sent[address] = sent.get(address, 0) + len(
                    [m for m in sim.to_worker(address) if isinstance(m, ComputeTask)]
                )
        processing = sorted(sim.processing(), key=repr)
        if not processing:
            break
        sim.finish(processing[0])
    assert sent[W1] <= 4 and sent[W2] <= 7
    assert sent[W1] + sent[W2] == 11  # every budget used, then the rest wait
    assert sum(1 for s in sim.states().values() if s == "queued") == 30 - 11


def test_two_workers_spent_at_once_keep_their_results_until_a_fresh_one_comes():
    sim = sim_at()
    sim.add_worker(W1, max_tasks=1)
    sim.add_worker(W2, max_tasks=1)
    sim.submit({"a-1": [], "a-2": []})
    w1, w2 = sim.worker_of("a-1"), sim.worker_of("a-2")
    assert {w1, w2} == {W1, W2}
    sim.finish("a-1")
    sim.finish("a-2")
    sim.clear()
    # both leave at once, each holding a result only it has
    sim.s.handle_worker(W1, WorkerLeaving("budget", True, "leave-1", walltime=True))
    sim.s.handle_worker(W2, WorkerLeaving("budget", True, "leave-2", walltime=True))
    # the first hands its result to the second (which waits: nobody could take its own)
    copies = [msg for msg in sim.to_worker(w2) if isinstance(msg, CopyKeys)]
    assert [d.key for c in copies for d in c.deps] == ["a-1"]
    assert set(sim.s.waiting_to_leave) == {W2}
    sim.s.handle_worker(W2, AddKeys(["a-1"], [8], "copied"))
    assert W1 not in sim.s.workers  # gone, nothing lost
    assert sim.holds(W2) == {"a-1", "a-2"}
    assert sim.state("a-1") == sim.state("a-2") == "memory"
    sim.submit({"b-1": []})
    assert sim.state("b-1") == "queued"  # the waiting leaver is given nothing
    # a fresh worker comes: the waiting one hands everything to it and goes
    sim.add_worker(W3, max_tasks=5)
    copied = {d.key for c in sim.to_worker(W3) if isinstance(c, CopyKeys) for d in c.deps}
    assert copied == {"a-1", "a-2"}
    assert sim.worker_of("b-1") == W3
    sim.s.handle_worker(W3, AddKeys(["a-1", "a-2"], [8, 8], "copied-3"))
    assert W2 not in sim.s.workers and not sim.s.waiting_to_leave
    assert sim.holds(W3) >= {"a-1", "a-2"}
    assert sim.s.suspicious == {}


def test_a_walltime_leaver_holding_nothing_goes_at_once():
    sim = sim_at()
    sim.add_worker(W1, max_tasks=1)
    sim.submit({"a-1": []}, wanted=[])
    sim.finish("a-1")  # not wanted: released at once
    sim.s.handle_worker(W1, WorkerLeaving("budget", True, "leave-1", walltime=True))
    assert W1 not in sim.s.workers


def test_a_loose_restriction_runs_elsewhere_when_its_named_worker_has_no_budget_left():
    sim = sim_at()
    sim.add_worker(W1, max_tasks=1)
    sim.add_worker(W2)
    prefer_w1 = TaskRestrictions(workers=[W1], allow_other_workers=True)
    sim.submit({"a-1": [], "a-2": []}, restrictions={"a-1": prefer_w1, "a-2": prefer_w1})
    assert sorted([sim.worker_of("a-1"), sim.worker_of("a-2")]) == [W1, W2]
    strict_w1 = TaskRestrictions(workers=[W1])
    sim.submit({"b-1": []}, restrictions={"b-1": strict_w1})
    assert sim.ts("b-1") in sim.s.parked  # a strict one waits (W1 may never take it)
