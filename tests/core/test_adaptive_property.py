"""Scale and adapt decisions in the middle of random graphs, on the simulated cluster of
``test_cluster_property.py`` (real scheduler and worker state machines, links in a
random interleaving): workers start (and join later), retire (their data copied first),
have their retirements cancelled by a scale-up, and close when told.

What must hold: every invariant after every event; no result is ever computed twice
(retirement never loses data, and nothing it does counts as a failure); after
``scale(n)`` the workers counted (joined and not retiring, or still starting) are ``n``,
or more when the data held needs them; once everything is delivered every key is in
memory."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized
from test_cluster_property import Cluster, Value

from shoal.core.worker.state import ExecuteSuccess, WorkerState
from shoal.protocol.messages import CloseWorker, ScaleReply, ScaleRequest


class ScalingCluster(Cluster):
    def __init__(self, seed: int, keys: list[str]):
        super().__init__(seed, dict.fromkeys(keys, "ok"))
        self.launching: list[str] = []  # started, not yet joined
        self.by_name: dict[str, str] = {}  # joined: name -> address
        self.runs: Counter[str] = Counter()
        self.next_name = 0

    def start(self, n: int) -> None:
        for _ in range(n):
            self.next_name += 1
            self.launching.append(f"n{self.next_name}")

    def join(self, name: str) -> None:
        self.launching.remove(name)
        self.serial += 1
        address = f"tcp://w{self.serial}:1"
        self.workers[address] = WorkerState(2, address, validate=True)
        self.to_scheduler[address], self.to_worker[address] = deque(), deque()
        self.executions[address], self.gathers[address] = [], []
        self.by_name[name] = address
        self.sim.add_worker(address, nthreads=2, name=name)
        self.pump()

    def names(self) -> list[str]:
        return [*self.by_name, *self.launching]

    def request(self, n: int, adaptive: dict[str, Any] | None = None) -> ScaleReply:
        self.sid += 1
        if adaptive is None:
            msg = ScaleRequest(self.sid, self.names(), n)
        else:
            msg = ScaleRequest(self.sid, self.names(), -1, "s", **adaptive)
        self.sim.s.handle_client("c", msg)
        [reply] = [m for m in self.sim.comm.clients["c"] if isinstance(m, ScaleReply)]
        self.pump()
        assert not reply.error
        s = self.sim.s
        for name in reply.closing:  # scaling never picks a pinned worker
            assert not s.is_pinned(self.by_name[name]), name
        for name in reply.stop:
            self.launching.remove(name)
        self.start(reply.start)
        return reply

    def counted(self) -> int:
        s = self.sim.s
        joined = [s.workers[a] for a in self.by_name.values() if a in s.workers]
        return len(self.launching) + sum(1 for ws in joined if ws.status != "retiring")

    def actions(self) -> list[tuple[str, str]]:
        return super().actions() + [("join", name) for name in self.launching]

    def step(self, action: str, address: str) -> None:
        if action == "join":
            self.join(address)
            return
        if action == "deliver-to-worker" and isinstance(self.to_worker[address][0], CloseWorker):
            name = next(n for n, a in self.by_name.items() if a == address)
            del self.by_name[name]
            assert address not in self.sim.s.workers  # removed before it was told
            self.kill(address)  # the process exits
            return
        if action == "execute":
            key = self.executions[address].pop(self.rng.randrange(len(self.executions[address])))
            self.runs[key] += 1
            event = ExecuteSuccess(key, Value(key, "ok"), 8, None, "Value", 1.0, 2.0, "ran")
            self.worker_handles(address, event)
            self.pump()
            return
        super().step(action, address)


@dataclass
class Scenario:
    deps: list[list[int]]
    scales: dict[int, int | dict[str, Any]]  # step -> scale(n), or adapt settings
    pins: dict[int, int]  # step -> pin the i-th joined worker (-1: release every pin)
    seed: int


adapt_settings = st.fixed_dictionaries(
    {
        "minimum": st.integers(0, 2),
        "maximum": st.integers(2, 5),
        "target_duration": st.sampled_from([0.5, 1.0, 5.0]),
        "wait_count": st.integers(1, 3),
        "default_task_duration": st.sampled_from([0.1, 1.0]),
        "threads_per_worker": st.just(2),
    }
)


@st.composite
def scenarios(draw: Any) -> Scenario:
    n = draw(st.integers(1, 15))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    scales = draw(
        st.dictionaries(
            st.integers(0, 80), st.one_of(st.integers(0, 4), adapt_settings), max_size=6
        )
    )
    pins = draw(st.dictionaries(st.integers(0, 80), st.integers(-1, 3), max_size=4))
    return Scenario(deps, scales, pins, draw(st.integers(0, 2**32)))


@settings(max_examples=sized(ci=100, full=300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(scenarios())
def test_scaling_never_recomputes_and_never_hangs(sc: Scenario) -> None:
    keys = [f"t-{i}" for i in range(len(sc.deps))]
    cluster = ScalingCluster(sc.seed, keys)
    cluster.start(2)
    for name in list(cluster.launching):
        cluster.join(name)
    dag = {keys[i]: [keys[d] for d in ds] for i, ds in enumerate(sc.deps)}
    cluster.sim.submit(dag)
    cluster.pump()
    s = cluster.sim.s
    for step in range(200):
        pin = sc.pins.get(step)
        joined = [
            a
            for a in cluster.by_name.values()
            if a in s.workers and s.workers[a].status != "retiring"  # one may not pin those
        ]
        if pin == -1:
            for pin_id in list(s.pins):
                s.release_pin(pin_id, f"unpin-{step}")
        elif pin is not None and joined:
            s.add_pin([joined[pin % len(joined)]], "state", "client:c", None, f"pin-{step}")
        todo = sc.scales.get(step)
        if isinstance(todo, int):
            reply = cluster.request(todo)
            counted = cluster.counted()
            assert counted == todo or (counted > todo and reply.action == "down"), (todo, reply)
        elif todo is not None:
            cluster.request(-1, todo)
            assert cluster.counted() <= max(todo["maximum"], len(cluster.names()))
        actions = cluster.actions()
        if not actions:
            break
        cluster.step(*cluster.rng.choice(actions))
    cluster.request(2)  # whatever the last decision was, there is work to finish
    cluster.quiesce()
    assert all(s.tasks[k].state == "memory" for k in keys), cluster.sim.states()
    assert all(n == 1 for n in cluster.runs.values()), cluster.runs  # nothing recomputed
    assert set(cluster.runs) == set(keys)
    assert set(s.scaling_down) <= set(s.retiring)
    assert s.suspicious == {}  # nothing counted as a failure
