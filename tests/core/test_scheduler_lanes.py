"""Lanes in the scheduler core (``shoal/core/scheduler/lanes.py``): who is granted one
and where, every way a lane closes (and who is told), and what a worker's report of a
lane's run (``LaneRan``) changes. Every Sim validates its state after each event, and
its RecordingComm round-trips every message the core emits through the real encoder."""

from __future__ import annotations

import pytest
from scheduler_harness import W1, W2, W3, Sim

from shoal.core.scheduler.model import TaskPrefix
from shoal.protocol.messages import (
    CloseWorker,
    LaneBusy,
    LaneClosed,
    LaneDurations,
    LaneGrant,
    LaneOpen,
    LaneRan,
    LaneRequest,
    LaneRunGraph,
    Message,
    RetireReply,
    RetireWorkers,
    TaskStreamRecord,
    WorkerLeaving,
    WorkerStatus,
)

NO_WORKER = "no running worker without a walltime or task budget"
LANE_MESSAGES = (LaneGrant, LaneOpen, LaneClosed)


def lane_msgs(msgs: list[Message]) -> list[Message]:
    return [msg for msg in msgs if isinstance(msg, LANE_MESSAGES)]


def to_client(sim: Sim, client: str = "c") -> list[Message]:
    return lane_msgs(sim.to_client(client))


def to_worker(sim: Sim, address: str) -> list[Message]:
    return lane_msgs(sim.to_worker(address))


def ask(sim: Sim, client: str = "c", request_id: int = 1) -> LaneGrant:
    """``client`` asks for a lane: the one grant it is answered with."""
    sim.s.handle_client(client, LaneRequest(request_id))
    grants = [msg for msg in sim.comm.clients.get(client, []) if isinstance(msg, LaneGrant)]
    assert len(grants) == 1, grants
    (grant,) = grants
    assert grant.request_id == request_id
    sim.comm.clients[client] = [m for m in sim.comm.clients[client] if m is not grant]
    return grant


def granted(sim: Sim, client: str = "c", request_id: int = 1) -> LaneGrant:
    grant = ask(sim, client, request_id)
    assert grant.lane and grant.worker and not grant.reason, grant
    return grant


def pause(sim: Sim, address: str) -> None:
    sim.s.handle_worker(address, WorkerStatus("paused", "mem-high"))


def resume(sim: Sim, address: str) -> None:
    sim.s.handle_worker(address, WorkerStatus("running", "mem-ok"))


def closed_because(
    reason_part: str, msgs: list[Message], lane: str, gone: bool | None = False
) -> None:
    """``msgs`` are one LaneClosed of ``lane``, its reason saying ``reason_part``;
    ``gone``: whether it says the worker left the cluster (None: not checked)."""
    assert [type(msg) for msg in msgs] == [LaneClosed], msgs
    (msg,) = msgs
    assert msg.lane == lane and reason_part in msg.reason, msg
    assert gone is None or msg.gone is gone, msg


def prefix_with_a_run(sim: Sim) -> TaskPrefix:
    """The prefix "inc", known to the scheduler from one task run through it."""
    sim.submit({"inc-1": []})
    sim.finish("inc-1")
    return sim.s.prefixes["inc"]


# --- granting ----------------------------------------------------------------------------


def test_a_request_is_granted_on_a_running_worker():
    sim = Sim({W1: 2})
    sim.clear()
    sim.s.handle_client("c", LaneRequest(7))
    (grant,) = to_client(sim)
    assert isinstance(grant, LaneGrant)
    assert (grant.request_id, grant.worker, grant.reason) == (7, W1, "")
    assert grant.lane
    assert to_worker(sim, W1) == [LaneOpen(grant.lane, "c")]
    lane = sim.s.lanes[grant.lane]
    assert (lane.id, lane.client, lane.worker) == (grant.lane, "c", W1)
    assert sim.s.lane_of_client == {"c": lane}
    assert sim.s.lanes_of_worker == {W1: {grant.lane: lane}}
    assert sim.s.log.story("lane-open") == [("lane-open", grant.lane, "c", W1)]


