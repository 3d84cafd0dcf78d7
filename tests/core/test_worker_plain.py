"""The worker's shortcut for plain tasks (shoal/core/worker/plain.py).

Two worker state machines, one with the shortcut and one without, get the same random
events (computes with dependencies here, elsewhere or still running, results, failures,
transfers that succeed, miss or fail, frees, releases with drain and interrupt, secede
and rejoin, resources, data scattered over running tasks): after every event their
instructions, stories, task states, data and counts must be equal, and both validate
their invariants. The unit tests check which cases take the shortcut at all.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.core.worker import plain
from shoal.core.worker.state import (
    Execute,
    ExecuteFailure,
    ExecuteSuccess,
    GatherDep,
    GatherFailure,
    GatherSuccess,
    Instruction,
    Rejoin,
    ResumeThread,
    Secede,
    SendMessage,
    UpdateDataEvent,
    WorkerState,
)
from shoal.protocol.messages import (
    ComputeTask,
    DepInfo,
    FreeKeys,
    Payload,
    ReleaseCompute,
    TaskFinished,
)

ME = "tcp://me:1"
PEERS = ("tcp://p1:1", "tcp://p2:1")
ARGS = Payload(0, b"\x92\x90\x80")
EXC = Payload(1, b"exception")


def make(shortcuts: bool, nthreads: int = 2, **kwargs: Any) -> WorkerState:
    ws = WorkerState(nthreads, ME, validate=True, resources={"GPU": 2.0}, **kwargs)
    ws.plain_shortcuts = shortcuts
    return ws


def snapshot(ws: WorkerState) -> Any:
    tasks = {
        k: (
            ts.state,
            ts.wanted,
            ts.run_id,
            ts.priority,
            ts.nbytes,
            ts.type_name,
            ts.start,
            ts.stop,
            ts.run_spec,
            ts.resources,
            sorted(d.key for d in ts.dependencies),
            sorted(d.key for d in ts.dependents),
            sorted(d.key for d in ts.waiting_for_data),
            sorted(ts.who_has),
        )
        for k, ts in ws.tasks.items()
    }
    return (
        tasks,
        dict(ws.data),
        ws.task_counts(),
        ws.ready_count,
        ws.executing_count,
        ws.seceded_count,
        dict(ws.available_resources),
        ws._recent_duration,
        per_key_story(ws),
    )


def per_key_story(ws: WorkerState) -> dict[Any, list[tuple[Any, ...]]]:
    """Each key's records in order (between keys the order may follow set iteration,
    which differs between two machines' task objects)."""
    out: dict[Any, list[tuple[Any, ...]]] = {}
    for entry in ws._story._log:
        out.setdefault(entry[0], []).append(entry)
    return out


class Twins:
    """The same events to a worker with the shortcut and one without; equal after each."""

    def __init__(self, nthreads: int = 2):
        self.fast = make(True, nthreads)
        self.slow = make(False, nthreads)
        self.executing: list[str] = []  # keys handed to threads, not ended
        self.seceded: list[str] = []
        self.gathers: list[GatherDep] = []

    def handle(self, *events: Any) -> list[Instruction]:
        fast = self.fast.handle(*events)
        slow = self.slow.handle(*events)
        assert fast == slow
        assert snapshot(self.fast) == snapshot(self.slow)
        for inst in fast:
            if type(inst) is Execute:
                self.executing.append(inst.key)
            elif type(inst) is GatherDep:
                self.gathers.append(inst)
        return fast


def random_run(seed: int, steps: int) -> Twins:
    rng = random.Random(seed)
    twins = Twins(nthreads=rng.choice((1, 2)))
    made = 0
    for step in range(steps):
        sid = f"s{step}"
        known = list(twins.fast.tasks)
        roll = rng.random()
        if roll < 0.35:  # a new compute, its dependencies here, elsewhere or unknown
            made += 1
            key = f"t{made}"
            deps = []
            for dkey in rng.sample(known, min(len(known), rng.choice((0, 0, 1, 2, 4)))):
                holders = rng.choice(([ME], [PEERS[0]], list(PEERS), [ME, PEERS[1]], []))
                deps.append(DepInfo(dkey, 8, holders))
            if rng.random() < 0.1:  # an unknown dependency a peer holds
                deps.append(DepInfo(f"far{step}", 8, [rng.choice(PEERS)]))
            resources = {"GPU": 1.0} if rng.random() < 0.1 else {}
            prio = (rng.randrange(3), step)
            ev = ComputeTask(key, "f", ARGS, prio, deps, sid, resources, run_id=rng.randrange(1, 3))
            twins.handle(ev)
        elif roll < 0.6 and twins.executing:  # a thread ends
            key = twins.executing.pop(rng.randrange(len(twins.executing)))
            if key in twins.seceded:
                twins.seceded.remove(key)
            start = float(step)
            stop = start + rng.choice((1e-5, 0.001, 0.1))
            if rng.random() < 0.85:
                ev: Any = ExecuteSuccess(key, f"v-{key}", 8, None, "str", start, stop, sid)
            else:
                ev = ExecuteFailure(key, EXC, "tb", start, stop, sid)
            twins.handle(ev)
        elif roll < 0.7 and twins.gathers:  # a transfer ends: delivered, partly, or not
            g = twins.gathers.pop(rng.randrange(len(twins.gathers)))
            if rng.random() < 0.8:
                got = [k for k in g.keys if rng.random() < 0.85]
                missing = [k for k in g.keys if k not in got]
                data = {k: f"v-{k}" for k in got}
                twins.handle(GatherSuccess(g.worker, data, dict.fromkeys(got, 8), missing, sid))
            else:
                twins.handle(GatherFailure(g.worker, g.keys, sid))
        elif roll < 0.82 and known:  # the scheduler frees keys
            keys = rng.sample(known, min(len(known), rng.randint(1, 3)))
            twins.handle(FreeKeys(keys, sid))
        elif roll < 0.88 and known:  # the scheduler takes a compute back
            key = rng.choice(known)
            twins.handle(ReleaseCompute(key, rng.random() < 0.7, rng.random() < 0.2, sid))
        elif roll < 0.91 and twins.executing:  # a client scatters over a running task
            key = rng.choice(twins.executing)
            twins.handle(UpdateDataEvent({key: f"s-{key}"}, {key: 8}, sid))
        elif roll < 0.94 and twins.executing:  # a running task secedes, or rejoins
            key = rng.choice(twins.executing)
            fast_ts = twins.fast.tasks.get(key)
            if key in twins.seceded and fast_ts is not None and fast_ts in twins.fast._seceded:
                twins.handle(Rejoin(key, sid))
            elif fast_ts is not None and fast_ts in twins.fast._executing:
                twins.seceded.append(key)
                twins.handle(Secede(key, sid))
        else:  # several events in one batch: new computes and a free
            made += 2
            batch = [
                ComputeTask(f"t{made - 1}", "f", ARGS, (1, step), [], sid),
                ComputeTask(f"t{made}", "f", ARGS, (0, step), [], sid),
            ]
            if known:
                batch.append(FreeKeys([rng.choice(known)], sid))
            twins.handle(*batch)
    return twins


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_the_shortcut_and_the_general_path_agree_on_any_events(seed: int) -> None:
    random_run(seed, 120)


