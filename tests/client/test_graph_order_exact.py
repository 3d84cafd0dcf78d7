"""``dependency_first`` walks positions instead of keys (a speed-up): its order must
stay exactly the one of the key-based walk it replaced, kept here as the reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dask.array as da
from dask._task_spec import TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized

from shoal.client.graph.order import dependency_first
from tests.client.test_graph_order import _f, array_graph, graph


def reference_order(dsk: Mapping[Any, Any]) -> list:
    """The key-based walk, as it was (sorting at each step)."""
    position = {key: i for i, key in enumerate(dsk)}
    deps_of: dict = {}
    dependents: dict = {key: [] for key in dsk}
    for key, node in dsk.items():
        deps = [d for d in node.dependencies if d in position]
        deps_of[key] = deps
        for d in deps:
            dependents[d].append(key)
    unplaced_deps = {key: len(deps) for key, deps in deps_of.items()}
    unplaced_dependents = {key: len(ds) for key, ds in dependents.items()}
    rank = position.__getitem__
    out: list = []
    done: set = set()

    def place(key: Any) -> None:
        ready = [key]
        while ready:
            k = ready.pop()
            if k in done:
                continue
            done.add(k)
            out.append(k)
            for d in deps_of[k]:
                unplaced_dependents[d] -= 1
            eager = []
            for dependent in dependents[k]:
                unplaced_deps[dependent] -= 1
                if (
                    unplaced_deps[dependent] == 0
                    and dependent not in done
                    and any(unplaced_dependents[d] == 1 for d in deps_of[dependent])
                ):
                    eager.append(dependent)
            if eager:
                eager.sort(key=rank, reverse=True)
                ready.extend(eager)

    expanded: set = set()
    for output in dsk:
        if dependents[output]:
            continue
        stack = [output]
        while stack:
            key = stack[-1]
            if key in done:
                stack.pop()
            elif key in expanded:
                stack.pop()
                place(key)
            else:
                expanded.add(key)
                todo = [d for d in deps_of[key] if d not in done]
                if todo:
                    todo.sort(key=rank, reverse=True)
                    stack.extend(todo)
    assert len(out) == len(dsk)
    return out


@st.composite
def dags(draw):
    """Graphs in any key order, with shared inputs (several dependents per key), keys
    depended on from outside the graph, and several outputs."""
    n = draw(st.integers(1, 60))
    keys = [f"k{i}" for i in range(n)]
    deps = {}
    for i, k in enumerate(keys):
        earlier = keys[:i] + ["outside"]
        deps[k] = draw(st.lists(st.sampled_from(earlier), max_size=5, unique=True))
    order = draw(st.permutations(keys))
    return {k: deps[k] for k in order}


def with_outside_refs(deps_by_key):
    dsk = graph({k: [d for d in ds if d != "outside"] for k, ds in deps_by_key.items()})
    for k, ds in deps_by_key.items():
        if "outside" in ds:
            from dask._task_spec import Task

            dsk[k] = Task(k, _f, *(TaskRef(d) for d in ds))
    return dsk


@settings(max_examples=sized(ci=100, full=300), deadline=None)
@given(dags())
def test_same_order_as_the_key_based_walk_on_any_graph(deps_by_key):
    dsk = with_outside_refs(deps_by_key)
    assert dependency_first(dsk) == reference_order(dsk)


def test_same_order_on_array_graphs():
    x = da.random.random((24, 24), chunks=2)
    for collection in (
        (x - x.mean(axis=0)).sum(),
        (x @ x.T).sum(),
        (da.ones((500,), chunks=1) + 2).sum(),
        x.rechunk((3, 8)).std(),
    ):
        dsk = array_graph(collection)
        assert dependency_first(dsk) == reference_order(dsk)


@st.composite
def maybe_cyclic(draw):
    """Graphs whose dependencies may point anywhere: often a cycle, sometimes a key
    that exists nowhere."""
    n = draw(st.integers(1, 30))
    keys = [f"k{i}" for i in range(n)]
    return {
        k: draw(st.lists(st.sampled_from([*keys, "nowhere"]), max_size=3, unique=True))
        for k in keys
    }


@settings(max_examples=sized(ci=100, full=300), deadline=None)
@given(maybe_cyclic())
def test_check_graph_refuses_exactly_the_cyclic_graphs_naming_a_real_cycle(deps_by_key):
    import graphlib

    import pytest

    from shoal.client.graph.dask_graph import check_graph

    dsk = graph({k: [d for d in ds if d != "nowhere"] for k, ds in deps_by_key.items()})
    try:
        tuple(graphlib.TopologicalSorter(deps_by_key).static_order())
        cyclic = False
    except graphlib.CycleError:
        cyclic = True
    if not cyclic:
        check_graph(dsk, lambda k: False)
        return
    with pytest.raises(ValueError, match="cycle") as info:
        check_graph(dsk, lambda k: False)
    named = [eval(k) for k in str(info.value).split(": ", 1)[1].split(" -> ")]
    assert named[0] == named[-1]
    for key, dependency in zip(named, named[1:]):
        assert dependency in deps_by_key[key]


def test_check_graph_names_the_missing_keys_only():
    import pytest

    from shoal.client.graph.dask_graph import check_graph

    dsk = with_outside_refs({"a": ["outside"], "b": ["a"]})
    check_graph(dsk, lambda k: k == "outside")
    with pytest.raises(ValueError, match="1 key.*'outside'"):
        check_graph(dsk, lambda k: False)