def test_lanes_have_distinct_ids():
    sim = Sim({W1: 1}, clients=("c", "d", "e"))
    lanes = {granted(sim, client).lane for client in ("c", "d", "e")}
    assert len(lanes) == 3 and set(sim.s.lanes) == lanes


def test_no_worker_no_lane():
    sim = Sim({})
    grant = ask(sim, request_id=3)
    assert grant == LaneGrant(3, "", "", NO_WORKER)
    assert not sim.s.lanes and not sim.s.lane_of_client and not sim.s.lanes_of_worker
    assert sim.comm.workers == {}


@pytest.mark.parametrize("limit", [{"lifetime": 3600.0}, {"max_tasks": 100}, {"lifetime": 0.0}])
def test_no_lane_on_a_worker_with_a_walltime_or_a_task_budget(limit):
    sim = Sim({})
    sim.add_worker(W1, **limit)
    sim.add_worker(W2, **limit)
    sim.clear()
    grant = ask(sim)
    assert grant.lane == "" and grant.worker == ""
    assert "walltime" in grant.reason and "task budget" in grant.reason
    assert not sim.s.lanes and to_worker(sim, W1) == [] == to_worker(sim, W2)
    sim.add_worker(W3)  # an unlimited one comes: it is granted there
    assert granted(sim, request_id=2).worker == W3


def test_no_lane_on_a_paused_worker_and_one_after_it_resumes():
    sim = Sim({W1: 1})
    pause(sim, W1)
    sim.clear()
    grant = ask(sim)
    assert grant == LaneGrant(1, "", "", NO_WORKER) and "running" in grant.reason
    assert not sim.s.lanes and to_worker(sim, W1) == []
    resume(sim, W1)
    assert granted(sim, request_id=2).worker == W1


def test_no_lane_on_a_retiring_worker():
    sim = Sim({W1: 1, W2: 1})
    sim.scatter(W1, {"x": 8})
    sim.s.handle_client("c", RetireWorkers(1, [W1]))
    assert sim.ws(W1).status == "retiring"
    assert granted(sim, request_id=2).worker == W2
    assert granted(sim, request_id=3).worker == W2  # asked again: still not W1


def test_a_paused_worker_is_skipped_for_a_running_one():
    sim = Sim({W1: 1, W2: 1})
    pause(sim, W1)
    assert granted(sim).worker == W2


def test_the_worker_with_fewest_lanes_is_chosen():
    sim = Sim({W1: 1, W2: 1}, clients=("c", "d"))
    first = granted(sim, "c")
    second = granted(sim, "d")
    assert {first.worker, second.worker} == {W1, W2}
    assert {a: len(lanes) for a, lanes in sim.s.lanes_of_worker.items()} == {W1: 1, W2: 1}
    sim.s.add_client("e")
    sim.add_worker(W3)
    assert granted(sim, "e").worker == W3  # the one with none


def test_between_workers_with_as_many_lanes_the_least_occupied_is_chosen():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    busy = sim.worker_of("a")
    idle = W2 if busy == W1 else W1
    assert granted(sim).worker == idle


def test_a_worker_without_threads_is_not_chosen():
    sim = Sim({})
    sim.add_worker(W1, nthreads=0)
    assert ask(sim) == LaneGrant(1, "", "", NO_WORKER)
    sim.add_worker(W2, nthreads=1)
    assert granted(sim, request_id=2).worker == W2


# --- closing: the worker ----------------------------------------------------------------


