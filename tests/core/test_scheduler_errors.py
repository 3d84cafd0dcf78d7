"""The scheduler state machine: errors and retries, releasing, forgetting, cancelling,
and scattered data. See ``test_scheduler.py`` for the basics."""

from __future__ import annotations

import pickle

import pytest
from scheduler_harness import ARGS, EXC, W1, W2, Sim

from shoal.protocol.messages import (
    ComputeTask,
    DepInfo,
    FreeKeys,
    KeyCancelled,
    KeyErred,
    KeyInMemory,
    Payload,
    ReleaseCompute,
)

TB = "Traceback ..."


def erred_from(msgs, blamed=None, sid=None) -> dict:
    """{key: blamed} for every KeyErred in ``msgs`` (checking the exception it carries)."""
    out = {}
    for msg in msgs:
        assert isinstance(msg, KeyErred), msg
        if blamed is not None:
            assert (msg.exception, msg.traceback) == (EXC, TB), msg
        if sid is not None:
            assert msg.stimulus_id == sid
        out[msg.key] = msg.blamed
    return out


def scheduler_error(msg: KeyErred) -> Exception:
    exc = pickle.loads(msg.exception.data)
    assert isinstance(exc, Exception)
    return exc


# --- errors ---------------------------------------------------------------------------------


def test_error_propagates_to_every_transitive_dependent():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "x": [], "b": ["a"], "c": ["b"], "d": ["b", "x"], "e": ["c", "d"]})
    sim.finish("x")
    sim.to_client()
    sim.fail("a", sid="boom")
    assert sim.states() == {
        "a": "erred",
        "x": "memory",
        "b": "erred",
        "c": "erred",
        "d": "erred",
        "e": "erred",
    }
    assert erred_from(sim.to_client(), blamed=True, sid="boom") == {
        "a": None,
        "b": "a",
        "c": "a",
        "d": "a",
        "e": "a",
    }
    a = sim.ts("a")
    assert a.exception == EXC and a.traceback == TB
    assert all(sim.ts(k).exception_blame is a for k in "bcde")
    assert sim.ws(W1).processing == set()
    assert set(sim.ts("x").waiters) == set()  # "d" no longer needs it


def test_error_reaches_a_client_that_wants_only_the_last_key():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"], "c": ["b"]}, wanted=["c"])
    sim.fail("a", sid="boom")
    assert sim.to_client() == [KeyErred("c", EXC, TB, "a", "boom")]
    assert sim.state("c") == "erred"
    # nobody wants "a" or "b": they are kept only as the dependencies of "c"
    assert sim.state("a") == sim.state("b") == "released"
    # another client asking for "c" gets the original error too
    sim.s.add_client("c2")
    sim.want("c", client="c2", sid="w")
    assert sim.to_client("c2") == [KeyErred("c", EXC, TB, "a", "w")]
    sim.release("c")
    sim.release("c", client="c2")
    assert sim.s.tasks == {}


def test_error_still_reported_after_the_failed_key_is_released():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]})
    sim.fail("a")
    sim.to_client()
    sim.release("a")
    assert sim.states() == {"a": "released", "b": "erred"}
    sim.want("b", sid="again")
    assert sim.to_client() == [KeyErred("b", EXC, TB, "a", "again")]


def test_task_submitted_on_an_erred_key_errs_at_once():
    sim = Sim()
    sim.submit({"a": []})
    sim.fail("a")
    sim.clear()
    sim.submit({"b": ["a"], "c": ["b"]}, sid="later")
    assert sim.states() == {"a": "erred", "b": "erred", "c": "erred"}
    assert erred_from(sim.to_client(), blamed=True, sid="later") == {"b": "a", "c": "a"}
    assert sim.to_worker(W1) == []  # nothing to run
    assert [e[1:3] for e in sim.s.story("b")] == [("released", "waiting"), ("waiting", "erred")]


def test_an_erred_dependency_does_not_start_its_siblings():
    """A task with one erred and one released dependency errs at once: the released
    one must not be computed for nobody."""
    sim = Sim()
    sim.submit({"bad": []})
    sim.fail("bad")
    sim.submit({"x": [], "y": ["x"]}, wanted=["y"])
    sim.finish("x")
    sim.finish("y")  # "x" is released now: only "y" needed it
    assert sim.state("x") == "released"
    sim.clear()
    sim.submit({"z": ["x", "bad"]}, sid="z")
    assert sim.state("z") == "erred"
    assert sim.to_worker(W1) == []
    assert sim.state("x") == "released"


