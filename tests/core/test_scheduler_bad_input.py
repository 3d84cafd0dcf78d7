"""Well-formed messages that make no sense for their sender: the scheduler core
answers or ignores them and its state stays valid (every Sim checks its invariants
after each event)."""

from __future__ import annotations

import pytest
from scheduler_harness import ARGS, W1, W2, Sim

from shoal.protocol.messages import (
    FreeKeys,
    KeyCancelled,
    KeyErred,
    ScatterDone,
    SubmitTasks,
    TaskFinished,
    TaskSpec,
)

FUNCS = {"f": b"pickled f"}


def part(sim: Sim, dag, wanted=(), more=True, client="c"):
    specs = [TaskSpec(k, "f", ARGS, list(deps)) for k, deps in dag.items()]
    sim.s.handle_client(client, SubmitTasks(specs, list(wanted), FUNCS, "part", more))


def test_releasing_keys_one_never_wanted_changes_nothing():
    """Another client's release of keys still being submitted in parts must not
    forget them (the graph's last part would then find its dependency gone)."""
    sim = Sim(clients=["c", "other"])
    part(sim, {"a": []})
    sim.release("a", "nowhere", client="other")
    assert sim.states() == {"a": "released"}
    part(sim, {"b": ["a"]}, wanted=["b"], more=False)
    assert sim.run_all() and sim.state("b") == "memory"
    assert not [m for m in sim.to_client() if isinstance(m, KeyErred)]


def test_releasing_keys_another_client_wants_changes_nothing():
    sim = Sim(clients=["c", "other"])
    sim.submit({"x": []})
    sim.run_all()
    sim.release("x", client="other")
    assert sim.state("x") == "memory"


def test_a_result_from_the_wrong_worker_is_freed_there():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"x": []})
    other = W2 if sim.worker_of("x") == W1 else W1
    sim.s.handle_worker(other, TaskFinished("x", 8, 0.0, 1.0, stimulus_id="liar"))
    assert sim.state("x") == "processing" and sim.worker_of("x") != other
    assert FreeKeys(["x"], "liar") in sim.to_worker(other)
    sim.s.handle_worker(other, TaskFinished("never-submitted", 8, 0.0, 1.0, stimulus_id="l2"))
    assert "never-submitted" not in sim.states()


def test_a_client_may_not_send_worker_messages():
    sim = Sim()
    with pytest.raises(TypeError, match="a client may not send TaskFinished"):
        sim.s.handle_client("c", TaskFinished("x", 8, 0.0, 1.0))
    with pytest.raises(TypeError, match="a worker may not send SubmitTasks"):
        sim.s.handle_worker(W1, SubmitTasks([], []))


def test_scatter_to_an_unknown_worker_errs_the_key():
    sim = Sim()
    sim.s.handle_client("c", ScatterDone(["s"], [8], "tcp://nowhere:1", "sc"))
    assert sim.state("s") == "erred"
    [erred] = [m for m in sim.to_client() if isinstance(m, KeyErred)]
    assert erred.key == "s"


def test_wanting_unknown_and_odd_keys():
    sim = Sim()
    keys = [-(2**63), 2**63 - 1, ("", (), (("",),)), "ghost"]
    sim.want(*keys)
    cancelled = [m for m in sim.to_client() if isinstance(m, KeyCancelled)]
    assert len(cancelled) == len(keys)
    assert sim.states() == {}


def test_mismatched_lists_cannot_be_built_either():
    with pytest.raises(ValueError, match="ScatterDone has 2 keys but 1 sizes"):
        ScatterDone(["a", "b"], [1], W1)
