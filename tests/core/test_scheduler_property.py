"""Random DAGs, workers and event sequences against the scheduler state machine.

``validate=True`` checks every invariant after each event. Alongside, a model of each
worker (what it was told to run, what it holds) is fed the messages the scheduler sends,
and must agree with the scheduler's view after every step. At the end everything is run
to completion and every key a client still wants must be in memory or erred, for the
right reason; once every client lets go, nothing may be left anywhere.

Tasks may carry restrictions (a worker by address, name or host, loose or strict, and
GPUs): the worker models check that each task runs where it may and that no worker runs
more GPU tasks at once than it has GPUs.

Processing tasks are cancelled and released at random, and keys wanted again: each
worker model keeps the answers (ComputeReleased) it owes for the released tasks it may
still be running, and gives them back one at a time in any order; the scheduler must
count exactly those threads busy, and give them back as the answers come.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import EXC, Sim, addr

from shoal.core.scheduler.model import FINISHED
from shoal.protocol.messages import (
    ComputeTask,
    FreeKeys,
    FunctionDefs,
    KeyCancelled,
    KeyErred,
    KeyInMemory,
    MissingData,
    PinReply,
    PinWorkers,
    ProgressCounts,
    ReleaseCompute,
    TaskRestrictions,
    WatchProgress,
)

CLIENTS = ("c1", "c2")
STEPS = (
    *("finish", "finish", "finish", "fail", "add", "remove", "release", "cancel", "copy"),
    *("miss", "watch", "drained", "drained", "rewant", "stop", "stop"),
)
# Cancels of running tasks, the same keys submitted again, answers in any order.
CANCEL_STEPS = ("finish", "stop", "stop", "rewant", "rewant", "drained", "remove", "add")
# Restrictions a task may draw; workers 1 and 2 are added back at the end if they left,
# so that every task can run. Worker n has n % 3 GPUs.
RESTRICTIONS = (
    None,
    TaskRestrictions([addr(1)]),
    TaskRestrictions(["w2"], allow_other_workers=True),  # by host
    TaskRestrictions(resources={"GPU": 1}),
    TaskRestrictions(["w2:1"], resources={"GPU": 1}),  # by name
    TaskRestrictions(resources={"GPU": 2}),
)


def gpus(n: int) -> float:
    return float(n % 3)


def names(address: str) -> set[str]:
    """What a restriction may call the harness's worker at ``address``."""
    host = address.split("//")[-1].split(":")[0]
    return {address, host, f"{host}:1"}


@dataclass
class Scenario:
    deps: list[list[int]]
    retries: list[int]
    workers: list[int]  # nthreads of each worker at the start
    wanted: dict[str, set[int]]
    steps: list[tuple[str, int]]
    restrict: list[int] = field(default_factory=list)  # index into RESTRICTIONS, per task
    # Seconds each task takes: tiny ones (0.1 ms) make placement keep siblings together
    # (core/scheduler/packing.py) once their prefix is measured.
    duration: float = 1.0
    # Bytes per character of a result's key: a million makes results too large to move
    # within the transfer latency, so that going ahead is decided on what would move
    # elsewhere instead (core/scheduler/ahead.py).
    scale: int = 1


@st.composite
def scenarios(draw, kinds: tuple[str, ...] = STEPS) -> Scenario:
    n = draw(st.integers(1, 30))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    retries = draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=n, max_size=n))
    workers = draw(st.lists(st.integers(1, 2), min_size=1, max_size=3))
    wanted = {
        "c1": draw(st.sets(st.integers(0, n - 1), min_size=1)),
        "c2": draw(st.sets(st.integers(0, n - 1))),
    }
    steps = draw(st.lists(st.tuples(st.sampled_from(kinds), st.integers(0, 10**6)), max_size=80))
    choices = st.sampled_from([0, 0, 0, *range(1, len(RESTRICTIONS))])
    restrict = draw(st.lists(choices, min_size=n, max_size=n))
    duration = draw(st.sampled_from([1.0, 0.0001]))
    scale = draw(st.sampled_from([1, 1_000_000]))
    return Scenario(deps, retries, workers, wanted, steps, restrict, duration, scale)


