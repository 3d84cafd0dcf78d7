"""The scheduler and worker state machines together, with transfers that fail for good.

A small cluster of real :class:`WorkerState` machines and a real :class:`SchedulerState`,
joined by simulated links (FIFO per direction, delivered in a random interleaving), runs
random graphs whose results may be unpicklable (the holder cannot send them) or
unloadable (a receiver cannot unpickle them), and whose tasks may be pinned to a worker
so that data must travel. Workers may also die and new ones join. The simulated servers
do what the real ones do (``shoal/server/worker.py``): a holder that cannot pickle a
value reports it (``UnserializableData``), a receiver hands failures to its state
machine as ``GatherSuccess.failed``. Every machine validates its invariants after each
event.

Workers may also have a lifetime and a task budget (walltime), tasks a duration hint,
and the scheduler's clock moves on as events are delivered. The scheduler balances at
random moments (work stealing: StealRequest / StealReply cross the other messages).

What must hold, whatever the order of events: no failed transfer ever becomes data
(every copy the scheduler knows of is the genuine value, held by that worker); no task
is ever sent to a worker it would not finish on before its deadline (behind the work
it was already given), nor to a worker beyond its budget; no assignment of a task (its
``run_id``) is executed twice, and a worker that gave a task back (StealReply ``ok``)
never executes that assignment; and once everything is delivered (and a worker without limits has
joined, for the tasks that fit no limited worker) nothing hangs: every key a client
wants is in memory or erred, and a key whose whole graph is sendable and loadable ends
in memory.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import Sim
from sizes import sized

from shoal.core.worker.state import (
    Execute,
    ExecuteSuccess,
    GatherDep,
    GatherFailure,
    GatherSuccess,
    ResumeThread,
    SendMessage,
    TransferError,
    UnserializableData,
    WorkerState,
)
from shoal.protocol.messages import (
    ComputeTask,
    CopyKeys,
    FreeKeys,
    FunctionDefs,
    KeyUnserializable,
    Message,
    Payload,
    ReleaseCompute,
    StealReply,
    StealRequest,
    TaskRestrictions,
)

KINDS = ("ok", "ok", "ok", "unpicklable", "unloadable")
EXC = Payload(1, b"exception")


@dataclass(frozen=True)
class Value:
    """A task's genuine result: made only when the task runs."""

    key: str
    kind: str