def test_pausing_a_worker_closes_its_lanes_and_resuming_allows_new_ones():
    sim = Sim({W1: 1, W2: 1}, clients=("c", "d"))
    lane_c = granted(sim, "c")
    lane_d = granted(sim, "d")
    paused = lane_c.worker
    other = lane_d.worker
    assert paused != other
    sim.clear()
    pause(sim, paused)
    closed_because("takes no new tasks", to_client(sim, "c"), lane_c.lane)
    closed_because("takes no new tasks", to_worker(sim, paused), lane_c.lane)
    assert to_client(sim, "d") == [] and to_worker(sim, other) == []  # untouched
    assert set(sim.s.lanes) == {lane_d.lane} and "c" not in sim.s.lane_of_client
    assert paused not in sim.s.lanes_of_worker
    # Asked meanwhile: the other worker, though it has a lane already.
    assert granted(sim, "c", request_id=2).worker == other
    resume(sim, paused)
    sim.s.add_client("e")
    assert granted(sim, "e").worker == paused  # open to lanes again
    assert lane_c.lane not in sim.s.lanes


def test_pausing_twice_or_a_resume_while_running_changes_nothing():
    sim = Sim({W1: 1})
    grant = granted(sim)
    resume(sim, W1)  # already running
    assert set(sim.s.lanes) == {grant.lane}
    pause(sim, W1)
    sim.clear()
    pause(sim, W1)  # already paused: nothing more to close
    assert to_client(sim) == [] and to_worker(sim, W1) == []


def test_retiring_a_worker_closes_its_lanes_and_tells_both_sides():
    sim = Sim({W1: 1, W2: 1})
    grant = granted(sim)
    sim.scatter(grant.worker, {"x": 8})  # it holds data: it stays, retiring, a while
    sim.clear()
    sim.s.handle_client("c", RetireWorkers(1, [grant.worker]))
    assert sim.ws(grant.worker).status == "retiring"
    closed_because("takes no new tasks", to_client(sim), grant.lane)
    closed_because("takes no new tasks", to_worker(sim, grant.worker), grant.lane)
    assert not sim.s.lanes and not sim.s.lane_of_client and not sim.s.lanes_of_worker


def test_a_worker_retired_at_once_is_told_its_lanes_closed_before_it_is_closed():
    sim = Sim({W1: 1, W2: 1})
    grant = granted(sim)
    sim.clear()
    sim.s.handle_client("c", RetireWorkers(1, [grant.worker]))
    assert grant.worker not in sim.s.workers  # nothing to copy: gone at once
    msgs = sim.to_worker(grant.worker)
    kinds = [type(msg) for msg in msgs]
    assert kinds == [LaneClosed, CloseWorker], msgs
    assert msgs[0].lane == grant.lane
    to_c = sim.to_client()
    # closed as it stopped taking tasks, then told gone as it was removed (a run there
    # could still be waited on)
    assert [type(msg) for msg in to_c] == [LaneClosed, LaneClosed, RetireReply], to_c
    assert [(msg.lane, msg.gone) for msg in to_c[:2]] == [(grant.lane, False), (grant.lane, True)]
    assert not sim.s.lanes


def test_a_refused_retirement_keeps_the_lanes():
    sim = Sim({W1: 1})
    grant = granted(sim)
    sim.clear()
    sim.s.handle_client("c", RetireWorkers(1, [W1]))  # nobody to take its data: refused
    (reply,) = sim.to_client()
    assert isinstance(reply, RetireReply) and W1 in reply.refused
    assert set(sim.s.lanes) == {grant.lane} and to_worker(sim, W1) == []


def test_retiring_a_paused_worker_has_nothing_more_to_close():
    sim = Sim({W1: 1, W2: 1})
    grant = granted(sim)
    sim.scatter(grant.worker, {"x": 8})
    pause(sim, grant.worker)
    sim.clear()
    sim.s.handle_client("c", RetireWorkers(1, [grant.worker]))
    assert to_client(sim) == [] and to_worker(sim, grant.worker) == []