def key(i: int) -> str:
    return f"t{i % 3}-{i}"  # three prefixes, one group per key


@dataclass
class WorkerModel:
    running: set[str] = field(default_factory=set)
    data: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    gpus: float = 0.0
    drains: list[str] = field(default_factory=list)  # ComputeReleased answers owed


class Run:
    def __init__(self, sc: Scenario):
        self.sc = sc
        self.keys = [key(i) for i in range(len(sc.deps))]
        self.dag = {self.keys[i]: [self.keys[d] for d in ds] for i, ds in enumerate(sc.deps)}
        self.descendants = self._descendants()
        self.sim = Sim(workers={}, clients=CLIENTS, ahead=True)
        # Workers come and go at random here, so a task may be present at many deaths:
        # KilledWorker (tests/core/test_scheduler_faults.py) would err it; this model's
        # errors are the explicit failures only.
        self.sim.s.allowed_failures = 1_000_000
        self.models: dict[str, WorkerModel] = {}
        self.nworkers = 0
        self.failed: set[str] = set()  # failed for good (no retry left), at some point
        self.last_failed: set[str] = set()  # whose latest outcome is such a failure
        self.stopped: list[str] = []  # keys cancelled while they were processing
        self.wants = {c: {self.keys[i] for i in sc.wanted[c]} for c in CLIENTS}
        self.restrictions = {
            k: RESTRICTIONS[r] for k, r in zip(self.keys, sc.restrict) if RESTRICTIONS[r]
        }
        # Tiny tasks are submitted with their duration as a hint: known from the start,
        # so siblings are kept together from the first placement on.
        self.hints = dict.fromkeys(self.keys, sc.duration) if sc.duration < 1 else {}
        for nthreads in sc.workers:
            self.add_worker(nthreads)

    def _descendants(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {k: {k} for k in self.keys}
        for k in reversed(self.keys):  # dependents come later
            for d in self.dag[k]:
                out[d] |= out[k]
        return out

    def ancestors(self, k: str) -> set[str]:
        return {a for a in self.keys if k in self.descendants[a]}

    # --- keeping the models in step ---------------------------------------------------

    def sync(self) -> None:
        """Feed the scheduler's messages to the worker models and check the clients'."""
        s = self.sim.s
        s.flush_progress()
        for address, model in self.models.items():
            for msg in self.sim.to_worker(address):
                if isinstance(msg, FunctionDefs):
                    assert not set(msg.functions) & model.functions, "function sent twice"
                    model.functions |= set(msg.functions)
                elif isinstance(msg, ComputeTask):
                    assert msg.func in model.functions, "task before its function"
                    assert msg.key not in model.running
                    for dep in msg.deps:
                        # held somewhere, or computing on this worker (sent ahead of it)
                        ok = dep.who_has or dep.key in model.running
                        assert ok, f"{msg.key} sent with {dep.key} held nowhere"
                    self.check_placement(msg, address)
                    # a result is inlined only for a key a client wants (one wanting it
                    # later than this is told its holders instead)
                    if msg.client_wants:
                        assert any(msg.key in w for w in self.wants.values()), msg
                    model.running.add(msg.key)
                elif isinstance(msg, ReleaseCompute):
                    assert msg.key in model.running, msg  # only what it runs
                    model.running.discard(msg.key)
                    if msg.drain:
                        model.drains.append(msg.key)
                else:
                    assert isinstance(msg, FreeKeys), msg
                    model.running.difference_update(msg.keys)
                    model.data.difference_update(msg.keys)
            assert model.running == self.sim.on(address), address
        held = set().union(*(model.data for model in self.models.values()))
        for address, model in self.models.items():
            # Nothing waits on a dependency that failed or was lost: each is held, or
            # still computing on the same worker (a task sent ahead of it).
            for k in model.running:
                for d in self.dag.get(k, ()):
                    assert d in held or d in model.running, (k, d, address)
        for address, model in self.models.items():
            held = sum(self.gpus_needed(k) for k in model.running)
            assert held <= model.gpus, f"{address} runs {held} GPUs' worth, has {model.gpus}"
            assert model.data == self.sim.holds(address), address
            ws = s.workers[address]
            assert ws.draining == dict(Counter(model.drains)), address
            assert ws.slot_threads == max(0, ws.nthreads - len(model.drains)), address
        assert set(self.sim.comm.workers) <= set(self.models)  # nothing to gone workers
        self.sim.comm.workers.clear()
        for c in CLIENTS:
            cs = s.clients.get(c)
            for msg in self.sim.to_client(c):
                if isinstance(msg, KeyCancelled):
                    continue
                if isinstance(msg, ProgressCounts):
                    assert all(0 <= p.memory + p.erred <= p.total for p in msg.prefixes), msg
                    assert cs is not None
                    assert msg.finished or cs.watches[msg.watch_id].targets, msg
                    continue
                assert isinstance(msg, KeyInMemory | KeyErred), msg
                assert cs is not None and msg.key in {ts.key for ts in cs.wants}
                if isinstance(msg, KeyInMemory):  # the client fetches from these alone
                    assert msg.who_has, msg
                    for w in msg.who_has:
                        assert w in self.models and msg.key in self.models[w].data, (msg, w)
                if isinstance(msg, KeyErred):
                    blamed = msg.key if msg.blamed is None else msg.blamed
                    assert blamed in self.failed and msg.exception == EXC

    def gpus_needed(self, k: str) -> float:
        r = self.restrictions.get(k)
        return r.resources.get("GPU", 0.0) if r is not None else 0.0

    def check_placement(self, msg: ComputeTask, address: str) -> None:
        r = self.restrictions.get(msg.key)
        assert msg.resources == (r.resources if r is not None else {})
        if r is None:
            return
        need = self.gpus_needed(msg.key)
        assert self.models[address].gpus >= need, (msg.key, address)
        if r.workers and not names(address) & set(r.workers):
            # only a loose task runs elsewhere, and only while no named worker could
            assert r.allow_other_workers, (msg.key, address)
            for other in self.models:
                if names(other) & set(r.workers):
                    assert self.models[other].gpus < need, (msg.key, address, other)

    # --- steps --------------------------------------------------------------------------

    def add_worker(self, nthreads: int, n: int | None = None) -> None:
        if n is None:
            self.nworkers += 1
            n = self.nworkers
        address = addr(n)
        self.models[address] = WorkerModel(gpus=gpus(n))
        resources = {"GPU": gpus(n)} if gpus(n) else None
        self.sim.add_worker(address, nthreads, resources=resources)

    def processing(self) -> list[str]:
        return sorted(self.sim.processing())

    def runnable(self) -> list[str]:
        """What a worker could finish (or fail) now: not waiting ahead on a dependency."""
        return sorted(self.sim.runnable())

    def finish(self, k: str) -> None:
        address = self.sim.worker_of(k)
        # a result only from dependencies that exist: never from a failed or lost one
        held = set().union(*(model.data for model in self.models.values()))
        assert set(self.dag.get(k, ())) <= held, (k, self.dag[k])
        self.sim.finish(k, nbytes=len(k) * self.sc.scale, duration=self.sc.duration)
        self.models[address].running.discard(k)
        self.models[address].data.add(k)
        self.last_failed.discard(k)

    def fail(self, k: str) -> None:
        address = self.sim.worker_of(k)
        final = self.sim.ts(k).retries == 0
        self.sim.fail(k)
        self.models[address].running.discard(k)
        if final:
            self.failed.add(k)
            self.last_failed.add(k)

    def step(self, kind: str, r: int) -> None:
        s = self.sim.s
        processing = self.processing()
        runnable = self.runnable()
        if kind in ("finish", "fail") and runnable:
            k = runnable[r % len(runnable)]
            (self.finish if kind == "finish" else self.fail)(k)
        elif kind == "add" and self.nworkers < 8:
            self.add_worker(1 + r % 2)
        elif kind == "remove" and self.models:
            address = sorted(self.models)[r % len(self.models)]
            del self.models[address]
            self.sim.remove_worker(address)
        elif kind == "release":
            c = CLIENTS[r % 2]
            if self.wants[c]:
                k = sorted(self.wants[c])[r % len(self.wants[c])]
                self.wants[c].discard(k)
                self.sim.release(k, client=c)
        elif kind == "cancel":
            c = CLIENTS[r % 2]
            k = self.keys[r % len(self.keys)]
            self.wants[c] -= self.descendants[k]
            self.sim.cancel(k, client=c)
        elif kind == "copy":  # a worker fetched a replica
            in_memory = sorted(k for k, ts in s.tasks.items() if ts.state == "memory")
            if in_memory and self.models:
                k = in_memory[r % len(in_memory)]
                address = sorted(self.models)[r % len(self.models)]
                self.sim.add_keys(address, {k: len(k)})
                self.models[address].data.add(k)
        elif kind == "drained":  # a worker says a released task's thread is free
            owing = sorted(a for a, model in self.models.items() if model.drains)
            if owing:
                address = owing[r % len(owing)]
                drains = self.models[address].drains
                self.sim.drained(address, drains.pop(r % len(drains)), sid="drained")
        elif kind == "stop" and processing:  # every client cancels a running task
            k = processing[r % len(processing)]
            self.stopped.append(k)
            for c in CLIENTS:
                self.wants[c] -= self.descendants[k]
                self.sim.cancel(k, client=c)
        elif kind == "rewant" and self.stopped:  # a client submits a stopped key again
            c = CLIENTS[r % 2]
            k = self.stopped[r % len(self.stopped)]
            sub = sorted(self.ancestors(k) | {k}, key=self.keys.index)
            self.wants[c].add(k)
            self.sim.submit(
                {a: self.dag[a] for a in sub},
                wanted=[k],
                client=c,
                retries={a: self.sc.retries[self.keys.index(a)] for a in sub},
                restrictions={a: self.restrictions[a] for a in sub if a in self.restrictions},
                durations=self.hints,
                sid=f"resubmit-{k}",
            )
        elif kind == "watch":  # a progress bar over some keys (a watch id used again)
            c = CLIENTS[r % 2]
            watched = [self.keys[(r + i) % len(self.keys)] for i in range(1 + r % 3)]
            s.handle_client(c, WatchProgress(r % 3, watched, "watch"))
        elif kind == "miss":  # a worker found no holder of a dependency
            # (also a task sent ahead: its worker may have lost the race with a failure
            # of the dependency, reported before the task came)
            with_deps = [k for k in processing if self.dag[k]]
            if with_deps:
                k = with_deps[r % len(with_deps)]
                address = self.sim.worker_of(k)
                d = self.dag[k][r % len(self.dag[k])]
                if address not in {w.address for w in s.tasks[d].who_has}:
                    s.handle_worker(address, MissingData(k, [d], "miss"))
                    self.models[address].running.discard(k)
        self.sync()

    def run(self) -> None:
        for i, c in enumerate(CLIENTS):
            self.sim.submit(
                self.dag,
                wanted=sorted(self.wants[c]),
                client=c,
                retries={k: self.sc.retries[j] for j, k in enumerate(self.keys)},
                restrictions=self.restrictions,
                durations=self.hints,
                sid=f"submit-{i}",
            )
            self.sync()
        for kind, r in self.sc.steps:
            self.step(kind, r)
        if not self.models:
            self.add_worker(1)
            self.sync()
        for n in (1, 2):  # the named workers, and with them GPUs enough for every task
            if addr(n) not in self.models:
                self.add_worker(1, n)
                self.sync()
        for _ in range(10 * len(self.keys) + 10):
            self.drain_all()
            runnable = self.runnable()
            if not runnable:
                break  # (check_outcome: nothing left processing, ahead or not)
            self.finish(runnable[0])
            self.sync()
        self.check_outcome()
        self.release_everything()

    def drain_all(self) -> None:
        """Every worker answers for every released task it was running."""
        for address, model in self.models.items():
            while model.drains:
                self.sim.drained(address, model.drains.pop(), sid="drained")
                self.sync()

    def check_outcome(self) -> None:
        s = self.sim.s
        assert not self.processing() and s.nqueued == 0
        wanted = self.wants["c1"] | self.wants["c2"]
        for c in CLIENTS:
            assert {ts.key for ts in s.clients[c].wants} == self.wants[c], c
        for k in wanted:
            ts = s.tasks[k]
            assert ts.state in ("memory", "erred"), (k, ts.state, s.story(k))
            if ts.state == "erred":
                blame = ts.exception_blame or ts
                assert blame.key in self.failed, (k, blame.key)
                assert blame.key in self.ancestors(k), (k, blame.key)
                assert ts.exception == EXC
            # erred exactly for a failure: nothing it depends on failed -> in memory. (The
            # converse needs care: a dependency may fail when recomputed after a loss,
            # once "k" is already in memory; then "k" rightly stays there.)
            if not self.ancestors(k) & self.failed:
                assert ts.state == "memory", k
            if k in self.last_failed:
                assert ts.state == "erred", k
        for c in CLIENTS:  # a watch still open waits for a key not finished
            for watch in s.clients[c].watches.values():
                assert any(ts.state not in FINISHED for ts in watch.targets), watch
        # nothing runs for nobody, and nothing is kept for nobody
        for ts in s.tasks.values():
            if ts.state == "memory":
                assert ts.who_wants or ts.waiters, ts

    def release_everything(self) -> None:
        s = self.sim.s
        self.sim.release(*sorted(self.wants["c1"]), client="c1")
        self.wants["c1"] = set()
        self.sync()
        s.remove_client("c2", "bye")
        self.sync()
        self.drain_all()
        assert s.tasks == {}, s.tasks
        assert s.groups == {} and s.nqueued == 0
        for address, ws in s.workers.items():
            assert ws.processing == set() and ws.has_what == set(), address
            assert ws.nbytes == 0 and ws.occupancy == 0
            assert ws.draining == {} and ws.slot_threads == ws.nthreads
            assert ws in s.free_workers
            assert self.models[address].data == set() == self.models[address].running
        for tp in s.prefixes.values():
            assert tp.alive == 0 and tp.ngroups == 0 and tp.nbytes == 0


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_dags_and_events(sc: Scenario):
    Run(sc).run()


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(CANCEL_STEPS))
def test_random_cancels_of_running_tasks(sc: Scenario):
    """Threads of released tasks count busy until their workers answer, whatever the
    order of cancels, submissions of the same keys, answers and departures."""
    Run(sc).run()


