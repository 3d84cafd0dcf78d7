"""Lanes under random interleavings of everything that may close one: workers joining
(some with a walltime or a task budget), pausing and resuming, retiring (asked by a
client, by scaling, or on their own) and being removed; clients coming, asking for
lanes and leaving; lanes turned off and on; tasks run and results copied off retiring
workers; and workers reporting lane runs.

``validate=True`` checks the scheduler's own lane invariants after each event. Alongside,
a model of each client and each worker is fed only the lane messages the scheduler sends
(``LaneGrant``, ``LaneOpen``, ``LaneClosed``), and after every step:

- a client believes it holds at most one lane, and each lane it believes open is open
  in ``state.lanes``, its own, on the worker its grant named, which is in ``runnable``
  (no client is left believing in a lane the scheduler closed without telling it);
  every lane the scheduler files under a client is one that client was granted;
- a registered worker believes open exactly the lanes the scheduler files under it;
- nobody is told of a lane it does not hold (a close twice, or to a stranger), but for
  the one ``gone`` notice a client may get later for a lane of its that closed earlier,
  when that lane's worker is removed (and only then, once); every ``LaneRequest`` is
  answered by one ``LaneGrant``, at once;
- a worker with lanes holds, from the ``LaneDurations`` it was sent, exactly the
  durations the scheduler says it shared; after each share, every measured prefix's
  duration is within DURATIONS_CHANGE of what was shared (what a worker decides a small
  graph's run by is never further off than that).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from scheduler_harness import Sim, addr
from sizes import sized

from shoal.core.scheduler.lanes import DURATIONS_CHANGE
from shoal.core.scheduler.model import WorkerRecord
from shoal.protocol.messages import (
    AddKeys,
    CopyKeys,
    LaneBusy,
    LaneClosed,
    LaneDurations,
    LaneGrant,
    LaneOpen,
    LaneRan,
    LaneRequest,
    RetireWorkers,
    WorkerLeaving,
    WorkerStatus,
)

ADDRESSES = [addr(n) for n in range(1, 6)]  # a small pool: addresses come back after removal
CLIENTS = ("c1", "c2", "c3", "c4")
LIMITS = ({}, {}, {}, {"lifetime": 3600.0}, {"max_tasks": 3})  # most without
RETIREMENTS = ("client", "client-no-close", "scaling", "leaving", "leaving-no-copies")
PREFIXES = ("t", "u")  # "t": tasks submitted here (some); "u": never a task
TASK_PREFIXES = ("t", "v", "w")  # of the tasks submitted
DURATIONS = (0.0, 0.001, 0.0105, 0.011, 0.5, 4.0)  # some within 10% of another
MACHINE_SETTINGS = settings(
    max_examples=sized(ci=100, full=500),
    stateful_step_count=sized(ci=40, full=80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def pick(options, i: int):
    options = sorted(options)
    return options[i % len(options)]


class LanesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(workers={}, clients=())
        self.s = self.sim.s
        self.comm = self.sim.comm
        # The models, fed the lane messages only: client -> {lane: worker it names},
        # worker -> {lane: client}; every lane id ever granted.
        self.client_lanes: dict[str, dict[str, str]] = {}
        self.worker_lanes: dict[str, dict[str, str]] = {}
        self.worker_durations: dict[str, dict[str, float]] = {}  # from LaneDurations
        self.granted: set[str] = set()
        self.lane_worker: dict[str, str] = {}  # lane -> the worker its grant named
        self.told_gone: set[str] = set()  # lanes whose client was told their worker left
        self.asked: dict[str, int] = {}  # client -> the request id it waits an answer to
        self.copies: list[tuple[str, str, int]] = []  # (to, key, nbytes) asked by CopyKeys
        self.busy: list[tuple[WorkerRecord, str, str]] = []  # (worker, lane, key) announced
        self.nbusy = 0
        self.ntasks = 0
        self.nrequests = 0

    @initialize(
        nclients=st.integers(1, len(CLIENTS)),
        limits=st.lists(st.sampled_from(LIMITS), min_size=1, max_size=3),
    )
    def start(self, nclients, limits):
        """Some clients and workers from the start: lanes to grant from the first step."""
        for client in CLIENTS[:nclients]:
            self.s.add_client(client)
            self.client_lanes[client] = {}
        for address, limit in zip(ADDRESSES, limits):
            self.sim.add_worker(address, 1, **limit)
            self.worker_lanes[address] = {}

    def worker(self, i: int) -> str:
        """A registered worker: for an even ``i``, one with lanes if there is any (what
        happens to a worker matters to lanes when it has some)."""
        with_lanes = [a for a in self.s.lanes_of_worker if a in self.s.workers]
        return pick(with_lanes if with_lanes and i % 2 == 0 else self.s.workers, i // 2)

    # --- workers ------------------------------------------------------------------------

    @precondition(lambda self: len(self.s.workers) < len(ADDRESSES))
    @rule(i=st.integers(0, 10**6), limit=st.sampled_from(LIMITS), nthreads=st.integers(1, 2))
    def add_worker(self, i, limit, nthreads):
        address = pick(set(ADDRESSES) - set(self.s.workers), i)
        self.sim.add_worker(address, nthreads, **limit)
        self.worker_lanes[address] = {}

    @precondition(lambda self: self.s.workers)
    @rule(i=st.integers(0, 10**6))
    def remove_worker(self, i):
        self.sim.remove_worker(self.worker(i), self.sim.sid("remove"))

    @precondition(lambda self: self.s.workers)
    @rule(i=st.integers(0, 10**6), status=st.sampled_from(["paused", "running"]))
    def worker_status(self, i, status):
        address = self.worker(i)
        self.s.handle_worker(address, WorkerStatus(status, self.sim.sid(status)))

    @precondition(lambda self: self.s.workers)
    @rule(i=st.integers(0, 10**6), how=st.sampled_from(RETIREMENTS))
    def retire(self, i, how):
        """Retired as a client asks (the worker closed or not after), by scaling, or
        leaving on its own (its data copied off first, or not)."""
        address = self.worker(i)
        if how in ("client", "client-no-close") and self.s.clients:
            self.nrequests += 1
            msg = RetireWorkers(self.nrequests, [address], how == "client")
            self.s.handle_client(pick(self.s.clients, i), msg)
        elif how in ("leaving", "leaving-no-copies"):
            msg = WorkerLeaving("SIGTERM", how == "leaving", self.sim.sid("leave"))
            self.s.handle_worker(address, msg)
        else:
            self.s.retire_for_scaling([self.s.workers[address]], self.sim.sid("scale-down"))

    @precondition(lambda self: self.s.scaling_down)
    @rule(i=st.integers(0, 10**6))
    def cancel_retirement(self, i):
        self.s.cancel_retirement(pick(self.s.scaling_down, i), self.sim.sid("scale-up"))

    @precondition(lambda self: self.copies)
    @rule(i=st.integers(0, 10**6))
    def copy_arrives(self, i):
        to, key, nbytes = self.copies.pop(i % len(self.copies))
        if to in self.s.workers:
            self.s.handle_worker(to, AddKeys([key], [nbytes], self.sim.sid("copied")))

    # --- tasks ----------------------------------------------------------------------------

    @precondition(lambda self: self.s.clients)
    @rule(i=st.integers(0, 10**6))
    def submit(self, i):
        self.ntasks += 1
        key = f"{TASK_PREFIXES[i % len(TASK_PREFIXES)]}-{self.ntasks}"
        self.sim.submit({key: []}, client=pick(self.s.clients, i), sid=self.sim.sid("submit"))

    @precondition(lambda self: self.s.clients and self.s.workers)
    @rule(i=st.integers(0, 10**6))
    def scatter(self, i):
        """A client scatters a result to a worker: data only that worker holds."""
        self.ntasks += 1
        client = pick(self.s.clients, i)
        self.sim.scatter(self.worker(i), {f"t-{self.ntasks}": 8}, client, self.sim.sid("scatter"))

    @precondition(lambda self: any(ws.processing or ws.draining for ws in self.s.workers.values()))
    @rule(i=st.integers(0, 10**6), duration=st.sampled_from([0.001, 0.01, 0.1, 1.0, 4.0]))
    def finish(self, i, duration):
        self.sim.drain_all()
        runnable = self.sim.runnable()
        if runnable:
            self.sim.finish(pick(map(str, runnable), i), nbytes=8, duration=duration)

    # --- clients ----------------------------------------------------------------------------

    @precondition(lambda self: len(self.s.clients) < len(CLIENTS))
    @rule(i=st.integers(0, 10**6))
    def add_client(self, i):
        client = pick(set(CLIENTS) - set(self.s.clients), i)
        self.s.add_client(client)
        self.client_lanes[client] = {}

    @precondition(lambda self: self.s.clients)
    @rule(i=st.integers(0, 10**6))
    def remove_client(self, i):
        client = pick(self.s.clients, i)
        self.s.remove_client(client, self.sim.sid("bye"))
        del self.client_lanes[client]  # gone: it believes nothing any more
        self.asked.pop(client, None)

    @precondition(lambda self: self.s.clients)
    @rule(i=st.integers(0, 10**6), every=st.booleans())
    def request_lane(self, i, every):
        """A client asks for a lane (it may hold one: it asks again); ``every``: each
        client without a lane asks, one after another (in one batch each)."""
        if every:
            clients = [c for c in sorted(self.s.clients) if c not in self.s.lane_of_client]
        else:
            clients = [pick(self.s.clients, i)]
        for client in clients:
            self.nrequests += 1
            self.asked[client] = self.nrequests
            # Asking again, the client gives its lane up (the scheduler closes it at its
            # worker, and does not tell the client, which knows).
            self.client_lanes[client].clear()
            self.s.handle_client(client, LaneRequest(self.nrequests))
            self._sync()
            assert client not in self.asked, f"{client}'s LaneRequest was not answered"

    @rule(
        enabled=st.sampled_from([True, True, True, False]),
        why=st.sampled_from(["", "a plugin watches transitions"]),
    )
    def set_lanes_enabled(self, enabled, why):
        self.s.set_lanes_enabled(enabled, why)
        self.s.validate_state()  # (no batch ends here: check now)

    @precondition(lambda self: self.s.lanes_of_worker)
    @rule()
    def share_durations(self):
        self.s.share_lane_durations()
        for name, prefix in self.s.prefixes.items():
            if prefix.recent_duration is not None and self.s.lanes_of_worker:
                shared = self.s._shared_durations[name]
                assert abs(prefix.recent_duration - shared) <= DURATIONS_CHANGE * shared

    # --- lane runs reported -----------------------------------------------------------------

    @precondition(lambda self: self.s.workers)
    @rule(
        i=st.integers(0, 10**6),
        prefix=st.sampled_from(PREFIXES),
        status=st.sampled_from(["memory", "memory", "erred", "bogus"]),
        start=st.floats(0, 100),
        took=st.floats(-1, 10),
        as_tuple=st.booleans(),
    )
    def lane_ran(self, i, prefix, status, start, took, as_tuple):
        address = self.worker(i)
        lanes = sorted(self.worker_lanes.get(address, {})) or ["lane-none"]
        name = f"{prefix}-{i % 7}"
        key = (name, i % 3) if as_tuple else name
        runs, count = self.s.lane_runs, self.s.task_stream.count
        tasks, groups, prefixes = set(self.s.tasks), set(self.s.groups), set(self.s.prefixes)
        tp = self.s.prefixes.get(prefix)
        durations = tp.duration_count if tp is not None else 0
        msg = LaneRan(lanes[i % len(lanes)], key, status, start, start + took)
        if status == "bogus":
            with pytest.raises(TypeError, match="unknown lane run status"):
                self.s.handle_worker(address, msg)
            assert (self.s.lane_runs, self.s.task_stream.count) == (runs, count)
            return
        self.s.handle_worker(address, msg)
        assert (self.s.lane_runs, self.s.task_stream.count) == (runs + 1, count + 1)
        record = self.s.task_stream.records[-1]
        assert (record.key, record.prefix, record.group) == (key, prefix, name)
        assert (record.worker, record.status) == (address, status)
        assert set(self.s.tasks) == tasks and set(self.s.groups) == groups
        assert set(self.s.prefixes) == prefixes
        if tp is not None:
            added = status == "memory" and msg.stop >= msg.start
            assert tp.duration_count == durations + added

    @precondition(lambda self: self.s.workers)
    @rule(i=st.integers(0, 10**6))
    def lane_run_goes_on(self, i):
        """A worker announces a lane run that goes on: one more of its threads busy."""
        address = self.worker(i)
        ws = self.s.workers[address]
        lanes = sorted(self.worker_lanes.get(address, {})) or ["lane-none"]
        self.nbusy += 1  # (each run its own key: a report names one run only)
        lane, key = lanes[i % len(lanes)], f"long-{self.nbusy}"
        before = ws.ndraining
        self.s.handle_worker(address, LaneBusy(lane, key))
        assert ws.ndraining == before + 1 and ws.slot_threads == max(0, ws.nthreads - before - 1)
        if ws.slot_threads == 0:
            assert ws not in self.s.free_workers
        self.busy.append((ws, lane, key))

    @precondition(lambda self: self.busy)
    @rule(i=st.integers(0, 10**6))
    def long_lane_run_ends(self, i):
        """Its report frees the thread again (if its worker is still there, the same one:
        an address that came back is another worker, which counted nothing of it)."""
        ws, lane, key = self.busy.pop(i % len(self.busy))
        now = self.s.workers.get(ws.address)
        before = ws.ndraining, now.ndraining if now is not None else 0
        self.s.handle_worker(ws.address, LaneRan(lane, key, "memory", 0.0, 1.0))
        if now is ws:
            assert ws.ndraining == before[0] - 1
        elif now is not None:  # another worker at that address: it counted nothing of it
            assert now.ndraining == before[1]

    @precondition(lambda self: self.s.workers)
    @rule(i=st.integers(0, 10**6))
    def walltime_leaves(self, i):
        """A worker at the end of its walltime: one holding the only copy of results,
        with no other worker to take them, waits for one, given no new task meanwhile."""
        address = self.worker(i)
        msg = WorkerLeaving("walltime", True, self.sim.sid("walltime"), walltime=True)
        self.s.handle_worker(address, msg)

    # --- the models -------------------------------------------------------------------------

    def _sync(self) -> None:
        """Feed the lane messages sent since the last step to the models."""
        for client, msgs in list(self.comm.clients.items()):
            msgs = [msg for msg in msgs if isinstance(msg, (LaneGrant, LaneOpen, LaneClosed))]
            if msgs:
                assert client in self.client_lanes, f"lane messages to a stranger {client}"
            believed = self.client_lanes.get(client, {})
            for msg in msgs:
                assert not isinstance(msg, LaneOpen), f"LaneOpen to client {client}"
                if isinstance(msg, LaneGrant):
                    assert self.asked.pop(client, None) == msg.request_id, (client, msg)
                    if msg.lane:
                        assert msg.worker and not msg.reason and msg.lane not in self.granted
                        self.granted.add(msg.lane)
                        self.lane_worker[msg.lane] = msg.worker
                        assert not believed, f"{client} granted a second lane: {msg}"
                        believed[msg.lane] = msg.worker
                    else:
                        assert msg.reason and not msg.worker, msg
                else:
                    if msg.gone:  # its worker left the cluster
                        assert self.lane_worker.get(msg.lane) not in self.s.workers, msg
                        assert msg.lane not in self.told_gone, f"{client} told twice: {msg}"
                        self.told_gone.add(msg.lane)
                        if msg.lane not in believed:  # closed before: the later notice
                            assert msg.lane in self.granted, (client, msg)
                            continue
                    assert msg.lane in believed, f"{client} told of a lane it does not hold"
                    believed.pop(msg.lane)
        for address, msgs in list(self.comm.workers.items()):
            kinds = (LaneGrant, LaneOpen, LaneClosed, CopyKeys, LaneDurations)
            msgs = [msg for msg in msgs if isinstance(msg, kinds)]
            for msg in msgs:
                if isinstance(msg, CopyKeys):
                    self.copies.extend((address, d.key, d.nbytes) for d in msg.deps)
                    continue
                if isinstance(msg, LaneDurations):
                    assert address in self.s.workers, f"durations to a stranger {address}"
                    self.worker_durations.setdefault(address, {}).update(msg.durations)
                    continue
                assert address in self.worker_lanes, f"lane message to a stranger {address}"
                believed = self.worker_lanes[address]
                assert not isinstance(msg, LaneGrant), f"LaneGrant to worker {address}"
                assert not getattr(msg, "gone", False), f"{address} told it is gone: {msg}"
                if isinstance(msg, LaneOpen):
                    assert msg.lane not in believed, f"{address} told twice of {msg.lane}"
                    assert msg.lane in self.granted or msg.lane in self.s.lanes
                    believed[msg.lane] = msg.client
                else:
                    assert msg.lane in believed, f"{address} told of a lane it does not hold"
                    del believed[msg.lane]
        self.comm.clear()
        for address in set(self.worker_lanes) - set(self.s.workers):
            del self.worker_lanes[address]  # gone: nobody left to believe anything
            self.worker_durations.pop(address, None)

    @invariant()
    def lanes_believed_are_lanes_open(self):
        self._sync()
        s = self.s
        assert set(self.client_lanes) == set(s.clients)
        assert set(self.worker_lanes) == set(s.workers)
        for client, believed in self.client_lanes.items():
            assert len(believed) <= 1, (client, believed)
            for lane_id, worker in believed.items():
                lane = s.lanes.get(lane_id)
                assert lane is not None, f"{client} believes in {lane_id}, closed untold"
                assert (lane.client, lane.worker) == (client, worker), lane
                assert worker in s.runnable, f"{lane_id} open on {worker}, not runnable"
            held = s.lane_of_client.get(client)
            assert (held is None and not believed) or (held is not None and held.id in believed)
        for address, believed in self.worker_lanes.items():
            filed = {
                lane_id: lane.client for lane_id, lane in s.lanes_of_worker.get(address, {}).items()
            }
            assert believed == filed, (address, believed, filed)
        for address in s.lanes_of_worker:
            believed = self.worker_durations.get(address, {})
            for name, shared in s._shared_durations.items():
                assert believed.get(name) == shared, (address, name, believed, shared)
        if not s.lanes_enabled:
            assert not s.lanes
            assert not any(self.client_lanes.values()) and not any(self.worker_lanes.values())


def test_lanes_believed_are_lanes_open():
    run_state_machine_as_test(LanesMachine, settings=MACHINE_SETTINGS)


class DurationsMachine(RuleBasedStateMachine):
    """The prefixes' durations shared with the workers that have lanes, under workers
    coming and going, lanes granted and closed, and durations measured (tasks run
    through the scheduler, and lane runs reported). A model of each worker is fed the
    ``LaneDurations`` it is sent; after every step, a worker with lanes holds exactly
    what the scheduler says it shared, and after each share every measured prefix is
    within DURATIONS_CHANGE of it."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(workers={}, clients=CLIENTS)
        self.s = self.sim.s
        self.believed: dict[str, dict[str, float]] = {}
        self.ntasks = 0
        self.nrequests = 0

    @precondition(lambda self: len(self.s.workers) < 3)
    @rule(i=st.integers(0, 10**6))
    def add_worker(self, i):
        self.sim.add_worker(pick(set(ADDRESSES[:3]) - set(self.s.workers), i), 2)

    @precondition(lambda self: self.s.workers)
    @rule(i=st.integers(0, 10**6))
    def remove_worker(self, i):
        self.sim.remove_worker(pick(self.s.workers, i), self.sim.sid("remove"))

    @rule(i=st.integers(0, 10**6))
    def request_lane(self, i):
        self.nrequests += 1
        self.s.handle_client(pick(CLIENTS, i), LaneRequest(self.nrequests))

    @rule(enabled=st.booleans())
    def set_lanes_enabled(self, enabled):
        self.s.set_lanes_enabled(enabled, "off")

    @precondition(lambda self: self.s.workers)
    @rule(prefix=st.sampled_from(TASK_PREFIXES), seconds=st.sampled_from(DURATIONS))
    def task_runs(self, prefix, seconds):
        """A task of ``prefix`` is submitted and runs for ``seconds``."""
        self.ntasks += 1
        key = f"{prefix}-{self.ntasks}"
        self.sim.submit({key: []}, client=CLIENTS[0], sid=self.sim.sid("submit"))
        if self.s.tasks[key].state == "processing":
            self.sim.finish(key, duration=seconds)

    @precondition(lambda self: self.s.lanes_of_worker)
    @rule(i=st.integers(0, 10**6), prefix=st.sampled_from(TASK_PREFIXES), took=st.floats(0, 10))
    def lane_ran(self, i, prefix, took):
        address = pick(self.s.lanes_of_worker, i)
        lane = pick(self.s.lanes_of_worker[address], i)
        self.s.handle_worker(address, LaneRan(lane, f"{prefix}-x", "memory", 1.0, 1.0 + took))

    @precondition(lambda self: self.s.lanes_of_worker)  # (else it does nothing)
    @rule()
    def share(self):
        self.s.share_lane_durations()
        self._sync()
        if self.s.lanes_of_worker:
            for name, prefix in self.s.prefixes.items():
                if prefix.recent_duration is not None:
                    shared = self.s._shared_durations[name]
                    assert abs(prefix.recent_duration - shared) <= DURATIONS_CHANGE * shared

    def _sync(self) -> None:
        for address, msgs in self.sim.comm.workers.items():
            for msg in msgs:
                if isinstance(msg, LaneDurations):
                    assert address in self.s.workers, f"durations to a stranger {address}"
                    self.believed.setdefault(address, {}).update(msg.durations)
        self.sim.comm.clear()
        for address in set(self.believed) - set(self.s.workers):
            del self.believed[address]  # gone: its table with it

    @invariant()
    def workers_with_lanes_hold_what_was_shared(self):
        self._sync()
        for address in self.s.lanes_of_worker:
            believed = self.believed.get(address, {})
            for name, shared in self.s._shared_durations.items():
                assert believed.get(name) == shared, (address, name, believed, shared)


def test_workers_with_lanes_hold_the_durations_shared():
    run_state_machine_as_test(DurationsMachine, settings=MACHINE_SETTINGS)