def test_a_retirement_for_scaling_closes_the_lanes_and_cancelling_it_allows_new_ones():
    sim = Sim({W1: 1, W2: 1})
    grant = granted(sim)
    sim.scatter(grant.worker, {"x": 8})
    sim.clear()
    sim.s.retire_for_scaling([sim.ws(grant.worker)], "scale-down")
    closed_because("takes no new tasks", to_client(sim), grant.lane)
    closed_because("takes no new tasks", to_worker(sim, grant.worker), grant.lane)
    assert not sim.s.lanes
    other = W2 if grant.worker == W1 else W1
    assert granted(sim, request_id=2).worker == other
    assert sim.s.cancel_retirement(grant.worker, "scale-up")
    sim.s.add_client("d")
    assert granted(sim, "d").worker == grant.worker


@pytest.mark.parametrize("retire", [False, True])
def test_a_worker_leaving_on_its_own_is_told_its_lanes_closed(retire):
    sim = Sim({W1: 1, W2: 1})
    grant = granted(sim)
    sim.scatter(grant.worker, {"x": 8})
    sim.clear()
    sim.s.handle_worker(grant.worker, WorkerLeaving("SIGTERM", retire, "leave"))
    msgs = sim.to_worker(grant.worker)
    assert isinstance(msgs[0], LaneClosed) and msgs[0].lane == grant.lane, msgs
    assert not lane_msgs(msgs[1:])
    to_c = to_client(sim)
    if not retire:  # removed in the same batch: the client then hears it is gone too
        assert isinstance(msgs[-1], CloseWorker) and grant.worker not in sim.s.workers
        closed_because("left", to_c[1:], grant.lane, gone=True)
        to_c = to_c[:1]
    closed_because("takes no new tasks", to_c, grant.lane, gone=False)
    assert not sim.s.lanes


def test_a_walltime_leaver_that_waits_for_a_home_for_its_data_closes_its_lanes():
    sim = Sim({W1: 1})
    sim.scatter(W1, {"x": 8})  # only it holds x, and nobody could take it
    grant = granted(sim)
    sim.clear()
    sim.s.handle_worker(W1, WorkerLeaving("walltime", True, "leave", walltime=True))
    assert W1 in sim.s.waiting_to_leave  # it stays until another worker comes
    assert sim.ws(W1).budget is not None  # and is given no new task meanwhile ...
    closed_because("is leaving", to_client(sim), grant.lane)  # ... nor lane
    closed_because("is leaving", to_worker(sim, W1), grant.lane)
    assert not sim.s.lanes


def test_removing_a_worker_closes_its_lanes_telling_the_client_only():
    sim = Sim({W1: 1, W2: 1}, clients=("c", "d", "e"))
    grants = {client: granted(sim, client) for client in ("c", "d", "e")}
    gone = grants["c"].worker
    on_gone = {c for c, g in grants.items() if g.worker == gone}
    assert len(on_gone) == 2  # W1, W2, then the one with fewest: two lanes on one
    sim.clear()
    sim.remove_worker(gone)
    assert sim.comm.workers.get(gone, []) == []  # nothing sent to a worker that is gone
    for client, grant in grants.items():
        if client in on_gone:
            closed_because(f"{gone} left", to_client(sim, client), grant.lane, gone=True)
        else:
            assert to_client(sim, client) == []
    assert set(sim.s.lanes) == {g.lane for c, g in grants.items() if c not in on_gone}
    assert gone not in sim.s.lanes_of_worker


def test_removing_a_worker_whose_lane_closed_before_tells_its_client_it_is_gone():
    """A run may still be under way on a lane closed by a pause: its client keeps
    waiting for the answer until told the worker left."""
    sim = Sim({W1: 1}, clients=("c", "d"))
    grant = granted(sim)
    pause(sim, W1)
    closed_because("takes no new tasks", to_client(sim), grant.lane, gone=False)
    sim.s.remove_client("d", "d-left")  # (a client without a lane: told nothing)
    sim.clear()
    sim.remove_worker(W1)
    closed_because("left", to_client(sim), grant.lane, gone=True)
    assert not sim.s.lanes and not sim.s.closed_lanes


