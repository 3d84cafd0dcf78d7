"""The adaptive policy, ``workers_to_close`` and ``ScaleRequest`` in the scheduler core,
with simulated time and no network."""

from __future__ import annotations

import pytest
from scheduler_harness import Sim, addr

from shoal.core.scheduler.adaptive import AdaptivePolicy, PrefixLoad, Snapshot, WorkerLoad
from shoal.protocol.messages import (
    CloseWorker,
    CopyKeys,
    Heartbeat,
    ScaleReply,
    ScaleRequest,
    WorkerStatus,
)

# --- the policy alone ---------------------------------------------------------------------


def workers(n: int, nthreads: int = 1, **kw) -> list[WorkerLoad]:
    return [WorkerLoad(str(i), nthreads, **kw) for i in range(n)]


def snap(prefixes=(), n_workers: int = 1, nthreads: int = 1, launching: int = 0, **kw) -> Snapshot:
    return Snapshot(list(prefixes), workers(n_workers, nthreads, **kw), launching)


def test_target_from_measured_durations_and_default():
    policy = AdaptivePolicy(maximum=100, target_duration=5.0, default_task_duration=0.5)
    # 20 tasks of 1 s measured + 10 never measured at 0.5 s: 25 s of work -> 5 threads.
    load = [PrefixLoad("inc", 20, 1.0), PrefixLoad("new", 10, None)]
    d = policy.recommend(snap(load), now=10.0)
    assert (d.action, d.target, d.numbers["threads_needed"]) == ("up", 5, 5)
    assert d.numbers["work_seconds"] == 25.0 and d.numbers["unmeasured_tasks"] == 10
    assert "30 tasks" in d.reason and "10 at the default duration" in d.reason
    assert d.time == 10.0
    # The default is the policy's: at 2 s per unmeasured task the same load needs 8.
    policy = AdaptivePolicy(maximum=100, target_duration=5.0, default_task_duration=2.0)
    assert policy.recommend(snap(load), 0).target == 8


def test_threads_per_worker_divide_and_few_long_tasks_ask_one_thread_each():
    policy = AdaptivePolicy(maximum=100, target_duration=1.0)
    # 40 s of work in 1 s is 40 threads: 10 workers of 4 threads.
    d = policy.recommend(snap([PrefixLoad("a", 40, 1.0)], n_workers=2, nthreads=4), 0)
    assert d.target == 10
    # Two tasks of 100 s: two threads, not 200.
    d = policy.recommend(snap([PrefixLoad("slow", 2, 100.0)], n_workers=1), 0)
    assert d.target == 2
    # With no worker yet, the cluster's threads per worker are used.
    s = Snapshot([PrefixLoad("a", 8, 1.0)], [], 0, threads_per_worker=2)
    assert policy.recommend(s, 0).target == 4
    # Instant tasks still need one worker; no tasks need none.
    assert AdaptivePolicy().recommend(snap([PrefixLoad("a", 3, 0.0)], n_workers=0), 0).target == 1
    assert AdaptivePolicy().recommend(snap([], n_workers=0), 0).action == "same"


def test_clamped_to_minimum_and_maximum():
    policy = AdaptivePolicy(minimum=2, maximum=3, target_duration=1.0)
    d = policy.recommend(snap([PrefixLoad("a", 100, 1.0)], n_workers=1), 0)
    assert (d.proposed, d.target, d.action) == (100, 3, "up")
    assert "clamped to [2, 3]" in d.reason
    d = policy.recommend(snap([], n_workers=0), 0)
    assert (d.proposed, d.target, d.action) == (0, 2, "up")


