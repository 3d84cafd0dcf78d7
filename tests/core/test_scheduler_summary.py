"""The cluster summary kept by the scheduler core: counters updated as events happen,
and a version that moves only when something changed."""

from __future__ import annotations

from scheduler_harness import W1, W2, Sim

from shoal.protocol.messages import WorkerStatus


def test_summary_counts_workers_tasks_and_prefixes():
    sim = Sim({W1: 2, W2: 1})
    s = sim.s.summary()
    assert (s.workers, s.nthreads, s.tasks, s.prefixes) == (2, 3, {}, [])
    sim.submit({"inc-1": [], "inc-2": [], "sum-1": ["inc-1", "inc-2"]})
    s = sim.s.summary()
    assert s.tasks == {"processing": 2, "waiting": 1}
    assert {p.name: p.states for p in s.prefixes} == {
        "inc": {"processing": 2},
        "sum": {"waiting": 1},
    }
    sim.run_all()
    s = sim.s.summary()
    assert s.tasks == {"memory": 3}
    assert s.nbytes == 24
    [inc] = [p for p in s.prefixes if p.name == "inc"]
    assert inc.duration_count == 2 and inc.nbytes == 16
    sim.release("inc-1", "inc-2", "sum-1")
    assert sim.s.summary().tasks == {}
    assert sim.s.summary().prefixes == []  # no live task: not listed


def test_version_moves_only_on_change():
    sim = Sim({W1: 1})
    v0 = sim.s.version
    sim.s.handle_worker(W1)  # an empty batch: nothing changed
    assert sim.s.version == v0
    sim.submit({"a": []})
    v1 = sim.s.version
    assert v1 > v0
    sim.s.handle_worker(W1, WorkerStatus("paused", "p"))
    assert sim.s.version > v1
    assert sim.s.summary().paused == 1
    v2 = sim.s.version
    sim.add_worker(W2, 4)
    assert sim.s.version > v2
    assert sim.s.summary().nthreads == 5
    sim.remove_worker(W2)
    assert sim.s.summary().nthreads == 1
