"""A small graph run whole by lane (``shoal/lanes/_graph_run.py``), against random
graphs on a stand-in worker whose tasks add up their dependencies' values, on a clock
the test moves: the values are the graph's, each result is let go once nothing left
to run needs it (unless asked for), the first failure ends the run, and the run stops
exactly when the time or the bytes it holds go past its limits, never before.

What is alive is seen through weak references to the values themselves, not through
the run's own bookkeeping."""

from __future__ import annotations

import types
import weakref
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized

from shoal.core.worker.lanes import GraphLimits
from shoal.core.worker.state import ExecuteFailure, ExecuteSuccess
from shoal.lanes import _graph_run
from shoal.protocol import messages as m


class Value:
    """A task's result (weakly referenceable, so the test sees when it is let go)."""

    def __init__(self, n: int):
        self.n = n


class StandIn:
    """The worker a graph runs on: a task adds its dependencies' values to its own
    number, takes its given seconds on the test's clock, and fails when told to."""

    _output = None

    def __init__(self, nodes: dict[str, dict[str, Any]], clock: list[float]):
        self.nodes = nodes
        self.clock = clock
        self.alive: dict[str, weakref.ref[Value]] = {}
        self.started: list[tuple[str, float, int, set[str]]] = []  # (key, now, bytes, alive)

    def live(self) -> set[str]:
        return {k for k, ref in self.alive.items() if ref() is not None}

    def _run_one(self, key, func, payload, resolve, coroutines):
        live = self.live()
        held = sum(self.nodes[k]["nbytes"] for k in live)
        self.started.append((key, self.clock[0], held, live))
        node = self.nodes[key]
        start = self.clock[0]
        self.clock[0] += node["seconds"]
        if node["fails"]:
            exc = m.Payload(0, msgspec.msgpack.encode(f"{key} failed"))
            return ExecuteFailure(key, exc, "", start, self.clock[0], "")
        value = Value(node["n"] + sum(resolve(dep).n for dep in node["deps"]))
        self.alive[key] = weakref.ref(value)
        return ExecuteSuccess(key, value, node["nbytes"], None, "int", start, self.clock[0], "")


@st.composite
def graphs(draw: Any) -> tuple[dict[str, dict[str, Any]], list[str], GraphLimits]:
    size = draw(st.integers(1, 16))
    nodes: dict[str, dict[str, Any]] = {}
    for i in range(size):
        deps = draw(st.lists(st.sampled_from(range(i)), unique=True, max_size=3)) if i else []
        nodes[f"t-{i}"] = {
            "deps": [f"t-{d}" for d in deps],
            "n": draw(st.integers(0, 9)),
            "seconds": draw(st.sampled_from([0.0, 0.01, 0.03])),
            "nbytes": draw(st.sampled_from([0, 100, 1000])),
            "fails": draw(st.integers(0, 19)) == 0,
        }
    keys = draw(st.lists(st.sampled_from(sorted(nodes)), min_size=1, max_size=3, unique=True))
    limits = GraphLimits(
        stop_after=draw(st.sampled_from([0.05, 0.1, 10.0])),
        max_bytes=draw(st.sampled_from([500, 2500, 10**9])),
    )
    return nodes, keys, limits


def expected_value(nodes: dict[str, dict[str, Any]], key: str) -> int:
    node = nodes[key]
    return node["n"] + sum(expected_value(nodes, dep) for dep in node["deps"])


@settings(max_examples=sized(ci=300, full=3000), deadline=None)
@given(graphs())
def test_a_graph_runs_as_the_sync_scheduler_would_within_its_limits(case):
    nodes, keys, limits = case
    clock = [100.0]
    worker = StandIn(nodes, clock)
    tasks = [m.TaskSpec(k, "f" * 24, m.Payload(0, b""), deps=n["deps"]) for k, n in nodes.items()]
    real_time = _graph_run.time
    _graph_run.time = types.SimpleNamespace(monotonic=lambda: clock[0])  # the test's clock
    try:
        msg = m.LaneRunGraph(1, "lane-1", tasks, keys)
        out = _graph_run.run_graph(worker, msg, limits)  # type: ignore[arg-type]
    finally:
        _graph_run.time = real_time

    order = list(nodes)
    ran = [r.key for r in out.ran]
    assert ran == order[: len(ran)] and ran == [s[0] for s in worker.started]
    for key, now, held, _ in worker.started[1:]:  # (the first task always runs)
        assert now - 100.0 <= limits.stop_after and held <= limits.max_bytes, (key, now, held)
    for key, _, _, live in worker.started:  # what is alive is asked for or still needed
        to_run = order[order.index(key) :]
        for k in live:
            assert k in keys or any(k in nodes[later]["deps"] for later in to_run), (key, k)
    failing = [k for k in order if nodes[k]["fails"]]
    if out.failure is not None:
        assert out.failure.key == ran[-1] == failing[0] and not out.stopped and not out.values
        assert [r.status for r in out.ran] == ["memory"] * (len(ran) - 1) + ["erred"]
    elif out.stopped:
        assert len(ran) < len(order) and not out.values and failing[:1] != ran[-1:]
        elapsed = clock[0] - 100.0
        # What the run held when it stopped: what it ran that is asked for or still
        # needed (all of which it must hold, and no more, as checked above).
        needed = {dep for k in order[len(ran) :] for dep in nodes[k]["deps"]}
        held = sum(nodes[k]["nbytes"] for k in ran if k in keys or k in needed)
        if "ran past" in out.stopped:
            assert elapsed > limits.stop_after
        else:
            assert held > limits.max_bytes and elapsed <= limits.stop_after, out.stopped
    else:
        assert ran == order and not failing
        assert [v.n for v in out.values] == [expected_value(nodes, k) for k in keys]
        assert all(r.status == "memory" for r in out.ran)
        assert [r.nbytes for r in out.ran] == [nodes[k]["nbytes"] for k in order]