# --- which cases take the shortcut ---------------------------------------------------------


@pytest.fixture
def general_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the general handlers called (the shortcut did not apply)."""
    calls: list[str] = []
    for name in ("_handle_compute", "_handle_execute_success", "_handle_free_keys"):
        original = getattr(WorkerState, name)

        def spy(self: WorkerState, ev: Any, *a: Any, _o: Any = original, _n: str = name) -> Any:
            calls.append(_n)
            return _o(self, ev, *a)

        monkeypatch.setattr(WorkerState, name, spy)
    return calls


def compute(key: str, *deps: DepInfo, **kwargs: Any) -> ComputeTask:
    return ComputeTask(key, "f", ARGS, (0,), list(deps), f"c-{key}", **kwargs)


def done(key: str) -> ExecuteSuccess:
    return ExecuteSuccess(key, 1, 8, None, "int", 1.0, 2.0, f"d-{key}")


def test_plain_tasks_take_the_shortcut(general_calls: list[str]) -> None:
    ws = make(True, nthreads=1)
    assert ws.handle(compute("a")) == [Execute("a", "c-a")]
    assert ws.handle(done("a")) == [
        SendMessage(TaskFinished("a", 8, 1.0, 2.0, None, "int", "d-a", 0), "d-a")
    ]
    ws.handle(compute("b", DepInfo("a", 8, [ME])))  # its dependency is in memory here
    ws.handle(done("b"))
    assert general_calls == []
    assert ws.tasks["b"].state == "memory" and ws.data == {"a": 1, "b": 1}
    ws.handle(FreeKeys(["a"], "f"))
    assert "a" not in ws.tasks and "a" not in ws.data  # no dependent left to keep it


@pytest.mark.parametrize(
    "case",
    ["dependency elsewhere", "dependency running", "resources", "known key", "seceded"],
)
def test_other_tasks_take_the_general_path(case: str, general_calls: list[str]) -> None:
    ws = make(True, nthreads=2)
    if case == "dependency elsewhere":
        ws.handle(compute("b", DepInfo("a", 8, [PEERS[0]])))
        expected = ["_handle_compute"]
    elif case == "dependency running":
        ws.handle(compute("a"))
        ws.handle(compute("b", DepInfo("a", 8, [ME])))
        expected = ["_handle_compute"]
    elif case == "resources":
        ws.handle(compute("a", resources={"GPU": 1.0}))
        ws.handle(done("a"))
        expected = ["_handle_compute", "_handle_execute_success"]
    elif case == "known key":  # computed again: its result is reported, not recomputed
        ws.handle(compute("a"))
        ws.handle(done("a"))
        assert ws.handle(compute("a")) == [
            SendMessage(TaskFinished("a", 8, 1.0, 2.0, type_name="int", stimulus_id="c-a"), "c-a")
        ]
        expected = ["_handle_compute"]
    else:
        ws.handle(compute("a"))
        ws.handle(Secede("a", "sec"))
        ws.handle(done("a"))
        expected = ["_handle_execute_success"]
    assert general_calls == expected
    assert plain.handle_compute is WorkerState._HANDLERS[ComputeTask]


def test_rejoined_task_ends_through_the_general_path(general_calls: list[str]) -> None:
    ws = make(True, nthreads=1)
    ws.handle(compute("a"))
    ws.handle(Secede("a", "sec"))
    assert ws.handle(Rejoin("a", "rej")) == [ResumeThread("a", "rej")]  # its slot is free
    ws.handle(done("a"))
    assert general_calls == ["_handle_execute_success"]
    assert ws.tasks["a"].state == "memory"