class Cluster:
    def __init__(self, seed: int, kinds: dict[str, str]):
        self.rng = random.Random(seed)
        self.kinds = kinds
        self.sim = Sim(workers={}, clients=("c",))
        self.sim.s.allowed_failures = 1_000_000  # deaths are not what is tested here
        self.workers: dict[str, WorkerState] = {}
        self.to_scheduler: dict[str, deque[Message]] = {}
        self.to_worker: dict[str, deque[Message]] = {}
        self.executions: dict[str, list[str]] = {}  # worker -> keys its threads run
        self.gathers: dict[str, list[GatherDep]] = {}  # worker -> transfers it awaits
        self.serial = 0
        self.sid = 0
        self.now = 0.0  # the scheduler's wall clock (tick)
        self.sent: dict[str, int] = {}  # worker -> ComputeTasks sent to it
        self.ran: set[tuple[str, int]] = set()  # (key, run_id) executions started
        self.given_back: set[tuple[str, str, int]] = set()  # (worker, key, run_id): steal ok
        self.sizes: dict[str, int] = {}  # bytes a result is reported to take; default 8

    # --- membership -------------------------------------------------------------------

    def add_worker(self, lifetime: float | None = None, max_tasks: int | None = None) -> str:
        self.serial += 1
        address = f"tcp://w{self.serial}:1"
        self.workers[address] = WorkerState(2, address, validate=True)
        for q in (self.to_scheduler, self.to_worker):
            q[address] = deque()
        self.executions[address] = []
        self.gathers[address] = []
        self.sim.add_worker(
            address, nthreads=2, name=f"w{self.serial}", lifetime=lifetime, max_tasks=max_tasks
        )
        self.pump()
        return address

    def kill(self, address: str) -> None:
        for table in (self.workers, self.to_scheduler, self.to_worker):
            del table[address]
        del self.executions[address], self.gathers[address]
        self.sim.s.remove_worker(address, self.next_sid("killed"))
        self.pump()

    # --- plumbing ---------------------------------------------------------------------

    def next_sid(self, what: str) -> str:
        self.sid += 1
        return f"{what}-{self.sid}"

    def pump(self) -> None:
        """Move what the scheduler wrote onto the links to the workers."""
        s = self.sim.s
        for address, msgs in self.sim.comm.workers.items():
            for msg in msgs:
                if isinstance(msg, ComputeTask):  # walltime: never against a limit
                    wr = s.workers[address]
                    if wr.deadline is not None:  # it ends in time behind what it was given
                        ahead = sum(ts.estimate for ts in wr.processing)
                        end = s.wall_time + ahead / wr.nthreads
                        assert end <= wr.deadline + 1e-9, (msg.key, address)
                    self.sent[address] = self.sent.get(address, 0) + 1
                    if wr.budget is not None:
                        assert self.sent[address] <= wr.budget, (msg.key, address)
            if address in self.to_worker:
                self.to_worker[address].extend(msgs)
        self.sim.comm.workers.clear()
        self.sim.comm.clients.clear()

    def worker_handles(self, address: str, *events: Any) -> None:
        ws = self.workers[address]
        for inst in ws.handle(*events):
            if isinstance(inst, SendMessage):
                msg = inst.msg
                if isinstance(msg, StealReply) and msg.ok:
                    self.given_back.add((address, msg.key, msg.run_id))
                self.to_scheduler[address].append(msg)
            elif isinstance(inst, Execute):
                run = (inst.key, ws.tasks[inst.key].run_id)
                assert run not in self.ran, f"{run} executed twice"
                assert (address, *run) not in self.given_back, f"{run} ran after given back"
                self.ran.add(run)
                self.executions[address].append(inst.key)
            elif isinstance(inst, GatherDep):
                self.gathers[address].append(inst)
            else:
                assert isinstance(inst, ResumeThread), inst  # no secede here

    # --- one step ---------------------------------------------------------------------

    def actions(self) -> list[tuple[str, str]]:
        out = []
        for address in self.workers:
            if self.to_worker[address]:
                out.append(("deliver-to-worker", address))
            if self.to_scheduler[address]:
                out.append(("deliver-to-scheduler", address))
            if self.executions[address]:
                out.append(("execute", address))
            if self.gathers[address]:
                out.append(("transfer", address))
        return out

    def step(self, action: str, address: str) -> None:
        if action == "deliver-to-worker":
            msg = self.to_worker[address].popleft()
            if isinstance(msg, ComputeTask | FreeKeys | ReleaseCompute | CopyKeys | StealRequest):
                self.worker_handles(address, msg)
            else:
                assert isinstance(msg, FunctionDefs), msg
        elif action == "deliver-to-scheduler":
            self.sim.s.handle_worker(address, self.to_scheduler[address].popleft())
        elif action == "execute":
            key = self.executions[address].pop(self.rng.randrange(len(self.executions[address])))
            value = Value(key, self.kinds[key])
            nbytes = self.sizes.get(key, 8)
            event = ExecuteSuccess(
                key, value, nbytes, None, "Value", 1.0, 2.0, self.next_sid("ran")
            )
            self.worker_handles(address, event)
        else:
            self.transfer(address)
        self.pump()

    def transfer(self, address: str) -> None:
        """Serve one GatherDep as the holder's server would, then hand the outcome to
        the receiving worker's state machine."""
        gather = self.gathers[address].pop(self.rng.randrange(len(self.gathers[address])))
        sid = self.next_sid("gather")
        holder = self.workers.get(gather.worker)
        if holder is None:
            self.worker_handles(address, GatherFailure(gather.worker, list(gather.keys), sid))
            return
        data: dict[Any, Any] = {}
        failed: dict[Any, TransferError] = {}
        missing = []
        unsendable = []
        for key in gather.keys:
            if key not in holder.data:
                missing.append(key)
                continue
            value = holder.data[key]
            assert value == Value(key, self.kinds[key]), (key, value)  # genuine, always
            if value.kind == "unpicklable":
                failed[key] = TransferError("the holder cannot pickle it", EXC)
                unsendable.append(key)
            elif value.kind == "unloadable":
                failed[key] = TransferError("the receiver cannot unpickle it", EXC)
            else:
                data[key] = value
        if unsendable:  # the holder's server reports it, as _serve_data does
            events = [UnserializableData(k, "cannot pickle", sid) for k in unsendable]
            self.worker_handles(gather.worker, *events)
        nbytes = dict.fromkeys(data, 8)
        event = GatherSuccess(gather.worker, data, nbytes, missing, sid, failed=failed)
        self.worker_handles(address, event)

    def quiesce(self, limit: int = 20_000) -> None:
        for _ in range(limit):
            actions = self.actions()
            if not actions:
                return
            self.step(*self.rng.choice(actions))
        raise AssertionError("the cluster never went quiet")

    # --- what must hold ---------------------------------------------------------------

    def check_copies(self) -> None:
        """Every copy the scheduler knows of is the genuine value, held by that worker,
        or on its way out (a FreeKeys not yet delivered, a KeyUnserializable not yet
        read); never a stand-in for data that did not come."""
        for ts in self.sim.s.tasks.values():
            for wr in ts.who_has:
                ws = self.workers[wr.address]
                if ts.key in ws.data:
                    assert ws.data[ts.key] == Value(ts.key, self.kinds[ts.key])
                else:
                    leaving = any(
                        (isinstance(msg, FreeKeys) and ts.key in msg.keys)
                        or (isinstance(msg, ReleaseCompute) and ts.key == msg.key)
                        for msg in self.to_worker[wr.address]
                    ) or any(
                        isinstance(msg, KeyUnserializable) and msg.key == ts.key
                        for msg in self.to_scheduler[wr.address]
                    )
                    assert leaving, f"{wr.address} is said to hold {ts.key!r} but does not"