def test_failure_of_one_dependency_releases_the_others_of_the_dependent():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "b": [], "c": ["a", "b"]}, wanted=["c"])
    sim.finish("b")
    sim.clear()
    sim.fail("a", sid="boom")
    assert sim.state("c") == "erred"
    # "b" is only a dependency of an erred task now: its data is dropped
    assert sim.state("b") == "released"
    assert sim.to_worker(W1) == [FreeKeys(["b"], "boom")]


def test_retries_rerun_then_err():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": [], "b": ["a"]}, retries={"a": 2})
    assert sim.worker_of("a") == W1
    sim.clear()
    sim.fail("a", sid="f1")
    # the task goes back through the queue, to the least loaded worker (ties: address)
    assert sim.to_worker(W1) == [
        FreeKeys(["a"], "f1"),
        ComputeTask("a", "f", ARGS, (0, 0, 0), [], "f1", run_id=2, client_wants=True),
    ]
    assert sim.state("a") == "processing" and sim.ts("a").retries == 1
    assert sim.state("b") == "waiting" and sim.to_client() == []
    sim.fail("a", sid="f2")
    assert sim.state("a") == "processing" and sim.ts("a").retries == 0
    assert sim.computes(W1) == ["a"]
    sim.fail("a", sid="f3")
    assert sim.states() == {"a": "erred", "b": "erred"}
    assert erred_from(sim.to_client(), blamed=True, sid="f3") == {"a": None, "b": "a"}
    assert sim.to_worker(W1) == [] and sim.to_worker(W2) == []
    transitions = [e[1:3] for e in sim.s.story("a")]
    assert transitions.count(("processing", "released")) == 2
    assert transitions[-1] == ("processing", "erred")


def test_retry_that_succeeds_feeds_the_dependents():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]}, retries={"a": 1})
    sim.fail("a")
    sim.finish("a")
    assert sim.state("b") == "processing"
    sim.finish("b")
    assert sim.to_client()[-1] == KeyInMemory("b", None, "int", "done-b", [W1])
    assert sim.states() == {"a": "memory", "b": "memory"}


def test_unknown_dependency_errs_naming_the_key():
    sim = Sim()
    sim.submit({"a": [], "b": ["a", "ghost"]}, sid="s")
    assert sim.states() == {"a": "processing", "b": "erred"}
    (msg,) = sim.to_client()
    assert msg.key == "b" and msg.blamed is None and msg.stimulus_id == "s"
    exc = scheduler_error(msg)
    assert isinstance(exc, ValueError) and "'ghost'" in str(exc) and "'b'" in str(exc)
    assert set(sim.ts("a").dependents) == {sim.ts("b")} and set(sim.ts("a").waiters) == set()


def test_dependents_of_a_task_that_cannot_run_do_not_run_it():
    sim = Sim()
    sim.submit({"a": ["ghost"], "b": ["a"]}, wanted=["b"], sid="s")
    assert sim.state("b") == "erred"
    assert sim.state("a") in ("erred", "released")
    assert not [m for m in sim.to_worker(W1) if isinstance(m, ComputeTask)]
    (msg,) = sim.to_client()
    assert msg.key == "b" and msg.blamed == "a"
    assert "'ghost'" in str(scheduler_error(msg))
    sim.release("b")
    assert sim.s.tasks == {}


def test_unknown_function_errs():
    sim = Sim()
    sim.submit({"a": [], "b": []}, func={"b": "nope"}, sid="s")
    assert sim.states() == {"a": "processing", "b": "erred"}
    (msg,) = sim.to_client()
    exc = scheduler_error(msg)
    assert isinstance(exc, ValueError) and "'nope'" in str(exc)
    assert [m.key for m in sim.to_worker(W1) if isinstance(m, ComputeTask)] == ["a"]


@pytest.mark.parametrize(
    "dag",
    [
        {"a": ["a"]},
        {"a": ["b"], "b": ["a"]},
        {"x": [], "a": ["x", "c"], "b": ["a"], "c": ["b"], "d": ["c"]},
    ],
)
def test_a_dependency_cycle_errs_naming_its_keys(dag):
    sim = Sim()
    sim.submit(dag)
    cyclic = set(dag) - {"x"}
    assert {k for k, st in sim.states().items() if st == "erred"} == cyclic
    errors = {m.key: scheduler_error(m) for m in sim.to_client() if isinstance(m, KeyErred)}
    assert set(errors) == cyclic
    for exc in errors.values():
        assert isinstance(exc, ValueError) and "cycle" in str(exc) and "'a'" in str(exc)
    sim.release(*cyclic)
    assert set(sim.s.tasks) <= {"x"}