def test_a_client_that_left_is_not_told_its_old_lanes_worker_is_gone():
    sim = Sim({W1: 1}, clients=("c", "d"))
    granted(sim)
    pause(sim, W1)
    sim.s.remove_client("c", "c-left")
    assert not sim.s.closed_lanes
    sim.clear()
    sim.remove_worker(W1)
    assert sim.comm.clients == {}


# --- closing: the client ----------------------------------------------------------------


def test_a_client_that_leaves_has_its_lane_closed_at_its_worker():
    sim = Sim({W1: 1}, clients=("c", "d"))
    mine = granted(sim, "c")
    theirs = granted(sim, "d")
    sim.clear()
    sim.s.remove_client("c", "bye")
    closed_because("its client left", to_worker(sim, W1), mine.lane)
    assert sim.comm.clients.get("c", []) == []  # nobody to tell
    assert to_client(sim, "d") == []
    assert set(sim.s.lanes) == {theirs.lane} and "c" not in sim.s.lane_of_client


def test_a_client_asking_again_gets_a_new_lane_and_its_old_one_closes_at_its_worker():
    sim = Sim({W1: 1, W2: 1})
    old = granted(sim, request_id=1)
    sim.clear()
    new = granted(sim, request_id=2)
    assert new.lane != old.lane
    assert to_client(sim) == []  # it knows: it asked for another (the grant says which)
    # The old lane's worker is told first; the new one (on the worker with fewest lanes,
    # which is the same one now that its old lane is closed) then opens.
    assert new.worker == old.worker
    msgs = to_worker(sim, old.worker)
    assert [type(msg) for msg in msgs] == [LaneClosed, LaneOpen], msgs
    assert msgs[0].lane == old.lane and "asked for another" in msgs[0].reason
    assert msgs[1] == LaneOpen(new.lane, "c")
    assert set(sim.s.lanes) == {new.lane} and sim.s.lane_of_client["c"].id == new.lane


def test_a_client_asking_again_with_no_worker_left_keeps_no_lane():
    sim = Sim({W1: 1})
    old = granted(sim)
    pause(sim, W1)
    sim.clear()
    assert ask(sim, request_id=2) == LaneGrant(2, "", "", NO_WORKER)
    assert not sim.s.lanes and to_worker(sim, old.worker) == []  # closed at the pause


# --- turning lanes off ------------------------------------------------------------------


def test_turning_lanes_off_closes_every_lane_and_refuses_new_ones_until_turned_on():
    sim = Sim({W1: 1, W2: 1}, clients=("c", "d", "e"))
    grants = {client: granted(sim, client) for client in ("c", "d", "e")}
    sim.clear()
    why = "a plugin watches transitions"
    sim.s.set_lanes_enabled(False, why)
    sim.s.validate_state()
    assert not sim.s.lanes and not sim.s.lane_of_client and not sim.s.lanes_of_worker
    assert not sim.s.lanes_enabled
    for client, grant in grants.items():
        assert to_client(sim, client) == [LaneClosed(grant.lane, why)]
    for address in (W1, W2):
        told = to_worker(sim, address)
        expected = [LaneClosed(g.lane, why) for g in grants.values() if g.worker == address]
        assert sorted(told, key=repr) == sorted(expected, key=repr)
    assert ask(sim, "c", request_id=2) == LaneGrant(2, "", "", why)
    assert sim.comm.workers == {}
    sim.s.set_lanes_enabled(True)
    sim.s.validate_state()
    assert sim.s.lanes_enabled and sim.s.lanes_off_reason == ""
    assert granted(sim, "c", request_id=3).worker in (W1, W2)


def test_turning_lanes_off_without_a_reason_says_they_are_off():
    sim = Sim({W1: 1})
    grant = granted(sim)
    sim.clear()
    sim.s.set_lanes_enabled(False)
    assert to_client(sim) == [LaneClosed(grant.lane, "lanes are turned off")]
    assert ask(sim, request_id=2).reason == "lanes are turned off"