@dataclass
class Scenario:
    deps: list[list[int]]
    kinds: list[str]
    pinned: list[int | None]  # a worker index a task should run on, or anywhere
    kills: list[int]  # steps after which a random worker dies (and a new one joins)
    seed: int
    lifetimes: list[float | None]  # per worker (also those joining later, in turn)
    budgets: list[int | None]
    durations: list[float | None]  # per task: a hint, or its prefix's mean


@st.composite
def scenarios(draw: Any) -> Scenario:
    n = draw(st.integers(1, 12))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    pinned = draw(st.lists(st.sampled_from([None, 0, 1, 2]), min_size=n, max_size=n))
    kills = draw(st.lists(st.integers(0, 60), max_size=2))
    lifetimes = draw(
        st.lists(st.sampled_from([None, None, 3.0, 20.0, 200.0]), min_size=5, max_size=5)
    )
    budgets = draw(st.lists(st.sampled_from([None, None, 1, 2, 5]), min_size=5, max_size=5))
    durations = draw(
        st.lists(st.sampled_from([None, None, 0.5, 10.0, 100.0]), min_size=n, max_size=n)
    )
    seed = draw(st.integers(0, 2**32))
    return Scenario(deps, kinds, pinned, kills, seed, lifetimes, budgets, durations)


def key(i: int) -> str:
    return f"t-{i}"