def test_scale_down_only_after_wait_count_lower_proposals_in_a_row():
    policy = AdaptivePolicy(maximum=10, target_duration=1.0, wait_count=3)
    busy = snap([PrefixLoad("a", 4, 1.0)], n_workers=4)
    idle = snap([], n_workers=4)
    waiting = [policy.recommend(idle, t) for t in range(2)]
    assert [(d.action, d.target) for d in waiting] == [("wait", 4), ("wait", 4)]  # held
    # A proposal that is not lower breaks the run: counting starts again.
    policy = AdaptivePolicy(maximum=10, target_duration=1.0, wait_count=3)
    actions = [policy.recommend(s, 0).action for s in (idle, idle, busy, idle, idle)]
    assert actions == ["wait", "wait", "same", "wait", "wait"]
    d = policy.recommend(idle, 0)
    assert (d.action, d.target) == ("down", 0)
    assert d.numbers["lower_in_a_row"] == 3 and "down to 0" in d.reason
    # A falling proposal goes down to the largest of the last wait_count.
    policy = AdaptivePolicy(maximum=10, target_duration=1.0, wait_count=2)
    policy.recommend(snap([PrefixLoad("a", 3, 1.0)], n_workers=4), 0)
    d = policy.recommend(snap([PrefixLoad("a", 1, 1.0)], n_workers=4), 0)
    assert (d.action, d.target) == ("down", 3)


def test_scale_up_is_at_once():
    policy = AdaptivePolicy(maximum=10, target_duration=1.0, wait_count=5)
    d = policy.recommend(snap([PrefixLoad("a", 6, 1.0)], n_workers=1), 0)
    assert (d.action, d.target) == ("up", 6)


def test_paused_or_spilling_workers_ask_for_more():
    policy = AdaptivePolicy(maximum=10)
    ws = [
        WorkerLoad("0", 1, paused=True),
        WorkerLoad("1", 1, memory=700, memory_limit=1000),  # over 60%: spilling
        WorkerLoad("2", 1, memory=100, memory_limit=1000),
    ]
    d = policy.recommend(Snapshot([], ws), 0)
    assert (d.action, d.target) == ("up", 5)
    assert d.numbers["memory_pressure"] == ["0", "1"]
    assert "2 paused or spilling workers ask for 5" in d.reason


def test_retiring_workers_are_not_counted_and_launching_ones_are():
    policy = AdaptivePolicy(maximum=10, target_duration=1.0)
    ws = [WorkerLoad("0", 1), WorkerLoad("1", 1, retiring=True)]
    d = policy.recommend(Snapshot([PrefixLoad("a", 2, 1.0)], ws, launching=1), 0)
    assert (d.current, d.action) == (2, "same")


def test_bad_settings_are_refused_with_the_option_named():
    with pytest.raises(ValueError, match=r"minimum \(3\) must not exceed maximum \(2\)"):
        AdaptivePolicy(minimum=3, maximum=2)
    with pytest.raises(ValueError, match="wait_count"):
        AdaptivePolicy(wait_count=0)
    with pytest.raises(ValueError, match="target_duration"):
        AdaptivePolicy(target_duration=0)
    with pytest.raises(ValueError, match="minimum"):
        AdaptivePolicy(minimum=-1)
    with pytest.raises(ValueError, match="default_task_duration"):
        AdaptivePolicy(default_task_duration=float("nan"))


# --- in the scheduler core ------------------------------------------------------------------


def names(*addresses: str) -> list[str]:
    return [a.split("//")[-1] for a in addresses]


def scale(sim: Sim, cluster: list[str], n: int = -1, client: str = "c", **kw) -> ScaleReply:
    sim.s.handle_client(client, ScaleRequest(1, list(cluster), n, **kw))
    [reply] = [m for m in sim.to_client(client) if isinstance(m, ScaleReply)]
    assert not reply.error, reply.error
    return reply


def adapt(sim: Sim, cluster: list[str], **kw) -> ScaleReply:
    kw.setdefault("session", "s1")
    kw.setdefault("maximum", 10)
    kw.setdefault("target_duration", 1.0)
    kw.setdefault("wait_count", 1)
    return scale(sim, cluster, **kw)


def closes(sim: Sim, address: str) -> bool:
    return any(isinstance(m, CloseWorker) for m in sim.comm.workers.get(address, []))


