"""Graphs submitted in parts, and tasks that use several function-table entries."""

from __future__ import annotations

from scheduler_harness import ARGS, W1, Sim

from shoal.protocol.messages import ComputeTask, FunctionDefs, KeyErred, SubmitTasks, TaskSpec

FUNCS = {"f": b"pickled f", "g": b"pickled g", "h": b"pickled h"}


def part(sim: Sim, dag, wanted=(), more=True, sid="part", client="c", functions=FUNCS):
    specs = [TaskSpec(k, "f", ARGS, list(deps)) for k, deps in dag.items()]
    sim.s.handle_client(client, SubmitTasks(specs, list(wanted), dict(functions), sid, more))


def test_nothing_runs_until_the_last_part():
    sim = Sim()
    part(sim, {"a": [], "b": []}, sid="p1")
    part(sim, {"c": ["a", "b"]}, sid="p2")
    # Leaves with no dependent yet and nobody wanting them are kept, not forgotten.
    assert sim.states() == {"a": "released", "b": "released", "c": "released"}
    assert sim.to_worker(W1) == []
    part(sim, {"d": ["c"]}, wanted=["d"], more=False, sid="p3")
    assert sorted(sim.processing()) == ["a", "b"]
    assert sim.run_all() and sim.state("d") == "memory"
    # Only the wanted key stays in memory; the intermediates were freed once used.
    assert sim.states() == {"a": "released", "b": "released", "c": "released", "d": "memory"}


def test_parts_keep_dask_order_as_priority():
    sim = Sim({W1: 1})
    part(sim, {"late": []}, sid="p1")
    part(sim, {"later": []}, wanted=["late", "later"], more=False, sid="p2")
    assert sim.ts("late").priority < sim.ts("later").priority


def test_an_error_in_an_early_part_reaches_dependents_in_later_parts():
    sim = Sim()
    specs = [TaskSpec("a", "unsent-fn", ARGS, [])]
    sim.s.handle_client("c", SubmitTasks(specs, [], {}, "p1", True))
    part(sim, {"b": ["a"]}, wanted=["b"], more=False, sid="p2")
    assert sim.state("b") == "erred"
    (erred,) = [m for m in sim.to_client() if isinstance(m, KeyErred)]
    assert erred.key == "b" and erred.blamed == "a"


def test_a_client_that_leaves_mid_graph_leaves_nothing_behind():
    sim = Sim(clients=["c", "other"])
    sim.submit({"shared": []}, client="other")
    part(sim, {"a": [], "b": ["a", "shared"]})
    assert set(sim.states()) == {"a", "b", "shared"}
    sim.s.remove_client("c", "client-gone")
    assert set(sim.states()) == {"shared"}
    assert not sim.ts("shared").dependents


def test_a_task_sends_every_function_it_uses_once_per_worker():
    sim = Sim()
    specs = [
        TaskSpec("x", "f", ARGS, [], funcs=["g", "h"]),
        TaskSpec("y", "f", ARGS, [], funcs=["g"]),
    ]
    sim.s.handle_client("c", SubmitTasks(specs, ["x", "y"], dict(FUNCS), "s"))
    msgs = sim.to_worker(W1)
    defs = {}
    for msg in msgs:
        if isinstance(msg, FunctionDefs):
            assert not set(msg.functions) & set(defs), "a function was sent twice"
            defs.update(msg.functions)
    assert defs == FUNCS
    computes = [msg for msg in msgs if isinstance(msg, ComputeTask)]
    assert [c.func for c in computes] == ["f", "f"]  # the function the task calls


def test_a_function_the_client_never_sent_is_named_in_the_error():
    sim = Sim()
    specs = [TaskSpec("x", "f", ARGS, [], funcs=["nowhere"])]
    sim.s.handle_client("c", SubmitTasks(specs, ["x"], {"f": b"f"}, "s"))
    assert sim.state("x") == "erred"
    assert sim.to_worker(W1) == []


def test_a_graph_given_up_on_is_dropped():
    # The client failed to encode a later part: its last, empty part wants nothing.
    sim = Sim()
    sim.submit({"kept": []})
    part(sim, {"a": [], "b": ["a", "kept"]})
    part(sim, {}, wanted=[], more=False, sid="abandon")
    assert set(sim.states()) == {"kept"}
    assert sim.computes(W1) == ["kept"]