@settings(max_examples=sized(ci=300, full=1000), suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_failed_transfers_never_become_results(sc: Scenario) -> None:
    keys = [key(i) for i in range(len(sc.deps))]
    kinds = dict(zip(keys, sc.kinds))
    cluster = Cluster(sc.seed, kinds)
    limits = iter(zip(sc.lifetimes, sc.budgets))
    addresses = [cluster.add_worker(*next(limits)) for _ in range(3)]
    restrictions = {
        # loose: the named worker runs it while it lives (so data must travel to it)
        keys[i]: TaskRestrictions([addresses[w]], allow_other_workers=True)
        for i, w in enumerate(sc.pinned)
        if w is not None
    }
    dag = {keys[i]: [keys[d] for d in ds] for i, ds in enumerate(sc.deps)}
    durations = {keys[i]: d for i, d in enumerate(sc.durations) if d is not None}
    cluster.sim.submit(dag, restrictions=restrictions, durations=durations)
    cluster.pump()
    for step in range(200):
        if step in sc.kills and len(cluster.workers) > 1:
            cluster.kill(cluster.rng.choice(sorted(cluster.workers)))
            cluster.add_worker(*next(limits, (None, None)))
        actions = cluster.actions()
        if not actions:
            break
        if cluster.rng.random() < 0.2:  # time passes
            cluster.sim.s.tick(cluster.sim.s.wall_time + cluster.rng.uniform(0, 5))
        if cluster.rng.random() < 0.2:  # the server's periodic balance (work stealing)
            cluster.sim.s.balance(cluster.next_sid("balance"))
            cluster.pump()
        cluster.step(*cluster.rng.choice(actions))
        cluster.check_copies()
    cluster.quiesce()
    cluster.add_worker()  # no limits: what fit no limited worker runs here
    cluster.quiesce()
    cluster.check_copies()
    s = cluster.sim.s
    ancestors = {k: {k} for k in keys}
    for k in keys:
        for d in dag[k]:
            ancestors[k] |= ancestors[d]
    for k in keys:
        ts = s.tasks[k]
        assert ts.state in ("memory", "erred"), (k, ts.state)  # nothing hangs
        if ts.state == "memory":
            assert ts.who_has, k
        # a key whose graph holds nothing that cannot travel is computed, never erred
        if all(kinds[a] == "ok" for a in ancestors[k]):
            assert ts.state == "memory", (k, ts.state, s.log.story(k))


def test_a_result_of_an_earlier_run_is_not_taken_for_the_current_one():
    """Found by the property test above: a worker finishes a task, the scheduler
    releases it meanwhile (its dependency was lost) and gives it to the same worker
    again; the first run's TaskFinished must not count for the second (the worker
    dropped that result on the release that crossed it), or the scheduler would say
    the key is held where it is not yet."""
    from scheduler_harness import W1, W2

    from shoal.protocol.messages import TaskFinished

    sim = Sim(workers={W1: 1, W2: 1})
    sim.submit(
        {"a": [], "b": ["a"]},
        wanted=["b"],
        restrictions={
            "a": TaskRestrictions([W1], allow_other_workers=True),
            "b": TaskRestrictions([W2]),
        },
    )
    sim.finish("a")
    assert sim.worker_of("b") == W2
    first_run = sim.ts("b").run_id
    sim.remove_worker(W1)  # "a" is lost: "b" is released, "a" recomputed on W2
    sim.finish("a", worker=W2)
    assert sim.worker_of("b") == W2 and sim.ts("b").run_id == first_run + 1
    stale = TaskFinished("b", 8, 1.0, 2.0, None, "int", "stale", run_id=first_run)
    sim.s.handle_worker(W2, stale)
    assert sim.state("b") == "processing" and "b" not in sim.holds(W2)
    current = TaskFinished("b", 8, 3.0, 4.0, None, "int", "current", run_id=first_run + 1)
    sim.s.handle_worker(W2, current)
    assert sim.state("b") == "memory" and "b" in sim.holds(W2)


def test_steals_move_work_and_lose_nothing() -> None:
    """Tasks that need one large result, first measured as very short, all go where that
    result is; then they are measured long, and a balance moves four of them to the two
    idle workers; balancing at every step after that, each assignment runs at most once
    (checked as it runs) and every key ends in memory."""
    keys = [key(i) for i in range(20)]
    cluster = Cluster(7, dict.fromkeys([*keys, "x"], "ok"))
    cluster.sizes["x"] = 10**7  # 0.1 s to move at the assumed bandwidth
    for _ in range(3):
        cluster.add_worker()
    s = cluster.sim.s
    cluster.sim.submit({"x": []})
    cluster.pump()
    cluster.quiesce()
    (holder,) = s.tasks["x"].who_has
    s._group(keys[0]).prefix.add_duration(0.001)
    cluster.sim.submit({k: ["x"] for k in keys}, wanted=keys)
    cluster.pump()
    assert {ts.processing_on for ts in s.tasks.values() if ts.processing_on} == {holder}
    s.prefixes["t"].add_duration(10.0)  # measured at last: they take long
    assert s.balance(cluster.next_sid("balance")) == 4  # two idle workers, two threads each
    cluster.pump()
    asked = {ts.key for ts in s.steals}
    while cluster.to_worker[holder.address]:  # the holder runs two, the rest wait
        cluster.step("deliver-to-worker", holder.address)
    running = {
        k for k, wt in cluster.workers[holder.address].tasks.items() if wt.state == "executing"
    }
    assert len(running) == 2
    while cluster.to_scheduler[holder.address]:
        cluster.step("deliver-to-scheduler", holder.address)
    # those it had started are "too late"; the others moved
    assert s.steals_refused == len(asked & running) and s.steals_done == 4 - len(asked & running)
    assert s.steals_done >= 2
    for k in asked - running:
        assert s.tasks[k].processing_on not in (None, holder)
    for _ in range(2_000):
        s.balance(cluster.next_sid("balance"))
        cluster.pump()
        actions = cluster.actions()
        if not actions:
            break
        cluster.step(*cluster.rng.choice(actions))
    assert all(s.tasks[k].state == "memory" for k in keys)
    assert {s.tasks[k].who_has[0] for k in keys} != {holder}