def test_a_fixed_scenario_runs():
    """A hand-written scenario through the same machinery, as a smoke test of the model."""
    sc = Scenario(
        deps=[[], [0], [0, 1], [], [2, 3]],
        retries=[0, 1, 0, 0, 0],
        workers=[1, 2],
        wanted={"c1": {2, 4}, "c2": {1}},
        steps=[("finish", 0), ("fail", 0), ("remove", 0), ("copy", 1), ("finish", 1)]
        + [("miss", 0), ("cancel", 3), ("add", 1), ("release", 1), ("fail", 5)],
    )
    Run(sc).run()


# --- pins ------------------------------------------------------------------------------
# Pins come and go with everything else: made by the two clients, by clients that leave
# and come back, and by "shuffles" that end; released, renewed, expired by ticks of the
# wall clock; dropped with workers that die. A model of every pin (its workers, owner
# and expiry), updated only from the events, must equal the scheduler's pins after each
# step: no pin outlives its owner, its lease or all of its workers.

PIN_CLIENTS = ("p1", "p2")
PIN_STEPS = (*STEPS, "pin", "pin", "pin", "unpin", "renew", "tick", "tick", "leave", "join")
PIN_STEPS += ("end", "remove")


@dataclass
class PinModel:
    workers: set[str]
    owner: str
    lease: float | None
    expires: float | None