# --- release and forget ---------------------------------------------------------------------


def test_released_key_without_dependents_is_forgotten_with_its_group():
    sim = Sim()
    sim.submit({("x-1f2e3d4c", 0): [], ("x-1f2e3d4c", 1): []})
    assert set(sim.s.groups) == {"x-1f2e3d4c"} and set(sim.s.prefixes) == {"x"}
    sim.run_all()
    sim.release(("x-1f2e3d4c", 0))
    assert list(sim.s.tasks) == [("x-1f2e3d4c", 1)]
    assert sim.s.groups["x-1f2e3d4c"].alive == 1
    sim.release(("x-1f2e3d4c", 1))
    assert sim.s.tasks == {} and sim.s.groups == {}
    assert sim.s.prefixes["x"].ngroups == 0 and sim.s.prefixes["x"].alive == 0


def test_dependency_freed_when_its_last_dependent_is_in_memory():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "b": ["a"], "c": ["a"]}, wanted=["b", "c"])
    sim.finish("a")
    sim.clear()
    sim.finish("b")
    assert sim.state("a") == "memory" and sim.freed(W1) == []
    sim.finish("c", sid="last")
    assert sim.state("a") == "released"
    assert sim.to_worker(W1) == [FreeKeys(["a"], "last")]
    assert sim.holds(W1) == {"b", "c"}
    sim.release("b", "c")
    assert sim.s.tasks == {}
    assert sorted(sim.freed(W1)) == ["b", "c"]


def test_dependency_wanted_by_a_client_is_kept():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]})
    sim.run_all()
    assert sim.states() == {"a": "memory", "b": "memory"}
    sim.release("b")
    assert sim.states() == {"a": "memory"}
    assert set(sim.ts("a").dependents) == set()


def test_keys_wanted_by_two_clients_survive_one_release():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": []}, client="c1")
    sim.submit({"a": []}, client="c2")
    sim.finish("a")
    assert (
        sim.to_client("c1")
        == sim.to_client("c2")
        == [KeyInMemory("a", None, "int", "done-a", [W1])]
    )
    sim.clear()
    sim.release("a", client="c1")
    assert sim.state("a") == "memory" and sim.to_worker(W1) == []
    assert set(sim.ts("a").who_wants) == {sim.s.clients["c2"]}
    sim.release("a", client="c2", sid="r2")
    assert sim.s.tasks == {} and sim.to_worker(W1) == [FreeKeys(["a"], "r2")]


def test_client_leaving_releases_its_keys_only():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": [], "b": ["a"]}, client="c1")
    sim.submit({"z": []}, client="c2")
    sim.s.remove_client("c1", "bye")
    assert sim.states() == {"z": "processing"}
    assert sim.freed(W1) == ["a"]
    assert "c1" not in sim.s.clients


def test_release_of_unknown_or_unwanted_keys_is_harmless():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": []}, client="c1")
    sim.release("nope", "a", client="c2")
    assert sim.state("a") == "processing"


def test_resubmitting_a_forgotten_key_recomputes_it():
    sim = Sim()
    sim.submit({"a": []})
    sim.finish("a")
    sim.release("a")
    sim.clear()
    sim.submit({"a": []}, sid="again")
    assert sim.computes(W1) == ["a"]
    sim.finish("a")
    assert sim.to_client() == [KeyInMemory("a", None, "int", "done-a", [W1])]


def test_wanting_a_released_dependency_recomputes_it():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"])
    sim.run_all()
    assert sim.state("a") == "released"
    sim.clear()
    sim.submit({"a": []}, sid="again")  # e.g. the client asks for the intermediate too
    assert sim.computes(W1) == ["a"]
    sim.finish("a", sid="a2")
    assert sim.to_client() == [KeyInMemory("a", None, "int", "a2", [W1])]
    assert sim.states() == {"a": "memory", "b": "memory"}