def test_workers_to_close_idle_first_then_least_data():
    sim = Sim({addr(i): 1 for i in range(1, 5)})
    sim.scatter(addr(1), {"big": 1000})
    sim.scatter(addr(2), {"small": 10})
    sim.submit({"run": []})
    busy = sim.worker_of("run")
    chosen = [ws.address for ws in sim.s.workers_to_close(4)]
    idle_empty = [a for a in (addr(3), addr(4)) if a != busy]
    assert chosen[: len(idle_empty)] == sorted(idle_empty, reverse=True)  # newest first
    idle_with_data = [a for a in (addr(2), addr(1)) if a != busy]
    assert chosen[len(idle_empty) : len(idle_empty) + len(idle_with_data)] == idle_with_data
    assert len(chosen) < 4  # someone must stay to take the data
    assert sim.s.workers_to_close(0) == []


def test_workers_to_close_leaves_room_for_the_data():
    sim = Sim({})
    for i in (1, 2, 3):
        sim.add_worker(addr(i), memory_limit=1000)
    sim.scatter(addr(1), {"a": 600})
    sim.scatter(addr(2), {"b": 600})
    # Closing w3 then w1 would leave w2 with 400 bytes free for 600: only w3 goes.
    assert [ws.address for ws in sim.s.workers_to_close(3)] == [addr(3)]


def test_adapt_scales_up_from_zero_and_down_to_minimum_with_events():
    sim = Sim({})
    reply = adapt(sim, [])
    assert (reply.action, reply.start) == ("same", 0)
    sim.submit({f"t{i}": [] for i in range(6)}, func={f"t{i}": "f" for i in range(6)})
    reply = adapt(sim, [], threads_per_worker=2)
    # 6 unmeasured tasks at 0.5 s = 3 s of work in 1 s: 3 threads, 2 workers of 2.
    assert (reply.action, reply.target, reply.start) == ("up", 2, 2)
    # Started and not joined: counted, nothing more is started.
    assert adapt(sim, ["a", "b"], threads_per_worker=2).start == 0
    sim.add_worker(addr(1), 2, name="a")
    sim.add_worker(addr(2), 2, name="b")
    sim.run_all()
    sim.release(*[f"t{i}" for i in range(6)])
    reply = adapt(sim, ["a", "b"], minimum=1)
    assert (reply.action, reply.target) == ("down", 1)
    assert len(reply.closing) == 1
    gone = addr(1) if reply.closing == ["a"] else addr(2)
    assert closes(sim, gone) and gone not in sim.s.workers  # no data: closed at once
    # Listed by the cluster until its process exits, but never counted again.
    assert adapt(sim, ["a", "b"], minimum=1).action == "same"
    events = [e for _, e in sim.s.events.get("adaptive")]
    assert [e["action"] for e in events] == ["same", "up", "same", "down", "same"]
    up = events[1]
    assert up["start"] == 2 and up["tasks"] == 6 and "6 tasks" in up["reason"]
    assert events[3]["closing"] == reply.closing and "down to 1" in events[3]["reason"]


def test_the_same_nothing_decision_is_logged_once():
    sim = Sim({addr(1): 1})
    for _ in range(5):
        adapt(sim, ["w1:1"], minimum=1)
    assert len(sim.s.events.get("adaptive")) == 1


def test_scale_down_retires_gracefully_and_keeps_the_data():
    sim = Sim({addr(1): 1, addr(2): 1, addr(3): 1})
    sim.scatter(addr(1), {"x": 100})
    sim.scatter(addr(2), {"y": 50})
    cluster = names(addr(1), addr(2), addr(3))
    reply = scale(sim, cluster, n=1)
    assert reply.closing == ["w3:1", "w2:1"]  # idle and empty first, then least data
    assert addr(3) not in sim.s.workers  # nothing to copy: closed at once
    assert sim.ws(addr(2)).status == "retiring"
    [copy] = [m for m in sim.to_worker(addr(1)) if isinstance(m, CopyKeys)]
    assert [d.key for d in copy.deps] == ["y"]
    # Still copying: not counted twice, so nothing more is closed.
    reply = scale(sim, cluster, n=1)
    assert (reply.action, reply.closing) == ("same", [])
    sim.add_keys(addr(1), {"y": 50})
    assert addr(2) not in sim.s.workers and sim.state("y") == "memory"
    assert sim.s.suspicious == {} and sim.s.scaling_down == {}


