"""The scheduler and seceded tasks (TaskSeceded): a task that waits on others stops
holding a thread slot and expected time on its worker, so queued root tasks (the ones
it waits on) go to that worker; it keeps its resources and is finished as usual."""

from __future__ import annotations

from scheduler_harness import W1, Sim

from shoal.protocol.messages import TaskRestrictions, TaskSeceded


def test_a_seceded_task_frees_its_slot_for_queued_tasks():
    sim = Sim({W1: 1})
    keys = [f"r-{i}" for i in range(5)]
    sim.submit(dict.fromkeys(keys, []))
    assert sim.computes(W1) == keys[:2]  # min_slots of a one-thread worker
    sim.s.handle_worker(W1, TaskSeceded("r-0", "secede-r-0"))
    assert sim.computes(W1) == ["r-2"]  # r-0's slot went to the next queued task
    assert sim.ts("r-0").estimate == 0.0 and sim.state("r-0") == "processing"
    sim.s.handle_worker(W1, TaskSeceded("r-0", "again"))  # told twice: nothing changes
    assert sim.computes(W1) == []
    sim.finish("r-0")
    assert sim.state("r-0") == "memory" and not sim.ws(W1).long_running
    assert sim.computes(W1) == []  # r-0 held no slot: its end frees none
    sim.finish("r-1")
    assert sim.computes(W1) == ["r-3"]


def test_a_stale_secede_is_ignored():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.finish("a")
    sim.s.handle_worker(W1, TaskSeceded("a", "late"))
    sim.s.handle_worker(W1, TaskSeceded("gone", "late"))
    assert sim.state("a") == "memory" and not sim.ws(W1).long_running


def test_a_seceded_task_keeps_its_resources_and_leaves_with_its_worker():
    sim = Sim({})
    sim.add_worker(W1, 1, resources={"GPU": 1})
    gpu = TaskRestrictions(resources={"GPU": 1})
    sim.submit({"g0": [], "g1": []}, restrictions={"g0": gpu, "g1": gpu})
    assert sim.computes(W1) == ["g0"]
    sim.s.handle_worker(W1, TaskSeceded("g0", "secede"))
    assert sim.computes(W1) == []  # the GPU is still g0's
    sim.remove_worker(W1)
    assert sim.state("g0") != "processing"