def test_want_keys():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"], client="c1")
    sim.run_all()
    sim.clear()
    sim.want("b", "a", "ghost", client="c2", sid="w")
    assert sim.to_client("c2") == [
        KeyInMemory("b", None, "int", "w", [W1]),
        KeyCancelled("ghost", "unknown to the scheduler", "w"),
    ]
    assert sim.computes(W1) == ["a"]  # "a" was released: it is computed again
    sim.finish("a", sid="a2")
    assert sim.to_client("c2") == [KeyInMemory("a", None, "int", "a2", [W1])]


def test_wanting_a_key_never_submitted_is_cancelled():
    sim = Sim()
    sim.submit({"a": []}, wanted=["a", "ghost"], sid="s")
    assert sim.to_client() == [KeyCancelled("ghost", "not submitted", "s")]


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_cancels_dependents_for_that_client_only():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": [], "b": ["a"], "c": ["b"]}, client="c1")
    sim.submit({"b": ["a"]}, wanted=["b"], client="c2")
    sim.cancel("a", client="c1", sid="x")
    cancelled = sim.to_client("c1")
    assert sorted(msg.key for msg in cancelled) == ["a", "b", "c"]
    assert all(msg == KeyCancelled(msg.key, "cancelled", "x") for msg in cancelled)
    assert sim.to_client("c2") == []
    # c2 still wants "b", which needs "a"
    assert sim.states() == {"a": "processing", "b": "waiting"}
    assert set(sim.ts("b").who_wants) == {sim.s.clients["c2"]}
    assert set(sim.ts("a").who_wants) == set()
    sim.finish("a")
    sim.finish("b")
    assert sim.to_client("c2") == [KeyInMemory("b", None, "int", "done-b", [W1])]
    assert sim.to_client("c1") == []
    assert sim.states() == {"a": "released", "b": "memory"}


def test_cancel_stops_running_work():
    sim = Sim({W1: 2})
    sim.submit({"a": [], "b": [], "c": ["a", "b"]})
    sim.finish("a")
    sim.clear()
    sim.cancel("b", sid="x")
    assert sorted(m.key for m in sim.to_client()) == ["b", "c"]
    assert sim.states() == {"a": "memory"}
    assert sim.to_worker(W1) == [ReleaseCompute("b", True, False, "x")]


def test_cancel_of_an_unknown_key_does_nothing():
    sim = Sim()
    sim.cancel("ghost")
    assert sim.to_client() == []


# --- scatter --------------------------------------------------------------------------------


def test_scatter_puts_keys_in_memory():
    sim = Sim({W1: 1, W2: 1})
    sim.scatter(W2, {"s1": 100, "s2": 50}, sid="sc")
    assert sim.states() == {"s1": "memory", "s2": "memory"}
    assert sim.to_client() == [
        KeyInMemory("s1", None, "", "sc", [W2]),
        KeyInMemory("s2", None, "", "sc", [W2]),
    ]
    assert sim.holds(W2) == {"s1", "s2"} and sim.ws(W2).nbytes == 150
    assert sim.s.groups["s1"].nbytes == 100
    sim.submit({"t": ["s1", "s2"]})
    assert sim.worker_of("t") == W2
    (compute,) = [m for m in sim.to_worker(W2) if isinstance(m, ComputeTask)]
    assert sorted(compute.deps, key=lambda d: d.key) == [
        DepInfo("s1", 100, [W2]),
        DepInfo("s2", 50, [W2]),
    ]
    sim.finish("t")
    sim.release("s1", "s2", sid="r")
    assert sim.state("s1") == sim.state("s2") == "released"  # "t" refers to them
    assert sorted(sim.freed(W2)) == ["s1", "s2"]
    sim.release("t")
    assert sim.s.tasks == {}


def test_scatter_to_a_worker_that_left_errs():
    sim = Sim()
    sim.scatter("tcp://gone:1", {"s": 10}, sid="sc")
    assert sim.state("s") == "erred"
    (msg,) = sim.to_client()
    assert msg.key == "s" and msg.blamed is None
    exc = scheduler_error(msg)
    assert isinstance(exc, RuntimeError) and "lost" in str(exc) and "'s'" in str(exc)


