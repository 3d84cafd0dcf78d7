"""The bookkeeping of tasks run early (shoal/server/run_next.py), with no threads and no
network: offers, early runs, claims and purges driven directly, and a property that no
sequence of them delivers a result computed from anything but the values in memory."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.server.run_next import (
    DELIVER,
    DROP,
    KEEP,
    RERUN,
    UNRESOLVED,
    RunNextOffers,
    peek,
)
from shoal.server.spill import SpillBuffer

SPEC = ("f", None)


def offers_over(data: dict[str, Any]) -> RunNextOffers:
    return RunNextOffers(lambda: data)


def ran(offers: RunNextOffers, key: str, inputs: dict[str, Any], result: Any) -> Any:
    run = offers.start(key)
    assert run is not None
    run.inputs.update(inputs)
    return run, offers.finish(run, result)


def test_an_offer_is_taken_once_and_the_first_one_after_a_task_stands() -> None:
    offers = offers_over({})
    offers.offer("a", "b", ("fb", None))  # type: ignore[arg-type]
    offers.offer("a", "c", ("fc", None))  # type: ignore[arg-type]
    assert offers.take("a") == ("b", "fb", None)
    assert offers.take("a") is None
    offers.offer("x", "y", SPEC)  # type: ignore[arg-type]
    offers.withdraw("x")  # x's result was handled: a later run of x finds nothing
    assert offers.take("x") is None and offers.offered == 0


def test_a_finished_run_is_delivered_at_its_claim_if_its_inputs_are_the_same_objects() -> None:
    value = [1, 2]
    data = {"a": value}
    offers = offers_over(data)
    _, verdict = ran(offers, "b", {"a": value}, "result-b")
    assert verdict == KEEP and offers.pending == 1
    assert offers.claim("b") == (True, "result-b", False)
    assert offers.pending == 0 and offers.delivered == 1
    assert offers.claim("b") == (False, None, False)  # used up: a later Execute runs it


def test_an_equal_but_different_input_is_a_changed_input() -> None:
    data = {"a": [1, 2]}
    offers = offers_over(data)
    ran(offers, "b", {"a": [1, 2]}, "result-b")  # equal, not the object in memory
    assert offers.claim("b") == (False, None, False)
    assert offers.discarded == 1 and offers.pending == 0


def test_a_run_missing_an_input_is_never_delivered_even_once_it_is_there() -> None:
    data: dict[str, Any] = {}
    offers = offers_over(data)
    ran(offers, "b", {"a": UNRESOLVED}, "KeyError('a')")
    data["a"] = UNRESOLVED  # (not even if the very sentinel were stored)
    assert offers.claim("b") == (False, None, False)


def test_a_run_claimed_while_running_is_delivered_by_its_thread_or_run_again() -> None:
    value = object()
    data = {"a": value}
    offers = offers_over(data)
    run = offers.start("b")
    assert run is not None
    run.inputs["a"] = value
    assert offers.claim("b") == (True, None, False)  # its thread delivers it
    assert run.decided.is_set()
    assert offers.finish(run, "result") == DELIVER
    run = offers.start("c")
    assert run is not None
    run.inputs["a"] = value
    offers.claim("c")
    data["a"] = object()  # recomputed meanwhile
    assert offers.finish(run, "result") == RERUN


def test_runs_of_tasks_released_before_their_claim_are_dropped() -> None:
    offers = offers_over({})
    ran(offers, "done", {}, "r1")
    running = offers.start("running")
    assert running is not None
    ran(offers, "kept", {}, "r3")
    offers.purge(lambda key: key == "kept")
    assert offers.pending == 1 and running.dropped and running.decided.is_set()
    assert offers.finish(running, "r2") == DROP
    assert offers.claim("kept") == (True, "r3", False)


def test_a_claimed_run_is_never_purged() -> None:
    offers = offers_over({})
    run = offers.start("b")
    assert run is not None
    offers.claim("b")
    offers.purge(lambda key: False)  # (executing by now, so not waiting or ready)
    assert not run.dropped and offers.finish(run, "r") == DELIVER


def test_a_secede_before_the_claim_is_reported_by_the_claim() -> None:
    offers = offers_over({})
    run = offers.start("b")
    assert run is not None
    assert offers.note_secede(run) is False  # nobody counts it yet
    assert offers.claim("b") == (True, None, True)  # the claim tells the state machine
    other = offers.start("c")
    assert other is not None
    offers.claim("c")
    assert offers.note_secede(other) is True  # claimed: it secedes as any task does


def test_peek_reads_no_spilled_value_back(tmp_path: Any) -> None:
    buffer = SpillBuffer(str(tmp_path), target=1000)
    small = [1]
    buffer["large"] = list(range(10_000))  # over the target: to disk
    buffer["small"] = small
    assert buffer.spilled_keys == {"large"}
    assert peek(buffer, "small") is small
    assert peek(buffer, "large") is peek(buffer, "absent")  # not in memory: no value
    assert buffer.spilled_keys == {"large"} and buffer.unspill_count == 0
    assert peek({"x": small}, "x") is small


# --- the property ------------------------------------------------------------------------

KEYS = ["k0", "k1", "k2"]
TASKS = ["t0", "t1", "t2"]

step = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(KEYS)),  # a value (re)computed
    st.tuples(st.just("drop"), st.sampled_from(KEYS)),  # a value released
    st.tuples(st.just("start"), st.sampled_from(TASKS), st.sets(st.sampled_from(KEYS))),
    st.tuples(st.just("finish"), st.sampled_from(TASKS)),
    st.tuples(st.just("claim"), st.sampled_from(TASKS)),
    st.tuples(st.just("purge"), st.sets(st.sampled_from(TASKS))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40))
def test_no_sequence_delivers_a_result_of_values_not_in_memory(steps: list[Any]) -> None:
    """Whatever happens to the data between an early run and its claim, a result is
    delivered (by the claim or by the thread) only if every input the task needed was
    had, and is, at that moment, the very object in memory under its key. The runs
    resolve their inputs with the real resolver (a missing one raises, as in a task)."""
    data: dict[str, Any] = {}
    offers = offers_over(data)
    runs: dict[str, Any] = {}  # task -> its run, while its thread has not finished it
    results: dict[str, tuple[str, dict[str, Any]]] = {}  # result -> (task, what it got)

    def check(result: Any) -> None:
        task, got = results[result]
        for key, value in got.items():
            assert value is not UNRESOLVED and data.get(key, UNRESOLVED) is value, (task, key)

    for n, (kind, *args) in enumerate(steps):
        if kind == "store":
            data[args[0]] = object()
        elif kind == "drop":
            data.pop(args[0], None)
        elif kind == "start":
            task, keys = args
            run = offers.start(task)
            if run is not None:
                resolve = run.resolver("after", object(), data.__getitem__)
                got: dict[str, Any] = {}
                for key in sorted(keys):
                    try:
                        got[key] = resolve(key)
                    except KeyError:  # the task errs (and must not be delivered)
                        got[key] = UNRESOLVED
                        break
                runs[task] = (run, got)
        elif kind == "finish" and args[0] in runs:
            run, got = runs.pop(args[0])
            result = f"result-{n}"
            results[result] = (args[0], got)
            if offers.finish(run, result) == DELIVER:
                check(result)
        elif kind == "claim":
            claimed, result, _ = offers.claim(args[0])
            if result is not None:
                assert claimed
                check(result)
        elif kind == "purge":
            offers.purge(args[0].__contains__)