def test_turning_lanes_off_twice_or_on_twice_is_harmless():
    sim = Sim({W1: 1})
    sim.s.set_lanes_enabled(True)
    grant = granted(sim)
    sim.s.set_lanes_enabled(True)  # on while on: the lane stays
    assert set(sim.s.lanes) == {grant.lane}
    sim.s.set_lanes_enabled(False, "first")
    sim.clear()
    sim.s.set_lanes_enabled(False, "second")
    assert to_client(sim) == [] and to_worker(sim, W1) == []
    assert ask(sim, request_id=2).reason == "second"


# --- runs reported ----------------------------------------------------------------------


def test_a_lane_run_feeds_the_task_stream_and_its_prefix_durations():
    sim = Sim({W1: 1})
    sim.submit({"inc-1": []})
    sim.finish("inc-1", duration=1.0)
    grant = granted(sim)
    prefix = sim.s.prefixes["inc"]
    count, total = prefix.duration_count, prefix.duration_sum
    cursor, _ = sim.s.task_stream.since(0)
    tasks, groups, prefixes = dict(sim.s.tasks), set(sim.s.groups), set(sim.s.prefixes)
    group_counts = {name: tg.duration_count for name, tg in sim.s.groups.items()}
    sim.clear()
    run = LaneRan(grant.lane, "inc-12345", "memory", 100.0, 103.0, 64)
    sim.s.handle_worker(W1, run)
    assert sim.s.lane_runs == 1
    _, new = sim.s.task_stream.since(cursor)
    assert new == [
        TaskStreamRecord("inc-12345", "inc", "inc-12345", W1, 100.0, 103.0, "memory", 64)
    ]
    assert (prefix.duration_count, prefix.duration_sum) == (count + 1, total + 3.0)
    assert prefix.recent_duration is not None
    assert sim.s.tasks == tasks and set(sim.s.groups) == groups and set(sim.s.prefixes) == prefixes
    assert {name: tg.duration_count for name, tg in sim.s.groups.items()} == group_counts
    assert sim.comm.workers == {} and sim.comm.clients == {}  # nothing to tell anyone


def test_a_lane_run_of_an_unknown_prefix_creates_no_task_group_or_prefix():
    sim = Sim({W1: 1})
    grant = granted(sim)
    sim.s.handle_worker(W1, LaneRan(grant.lane, ("load-123", 4), "memory", 5.0, 6.5))
    assert sim.s.lane_runs == 1
    assert not sim.s.tasks and not sim.s.groups and not sim.s.prefixes
    _, records = sim.s.task_stream.since(0)
    assert records == [
        TaskStreamRecord(("load-123", 4), "load", "load-123", W1, 5.0, 6.5, "memory", 0)
    ]


def test_an_erred_lane_run_is_in_the_stream_but_not_in_the_durations():
    sim = Sim({W1: 1})
    prefix = prefix_with_a_run(sim)
    count, total = prefix.duration_count, prefix.duration_sum
    cursor, _ = sim.s.task_stream.since(0)
    sim.s.handle_worker(W1, LaneRan("lane-9", "inc-2", "erred", 1.0, 2.0))
    _, new = sim.s.task_stream.since(cursor)
    assert [(r.key, r.status, r.worker) for r in new] == [("inc-2", "erred", W1)]
    assert (prefix.duration_count, prefix.duration_sum) == (count, total)
    assert sim.s.lane_runs == 1


def test_a_lane_run_whose_clock_went_back_adds_no_duration():
    sim = Sim({W1: 1})
    prefix = prefix_with_a_run(sim)
    count = prefix.duration_count
    sim.s.handle_worker(W1, LaneRan("lane-1", "inc-2", "memory", 10.0, 9.0))
    assert prefix.duration_count == count and sim.s.lane_runs == 1
    assert sim.s.task_stream.since(0)[1][-1].key == "inc-2"