def test_scattered_data_lost_with_its_worker_errs_with_a_clear_message():
    sim = Sim({W1: 1, W2: 1})
    sim.scatter(W1, {"s": 10})
    sim.submit({"t": ["s"], "u": ["t"]})
    assert sim.worker_of("t") == W1
    sim.clear()
    sim.remove_worker(W1, sid="gone")
    assert sim.states() == {"s": "erred", "t": "erred", "u": "erred"}
    msgs = sim.to_client()
    by_key = {msg.key: msg for msg in msgs}
    assert len(msgs) == 3, msgs  # each key reported once
    assert by_key["s"].blamed is None
    assert by_key["t"].blamed == by_key["u"].blamed == "s"
    exc = scheduler_error(by_key["s"])
    assert isinstance(exc, RuntimeError)
    assert "'s'" in str(exc) and "lost with the worker" in str(exc)
    assert sim.to_worker(W2) == []


def test_scattered_data_lost_stops_a_dependent_running_elsewhere():
    sim = Sim({W1: 1})
    sim.scatter(W1, {"s": 10})
    sim.submit({"busy-1": [], "busy-2": []})
    sim.add_worker(W2, 1)
    sim.submit({"t": ["s"]}, wanted=["t"])
    assert sim.worker_of("t") == W2
    sim.clear()
    sim.remove_worker(W1, sid="gone")
    assert sim.state("s") == sim.state("t") == "erred"
    assert sim.to_worker(W2)[0] == ReleaseCompute("t", True, False, "gone")
    assert erred_from(sim.to_client()) == {"s": None, "t": "s"}


def test_scatter_to_a_worker_that_left_does_not_destroy_a_computed_key():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": []}, client="c1")
    sim.finish("a")
    sim.clear()
    sim.scatter("tcp://gone:1", {"a": 8}, client="c2", sid="sc")
    assert sim.state("a") == "memory"
    assert sim.to_client("c2") == [KeyInMemory("a", None, "int", "sc", [W1])]
    assert sim.to_client("c1") == [] and sim.to_worker(W1) == []


def test_scatter_of_a_key_already_computed_keeps_the_replica():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=10)
    sim.scatter(W2, {"a": 10}, sid="sc")
    assert set(sim.ts("a").who_has) == {sim.ws(W1), sim.ws(W2)}


@pytest.mark.parametrize("state", ["processing", "waiting"])
def test_scatter_of_a_key_being_computed_frees_the_scattered_copy(state):
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": [], "b": ["a"]})
    key = "a" if state == "processing" else "b"
    sim.clear()
    sim.scatter(W2, {key: 10}, sid="sc")
    assert sim.state(key) == state
    assert sim.to_worker(W2) == [FreeKeys([key], "sc")]


# --- results inline, holders named ----------------------------------------------------------


def test_only_a_wanted_key_asks_its_worker_for_the_result_inline():
    sim = Sim(clients=["c1", "c2"])
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"], client="c1")
    (compute_a,) = [msg for msg in sim.to_worker(W1) if isinstance(msg, ComputeTask)]
    assert compute_a.key == "a" and not compute_a.client_wants
    sim.finish("a")
    (compute_b,) = [msg for msg in sim.to_worker(W1) if isinstance(msg, ComputeTask)]
    assert compute_b.key == "b" and compute_b.client_wants
    value = Payload(1, b"\x80\x05pickled")
    sim.finish("b", value=value)
    assert sim.to_client("c1") == [KeyInMemory("b", value, "int", "done-b", [W1])]
    # The scheduler forwards the value and keeps none: a client wanting the key later
    # is told where it is, and fetches it from there.
    sim.want("b", client="c2", sid="later")
    assert sim.to_client("c2") == [KeyInMemory("b", None, "int", "later", [W1])]


def test_the_holders_named_are_those_of_the_moment():
    sim = Sim({W1: 1, W2: 1}, clients=["c1", "c2"])
    sim.submit({"a": []}, wanted=["a"], client="c1")
    sim.finish("a")
    holder = next(iter(sim.s.tasks["a"].who_has)).address
    other = W2 if holder == W1 else W1
    sim.add_keys(other, {"a": 8})  # a replica
    sim.clear()
    sim.want("a", client="c2", sid="w")
    (note,) = sim.to_client("c2")
    assert isinstance(note, KeyInMemory) and sorted(note.who_has) == sorted([W1, W2])
    sim.remove_worker(holder)
    sim.clear()
    sim.release("a", client="c2")
    sim.want("a", client="c2", sid="w2")
    assert sim.to_client("c2") == [KeyInMemory("a", None, "int", "w2", [other])]