def test_scale_up_cancels_retirements_not_yet_done():
    sim = Sim({addr(1): 1, addr(2): 1, addr(3): 1})
    sim.scatter(addr(1), {"x": 200})
    sim.scatter(addr(2), {"y": 50})
    sim.scatter(addr(3), {"z": 70})
    cluster = names(addr(1), addr(2), addr(3))
    sim.s.handle_worker(addr(3), WorkerStatus("paused", "p"))
    reply = scale(sim, cluster, n=1)
    assert sorted(reply.closing) == ["w2:1", "w3:1"]
    assert sim.s.scaling_down == {addr(2): "running", addr(3): "paused"}
    sim.s.handle_worker(addr(3), WorkerStatus("running", "r"))  # reported while retiring
    reply = scale(sim, cluster, n=3)
    assert (reply.action, reply.start) == ("up", 0)
    assert sorted(reply.resumed) == ["w2:1", "w3:1"]
    assert sim.ws(addr(2)).status == sim.ws(addr(3)).status == "running"
    assert addr(3) in sim.s.runnable and not sim.s.retiring and not sim.s.scaling_down
    sim.add_keys(addr(1), {"y": 50})  # a copy that was on its way: a replica, no more
    assert addr(2) in sim.s.workers and not closes(sim, addr(2))
    sim.submit({"t": []})
    assert sim.s.tasks["t"].processing_on is not None
    # Resumed workers are counted again: scale(3) once more has nothing to do.
    assert scale(sim, cluster, n=3).action == "same"


def test_scale_up_starts_only_what_cancelling_does_not_cover():
    sim = Sim({addr(1): 1, addr(2): 1})
    sim.scatter(addr(1), {"x": 200})
    sim.scatter(addr(2), {"y": 50})
    cluster = names(addr(1), addr(2))
    assert scale(sim, cluster, n=1).closing == ["w2:1"]
    reply = scale(sim, cluster, n=4)
    assert (reply.resumed, reply.start) == (["w2:1"], 2)


def test_a_worker_leaving_on_its_own_is_not_resumed():
    from shoal.protocol.messages import WorkerLeaving

    sim = Sim({addr(1): 1, addr(2): 1})
    sim.scatter(addr(1), {"x": 200})
    sim.scatter(addr(2), {"y": 50})
    cluster = names(addr(1), addr(2))
    assert scale(sim, cluster, n=1).closing == ["w2:1"]
    sim.s.handle_worker(addr(2), WorkerLeaving("SIGTERM", True, "leave"))
    reply = scale(sim, cluster, n=2)
    assert reply.resumed == [] and reply.start == 1


def test_scale_down_stops_workers_not_yet_joined_first():
    sim = Sim({addr(1): 1})
    reply = scale(sim, ["w1:1", "new1", "new2"], n=1)
    assert reply.stop == ["new2", "new1"] and reply.closing == []
    assert addr(1) in sim.s.workers
    # Stopped ones are not counted while the cluster still lists them.
    assert scale(sim, ["w1:1", "new1", "new2"], n=1).action == "same"
    assert scale(sim, ["w1:1"], n=2).start == 1


def test_the_last_worker_holding_data_is_kept():
    sim = Sim({addr(1): 1})
    sim.scatter(addr(1), {"x": 10})
    reply = scale(sim, ["w1:1"], n=0)
    assert reply.closing == [] and addr(1) in sim.s.workers
    [event] = [e for _, e in sim.s.events.get("adaptive")]
    assert "kept 1 more" in event["reason"]
    sim.release("x")
    assert scale(sim, ["w1:1"], n=0).closing == ["w1:1"]
    assert addr(1) not in sim.s.workers


def test_adapt_settings_refused_and_scale_ends_the_session():
    sim = Sim({addr(1): 1})
    sim.s.handle_client("c", ScaleRequest(1, ["w1:1"], minimum=3, maximum=2))
    [reply] = sim.to_client()
    assert "minimum (3) must not exceed maximum (2)" in reply.error
    adapt(sim, ["w1:1"], wait_count=3)
    assert "c" in sim.s.adaptive_sessions
    scale(sim, ["w1:1"], n=1)
    assert "c" not in sim.s.adaptive_sessions
    sim.s.remove_client("c", "gone")
    sim.add_client = sim.s.add_client("d")
    adapt(sim, [], client="d")
    assert set(sim.s.adaptive_sessions) == {"d"}