def test_lane_runs_are_counted_whatever_their_lane_became():
    """A run is reported after the worker answered the client: its lane may have
    closed since, or never been known; the report is bookkeeping all the same."""
    sim = Sim({W1: 1})
    grant = granted(sim)
    sim.s.set_lanes_enabled(False, "off")
    sim.s.handle_worker(W1, LaneRan(grant.lane, "a-1", "memory", 0.0, 1.0))
    sim.s.handle_worker(W1, LaneRan("lane-nowhere", "a-2", "memory", 0.0, 1.0))
    sim.s.handle_worker(
        W1,
        LaneRan(grant.lane, "a-3", "memory", 0.0, 1.0),
        LaneRan(grant.lane, "a-4", "erred", 0.0, 1.0),
    )
    assert sim.s.lane_runs == 4
    assert [r.key for r in sim.s.task_stream.since(0)[1]] == ["a-1", "a-2", "a-3", "a-4"]


def test_a_lane_run_with_an_unknown_status_is_refused():
    sim = Sim({W1: 1})
    prefix = prefix_with_a_run(sim)
    count = prefix.duration_count
    cursor = sim.s.task_stream.count
    with pytest.raises(TypeError, match="unknown lane run status 'finished'"):
        sim.s.handle_worker(W1, LaneRan("lane-1", "inc-2", "finished", 0.0, 1.0))
    assert sim.s.lane_runs == 0 and sim.s.task_stream.count == cursor
    assert prefix.duration_count == count


def test_a_lane_run_from_a_worker_that_is_gone_is_ignored():
    sim = Sim({W1: 1, W2: 1})
    sim.remove_worker(W2)
    sim.s.handle_worker(W2, LaneRan("lane-1", "a-1", "memory", 0.0, 1.0))
    assert sim.s.lane_runs == 0 and sim.s.task_stream.since(0)[1] == []


def test_lane_messages_from_the_wrong_side_are_refused():
    sim = Sim({W1: 1})
    with pytest.raises(TypeError, match="a worker may not send LaneRequest"):
        sim.s.handle_worker(W1, LaneRequest(1))
    with pytest.raises(TypeError, match="a client may not send LaneRan"):
        sim.s.handle_client("c", LaneRan("lane-1", "a-1", "memory", 0.0, 1.0))
    graph = LaneRunGraph(1, "lane-1", [], [])
    for msg in (
        LaneOpen("lane-1", "c"),
        LaneClosed("lane-1"),
        LaneGrant(1),
        LaneDurations({"inc": 1.0}),
        graph,
    ):
        with pytest.raises(TypeError, match="may not send"):
            sim.s.handle_client("c", msg)
        with pytest.raises(TypeError, match="may not send"):
            sim.s.handle_worker(W1, msg)
    assert not sim.s.lanes and sim.s.lane_runs == 0


# --- a run that goes on counts as a busy thread ----------------------------------------


def test_a_run_announced_busy_takes_a_thread_until_its_report():
    sim = Sim({W1: 1, W2: 1})
    grant = granted(sim)
    ws = sim.ws(grant.worker)
    assert ws in sim.s.free_workers
    sim.s.handle_worker(grant.worker, LaneBusy(grant.lane, "train-1"))
    assert (ws.ndraining, ws.slot_threads) == (1, 0) and ws not in sim.s.free_workers
    # Root tasks submitted meanwhile go to the other worker's thread, or wait for one.
    sim.clear()
    sim.submit({"inc-1": [], "inc-2": []})
    assert sim.computes(grant.worker) == [] and sim.on(grant.worker) == set()
    other = W2 if grant.worker == W1 else W1
    assert len(sim.on(other)) == 2  # (one runs, one waits its turn there)
    sim.s.handle_worker(grant.worker, LaneRan(grant.lane, "train-1", "memory", 0.0, 9.0))
    assert (ws.ndraining, ws.slot_threads) == (0, 1)
    assert sim.s.lane_runs == 1


def test_a_report_without_an_announcement_frees_nothing():
    sim = Sim({W1: 2})
    grant = granted(sim)
    ws = sim.ws(W1)
    sim.s.handle_worker(W1, LaneBusy(grant.lane, "a-1"))
    sim.s.handle_worker(W1, LaneRan(grant.lane, "a-2", "memory", 0.0, 0.1))  # another run
    assert ws.ndraining == 1
    sim.s.handle_worker(W1, LaneRan(grant.lane, "a-1", "memory", 0.0, 0.1))
    assert ws.ndraining == 0 and ws.slot_threads == 2


