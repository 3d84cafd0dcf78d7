"""The scheduler's P2P coordination under random interleavings of tasks finishing,
participants dying and workers joining (no network: scheduler_harness.Sim, validating
every invariant, pins included, after each event).

The workers are modelled as the real ones behave (shoal/shuffle/_worker.py): a transfer
that finishes in run ``r`` has delivered its rows for run ``r`` to every participant of
``r``; a barrier checks its transfers answered for its run; an unpack reads what its
run delivered to its worker. What must hold whatever the order:

- every shuffle task is sent with the shuffle's current run, to a participant of it;
- an unpack only ever runs on its partition's owner, once every input was delivered in
  its run (so it never sees a partial or mixed input), and no barrier sees transfers
  of another run;
- once the cluster is left alone, every unpack ends in memory, or erred after a
  "failed" event (restarts are bounded); no shuffle pin is left.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import EXC, FUNCS, Sim, addr
from test_p2p_coordination import SID, shuffle_graph

from shoal.protocol.messages import ComputeTask, SubmitTasks, TaskErred, TaskFinished
from shoal.shuffle._plan import owner


class Model:
    def __init__(self, nworkers: int, ninputs: int, nout: int):
        self.sim = Sim(workers={addr(i): 2 for i in range(nworkers)})
        self.sim.s.allowed_failures = 10**6  # deaths err tasks only through the shuffle
        self.next_worker = nworkers
        self.ninputs, self.nout = ninputs, nout
        self.sent: dict[tuple[str, Any], ComputeTask] = {}  # (worker, key) -> its ComputeTask
        self.delivered: dict[int, set[int]] = {}  # run -> inputs whose rows were delivered
        self.participants: dict[int, list[str]] = {}  # run -> its participants
        wanted = [("u", p) for p in range(nout)]
        specs = shuffle_graph(ninputs, nout)
        self.sim.s.handle_client("c", SubmitTasks(specs, wanted, FUNCS, "submit"))
        self.collect()

    def collect(self) -> None:
        for address in list(self.sim.comm.workers):
            for msg in self.sim.to_worker(address):
                if isinstance(msg, ComputeTask):
                    self.sent[(address, msg.key)] = msg
                    if msg.shuffle is not None:
                        self.check_sent(address, msg)

    def check_sent(self, address: str, msg: ComputeTask) -> None:
        rec = self.sim.s.shuffles[SID]
        run = msg.shuffle
        assert run is not None and rec.running and run.run == rec.run, (msg, rec)
        assert address in run.participants, (address, run)
        self.participants[run.run] = list(run.participants)

    # --- actions -------------------------------------------------------------------------

    def finish_one(self, choice: int) -> None:
        processing = sorted(self.sim.processing(), key=repr)
        if not processing:
            return
        key = processing[choice % len(processing)]
        ts = self.sim.ts(key)
        address = ts.processing_on.address  # type: ignore[union-attr]
        msg = self.sent[(address, key)]
        value_ok = True
        if msg.shuffle is not None:
            value_ok = self.run_shuffle_task(address, key, msg)
        sid = self.sim.sid("done")
        if value_ok:
            report: Any = TaskFinished(key, 8, 0.0, 1.0, None, "int", sid, msg.run_id)
        else:
            report = TaskErred(key, EXC, "", 0.0, 1.0, sid, run_id=msg.run_id)
        self.sim.s.handle_worker(address, report)

    def run_shuffle_task(self, address: str, key: Any, msg: ComputeTask) -> bool:
        """What the worker's task function does; False if it would raise."""
        run = msg.shuffle
        assert run is not None
        if key == "b":
            for i in range(self.ninputs):
                assert i in self.delivered.get(run.run, ()), f"barrier of run {run.run}: {i}"
            return True
        role, index = key
        if role == "t":
            self.delivered.setdefault(run.run, set()).add(index)
            return True
        assert address == owner(index, run.participants), (key, address, run)
        have = self.delivered.get(run.run, set())
        assert have == set(range(self.ninputs)), f"unpack {key} of run {run.run} saw {have}"
        return True

    def kill(self, choice: int) -> None:
        alive = sorted(self.sim.s.workers)
        if alive:
            victim = alive[choice % len(alive)]
            self.sim.remove_worker(victim, sid=self.sim.sid("kill"))
            for run, members in self.participants.items():
                if victim in members:  # its received rows are gone with it
                    self.delivered[run] = set()

    def add(self) -> None:
        self.sim.add_worker(addr(self.next_worker), 2)
        self.next_worker += 1

    def step(self, action: str, choice: int) -> None:
        if action == "finish":
            self.finish_one(choice)
        elif action == "kill":
            self.kill(choice)
        else:
            self.add()
        self.collect()
        self.sim.drain_all()
        self.collect()

    def quiesce(self) -> None:
        if not self.sim.s.workers:
            self.add()
            self.collect()
        for _ in range(5_000):
            self.sim.drain_all()
            self.collect()
            if not self.sim.processing():
                return
            self.finish_one(0)
            self.collect()
        raise AssertionError("did not quiesce")


actions = st.lists(
    st.tuples(st.sampled_from(["finish"] * 6 + ["kill", "add"]), st.integers(0, 1000)),
    max_size=60,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    nworkers=st.integers(1, 4),
    ninputs=st.integers(1, 5),
    nout=st.integers(1, 6),
    steps=actions,
)
def test_runs_never_mix_and_every_unpack_ends(nworkers, ninputs, nout, steps):
    model = Model(nworkers, ninputs, nout)
    for action, choice in steps:
        model.step(action, choice)
    model.quiesce()
    s = model.sim.s
    states = {p: model.sim.state(("u", p)) for p in range(nout)}
    events = [data for _, data in s.get_events("p2p")["p2p"]]
    assert set(states.values()) <= {"memory", "erred"}, states
    if "erred" in states.values():
        assert any(e["action"] == "failed" for e in events)
    else:
        assert events[-1]["action"] == "finish"
    assert not s.shuffles[SID].running
    assert not [p for p in s.pins.values() if p.owner.startswith("shuffle:")]