def test_wait_count_memory_is_per_session_and_reset_by_new_settings():
    sim = Sim({addr(1): 1, addr(2): 1})
    cluster = names(addr(1), addr(2))
    assert adapt(sim, cluster, wait_count=2).action == "wait"
    assert adapt(sim, cluster, wait_count=2, session="s2").action == "wait"  # a new loop
    assert adapt(sim, cluster, wait_count=2, session="s2").action == "down"


def test_spilling_worker_asks_for_more_through_heartbeats():
    sim = Sim({})
    sim.add_worker(addr(1), memory_limit=1000, name="a")
    sim.s.heartbeat(addr(1), Heartbeat(1, memory=900), now=5.0)
    reply = adapt(sim, ["a"])
    assert (reply.action, reply.start) == ("up", 1)


def test_a_pinned_worker_is_never_closed():
    sim = Sim({addr(1): 1, addr(2): 1, addr(3): 1})
    sim.scatter(addr(1), {"x": 100})
    pin = sim.s.add_pin([addr(2), addr(3)], "shuffle", "client:c", None, "pin-1")
    assert [ws.address for ws in sim.s.workers_to_close(3)] == [addr(1)]
    # Idle, empty and pinned: scale(0) and adapt keep them; only w1 could go, and it
    # holds data that the pinned ones would take.
    reply = scale(sim, names(addr(1), addr(2), addr(3)), n=0)
    assert reply.closing == ["w1:1"]
    assert sim.ws(addr(2)).status == sim.ws(addr(3)).status == "running"
    sim.add_keys(addr(2), {"x": 100})  # the copy lands on a pinned worker: allowed
    assert addr(1) not in sim.s.workers
    [event] = [e for _, e in sim.s.events.get("adaptive")]
    assert "kept 2 more" in event["reason"] and "pinned" in event["reason"]
    sim.s.release_pin(pin.id, "unpin")
    reply = adapt(sim, names(addr(2), addr(3)), minimum=0)
    assert reply.closing == ["w3:1"]  # unpinned now; x is on w2, which stays with it
    assert addr(3) not in sim.s.workers and addr(2) in sim.s.workers


def test_events_are_stamped_with_the_scheduler_wall_clock():
    sim = Sim({addr(1): 1})
    sim.s.tick(1234.5)
    scale(sim, ["w1:1"], n=2)
    [(when, event)] = sim.s.events.get("adaptive")
    assert when == 1234.5
    assert event["action"] == "up" and event["start"] == 1 and event["client"] == "c"
    assert event["reason"] == "scale(2) asked by the cluster (have 1)"


def test_a_worker_ending_within_replace_ahead_is_replaced_while_it_works():
    # A job-queue cluster asks with its jobs' start-up as replace_ahead: a worker whose
    # lifetime ends sooner is leaving already, so its replacement starts now, and it
    # is never the one closed (it leaves by itself).
    sim = Sim(workers={})
    sim.s.tick(1000.0)
    sim.add_worker(addr(1), lifetime=100.0)
    sim.add_worker(addr(2), lifetime=300.0)
    cluster = ["w1:1", "w2:1"]
    assert scale(sim, cluster, n=2, replace_ahead=20.0).action == "same"
    sim.s.tick(1085.0)  # w1 has 15 s left: within 20
    reply = scale(sim, cluster, n=2, replace_ahead=20.0)
    assert reply.action == "up" and reply.start == 1
    [event] = [e for _, e in sim.s.events.get("adaptive") if e.get("action") == "up"]
    assert "1 ending within 20s not counted" in event["reason"]
    # With the replacement launching, nothing more; a scale-down never picks w1.
    assert scale(sim, [*cluster, "new1"], n=2, replace_ahead=20.0).action == "same"
    reply = scale(sim, [*cluster, "new1"], n=1, replace_ahead=20.0)
    assert "w1:1" not in reply.closing and not closes(sim, addr(1))
    # Without replace_ahead (a cluster that does not ask), w1 counts until it goes.
    assert scale(sim, cluster, n=2).action == "same"