def test_a_graphs_reports_free_its_announced_thread_at_its_first_task():
    """A graph run by lane is announced under its first task, and reported task by
    task at its end: the first task's report frees the thread, the others count runs."""
    sim = Sim({W1: 1})
    grant = granted(sim)
    ws = sim.ws(W1)
    sim.s.handle_worker(W1, LaneBusy(grant.lane, ("ones-1", 0)))
    assert ws.ndraining == 1
    sim.s.handle_worker(
        W1,
        LaneRan(grant.lane, ("ones-1", 0), "memory", 0.0, 0.1, 8),
        LaneRan(grant.lane, ("ones-1", 1), "memory", 0.1, 0.2, 8),
        LaneRan(grant.lane, "sum-2", "memory", 0.2, 0.3, 8),
    )
    assert (ws.ndraining, ws.slot_threads) == (0, 1) and sim.s.lane_runs == 3
    stream = sim.s.task_stream.since(0)[1]
    assert [r.key for r in stream] == [("ones-1", 0), ("ones-1", 1), "sum-2"]


# --- the prefixes' durations, shared with the workers that have lanes ------------------


def durations_to(sim: Sim, address: str) -> list[dict[str, float]]:
    return [msg.durations for msg in sim.to_worker(address) if isinstance(msg, LaneDurations)]


def test_a_workers_first_lane_brings_it_every_measured_duration_before_the_lane():
    sim = Sim({W1: 1}, clients=("c", "d"))
    sim.submit({"inc-1": [], "dec-1": []})
    sim.finish("inc-1", duration=0.5)
    sim.submit({"never-1": []})  # a prefix not measured yet is not sent
    sim.clear()
    grant = granted(sim)
    sent = [m for m in sim.to_worker(W1) if isinstance(m, LaneDurations | LaneOpen)]
    assert sent == [LaneDurations({"inc": 0.5}), LaneOpen(grant.lane, "c")]
    sim.clear()
    granted(sim, "d")  # its second lane: it knows them already
    assert durations_to(sim, W1) == []


def test_changed_durations_go_to_the_workers_with_lanes_only():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"inc-1": []})
    sim.finish("inc-1", duration=1.0)
    grant = granted(sim)
    other = W2 if grant.worker == W1 else W1
    sim.s.share_lane_durations()  # the first share: everything measured
    assert durations_to(sim, grant.worker)[-1] == {"inc": 1.0}
    sim.clear()
    sim.s.share_lane_durations()
    assert durations_to(sim, grant.worker) == []  # nothing changed
    prefix = sim.s.prefixes["inc"]
    prefix.add_duration(1.1)  # recent 1.05: within 10% of 1.0
    sim.s.share_lane_durations()
    assert durations_to(sim, grant.worker) == []
    prefix.add_duration(1.5)  # recent 1.275: more than 10% away from what was sent
    sim.submit({"dec-1": []})
    sim.finish("dec-1", duration=0.25)  # first measured
    sim.s.share_lane_durations()
    assert durations_to(sim, grant.worker) == [{"inc": 1.275, "dec": 0.25}]
    assert durations_to(sim, other) == []


def test_no_lanes_nothing_shared():
    sim = Sim({W1: 1})
    sim.submit({"inc-1": []})
    sim.finish("inc-1", duration=1.0)
    sim.clear()
    sim.s.share_lane_durations()
    assert durations_to(sim, W1) == []
    granted(sim)
    sim.s.set_lanes_enabled(False, "off")  # every lane closes
    assert not sim.s.lanes_of_worker
    sim.s.prefixes["inc"].add_duration(9.0)
    sim.clear()
    sim.s.share_lane_durations()
    assert durations_to(sim, W1) == []