class PinRun(Run):
    def __init__(self, sc: Scenario):
        self.pin_models: dict[int, PinModel] = {}
        self.shuffles = {0, 1}  # alive
        self.next_shuffle = 2
        self.known_clients: set[str] = set()
        self.known_workers: set[str] = set()
        self.now = 1_000.0
        super().__init__(sc)
        s = self.sim.s
        s.pin_owner_kinds["shuffle"] = lambda ident: int(ident) in self.shuffles
        s.tick(self.now)
        for c in PIN_CLIENTS:
            s.add_client(c)
        self.known_clients = set(s.clients)

    def owners(self) -> list[str]:
        clients = [f"client:{c}" for c in sorted(self.sim.s.clients)]
        return clients + [f"shuffle:{i}" for i in sorted(self.shuffles)]

    def step(self, kind: str, r: int) -> None:
        s = self.sim.s
        pins = sorted(self.pin_models)
        if kind == "pin" and self.models:
            owners = self.owners()
            owner = owners[r % len(owners)]
            live = sorted(self.models)
            workers = {live[r % len(live)], live[(r // 7) % len(live)]}
            lease = [None, 1.0, 2.5][r % 3]
            if owner.startswith("client:") and r % 2:  # as the client's request
                s.handle_client(owner[7:], PinWorkers(r, sorted(workers), "why", lease, "pin"))
                [reply] = [m for m in self.sim.to_client(owner[7:]) if isinstance(m, PinReply)]
                pin_id = reply.pin_id
            else:
                pin_id = s.add_pin(sorted(workers), "why", owner, lease, "pin").id
            expires = None if lease is None else self.now + lease
            self.pin_models[pin_id] = PinModel(workers, owner, lease, expires)
        elif kind == "unpin" and pins:
            pin_id = pins[r % len(pins)]
            assert s.release_pin(pin_id, "unpin") is True
            del self.pin_models[pin_id]
            assert s.release_pin(pin_id, "unpin") is False
        elif kind == "renew" and pins:
            pin = self.pin_models[pins[r % len(pins)]]
            assert s.renew_pin(pins[r % len(pins)], "renew") is True
            if pin.lease is not None:
                pin.expires = self.now + pin.lease
        elif kind == "tick":
            self.now += r % 3
            s.tick(self.now)
            for pin_id, pin in list(self.pin_models.items()):
                if pin.expires is not None and pin.expires <= self.now:
                    del self.pin_models[pin_id]
        elif kind == "leave":
            present = [c for c in PIN_CLIENTS if c in s.clients]
            if present:
                s.remove_client(present[r % len(present)], "leave")
        elif kind == "join":
            for c in PIN_CLIENTS:
                s.add_client(c)
        elif kind == "end" and self.shuffles:
            ended = sorted(self.shuffles)[r % len(self.shuffles)]
            s.release_pins_of(f"shuffle:{ended}", "end", "shuffle finished")
            self.shuffles.discard(ended)
            self.shuffles.add(self.next_shuffle)
            self.next_shuffle += 1
            self.drop_owner(f"shuffle:{ended}")
        else:
            super().step(kind, r)
            return  # synced
        self.sync()

    def drop_owner(self, owner: str) -> None:
        for pin_id, pin in list(self.pin_models.items()):
            if pin.owner == owner:
                del self.pin_models[pin_id]

    def sync(self) -> None:
        super().sync()
        s = self.sim.s
        for address in self.known_workers - set(self.models):  # workers that died
            for pin_id, pin in list(self.pin_models.items()):
                pin.workers.discard(address)
                if not pin.workers:
                    del self.pin_models[pin_id]
        self.known_workers = set(self.models)
        for c in self.known_clients - set(s.clients):  # clients that left
            self.drop_owner(f"client:{c}")
        self.known_clients = set(s.clients)
        for c in PIN_CLIENTS:
            self.sim.to_client(c)
        got = {
            pin_id: (set(p.workers), p.owner, p.lease, p.expires) for pin_id, p in s.pins.items()
        }
        want = {
            pin_id: (p.workers, p.owner, p.lease, p.expires)
            for pin_id, p in self.pin_models.items()
        }
        assert got == want
        pinned = {a for p in self.pin_models.values() for a in p.workers}
        assert {a for a in s.workers if s.is_pinned(a)} == pinned


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(PIN_STEPS))
def test_random_events_with_pins(sc: Scenario):
    PinRun(sc).run()
