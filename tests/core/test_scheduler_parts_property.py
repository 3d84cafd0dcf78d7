"""A graph sent in parts ends as the same graph sent in one message: the earlier parts'
tasks wait in a list and are started a slice at a time (submission.START_SLICE), which
must not change what runs, what errs, or what the client is told."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_harness import ARGS, FUNCS, W1, W2, Sim

from shoal.core.scheduler import submission
from shoal.protocol.messages import KeyErred, KeyInMemory, SubmitTasks, TaskSpec, WantKeys


@st.composite
def graphs(draw: Any) -> dict[str, Any]:
    """A DAG in topological order (each task's dependencies come before it), tasks
    that err at submission (a function never sent, a dependency that exists nowhere),
    the wanted keys, the cuts into
    parts, and the slice size."""
    n = draw(st.integers(1, 24))
    deps = [
        sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 5)))) if i else []
        for i in range(n)
    ]
    unsent = draw(st.sets(st.integers(0, n - 1), max_size=2))
    missing = draw(st.sets(st.integers(0, n - 1), max_size=2))
    wanted = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
    cuts = sorted(draw(st.sets(st.integers(1, n), max_size=5)) | {n})
    return {
        "deps": deps,
        "unsent": unsent,
        "missing": missing,  # tasks that also depend on a key that exists nowhere
        "wanted": wanted,
        "cuts": cuts,
        "slice": draw(st.integers(1, 5)),
        "old": draw(st.booleans()),  # a wanted task known before, computed and released
    }


def spec(i: int, g: dict[str, Any]) -> TaskSpec:
    func = "never-sent" if i in g["unsent"] else "f"
    deps = [f"t{d}" for d in g["deps"][i]]
    if i in g["missing"]:
        deps.append("nowhere")
    return TaskSpec(f"t{i}", func, ARGS, deps)


def submit(sim: Sim, g: dict[str, Any], in_parts: bool) -> None:
    n = len(g["deps"])
    wanted = [f"t{i}" for i in g["wanted"]]
    if g["old"]:
        wanted.append("old")
    cuts = g["cuts"] if in_parts else [n]
    start = 0
    for end in cuts:
        last = end == n
        specs = [spec(i, g) for i in range(start, end)]
        msg = SubmitTasks(specs, wanted if last else [], FUNCS if start == 0 else {}, "g", not last)
        sim.s.handle_client("c", msg)
        start = end


def outcome(sim: Sim) -> tuple[Any, ...]:
    told = {
        (type(msg).__name__, msg.key)
        for msg in sim.to_client()
        if isinstance(msg, KeyInMemory | KeyErred)
    }
    return sim.states(), sorted(sim.processing(), key=repr), told


def run(g: dict[str, Any], in_parts: bool) -> tuple[Any, ...]:
    sim = Sim({W1: 1, W2: 2})
    if g["old"]:  # known to the scheduler, released: the graph's want computes it again
        sim.submit({"old": [], "keep": ["old"]}, wanted=["keep"], sid="before")
        sim.run_all()
        assert sim.state("old") == "released"
        sim.clear()
    submit(sim, g, in_parts)
    at_submission = outcome(sim)
    sim.run_all()
    return at_submission, outcome(sim)


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_a_graph_in_parts_ends_as_in_one_message(g: dict[str, Any]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(submission, "START_SLICE", g["slice"])
        in_parts = run(g, True)
    whole = run(g, False)
    # Sim validates the whole state after every event (validate=True), so a task
    # started twice, or left released while a dependent waits on it, fails there.
    assert in_parts == whole


@pytest.mark.parametrize("in_parts", [False, True])
def test_a_task_with_a_missing_dependency_never_runs(in_parts: bool) -> None:
    # "a" errs at submission; nobody wants it, so it is released at once, its error
    # gone: the dependents' "waiting" must not start it without its dependency.
    sim = Sim({W1: 1})
    specs = [
        TaskSpec("a", "f", ARGS, ["nowhere"]),
        TaskSpec("b", "f", ARGS, ["a"]),
        TaskSpec("c", "f", ARGS, ["a", "b"]),
    ]
    parts = [specs[:1], specs[1:]] if in_parts else [specs]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        msg = SubmitTasks(part, ["c"] if last else [], FUNCS if i == 0 else {}, "s", not last)
        sim.s.handle_client("c", msg)
    assert sim.processing() == []
    assert sim.states() == {"a": "released", "b": "released", "c": "erred"}
    (erred,) = [msg for msg in sim.to_client() if isinstance(msg, KeyErred)]
    assert erred.key == "c" and erred.blamed == "a"


@pytest.mark.parametrize(
    "specs",
    [
        pytest.param([TaskSpec("a", "f", ARGS, ["nowhere"])], id="missing-dependency"),
        pytest.param([TaskSpec("a", "unsent", ARGS, [])], id="unsent-function"),
    ],
)
def test_a_task_refused_at_submission_never_runs_when_wanted_later(
    specs: list[TaskSpec],
) -> None:
    # Nobody wants "a" at first, so it is released with its error cleared while "c"
    # (erred through it) holds it. Wanting it later must err it again with the
    # submission's reason, not run it without the dependencies it lacks.
    sim = Sim({W1: 1})
    specs = [*specs, TaskSpec("c", "f", ARGS, ["a"])]
    sim.s.handle_client("c", SubmitTasks(specs, ["c"], FUNCS, "s", False))
    assert sim.states()["a"] == "released"
    sim.to_client()
    sim.s.handle_client("c", WantKeys(["a"], "want-a"))
    assert sim.processing() == []
    assert sim.states()["a"] == "erred"
    (erred,) = [msg for msg in sim.to_client() if isinstance(msg, KeyErred)]
    assert erred.key == "a" and erred.blamed is None
    assert erred.exception is not None
    assert b"task 'a'" in erred.exception.data and b"ValueError" in erred.exception.data


@settings(max_examples=100, deadline=None)
@given(graphs(), st.lists(st.lists(st.integers(0, 23), min_size=1, max_size=3), max_size=4))
def test_no_want_ever_runs_a_refused_task_or_its_downstream(
    g: dict[str, Any], later_wants: list[list[int]]
) -> None:
    # A task refused at submission lacks a dependency or a function: neither it nor
    # anything downstream of it may ever be sent to a worker, however often its keys
    # are wanted and released again afterwards.
    n = len(g["deps"])
    doomed = set(g["unsent"]) | set(g["missing"])
    for i in range(n):
        if any(d in doomed for d in g["deps"][i]):
            doomed.add(i)
    sim = Sim({W1: 1, W2: 1})
    submit(sim, g, in_parts=False)
    ran = sim.run_all()
    for indices in later_wants:
        keys = [f"t{i}" for i in indices if i < n]
        sim.want(*keys, sid="later-want")
        ran += sim.run_all()
        sim.release(*keys, sid="later-release")
        ran += sim.run_all()
    assert not {f"t{i}" for i in doomed} & set(ran)
