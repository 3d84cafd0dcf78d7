"""dask.order's orders remembered by graph structure (shoal.client.graph.order_cache):
found again only for a graph that dask.order would order the same way, and then as
that graph's own keys."""

from __future__ import annotations

from typing import Any

import dask.order
import pytest
from dask._task_spec import Alias, DataNode, Task, TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st
from order_helpers import count_dask_order, renamed

from shoal.client.graph.dask_graph import topological
from shoal.client.graph.order import TRIVIAL_TASKS, GraphIndex, submission_order
from shoal.client.graph.order_cache import OrderCache


def _f(*args: Any) -> None:
    return None


def graph(deps_by_key: dict[Any, list[Any]]) -> dict[Any, Any]:
    """Dask nodes for ``{key: [dependency keys]}``: data nodes for the roots."""
    return {
        k: Task(k, _f, *(TaskRef(d) for d in deps)) if deps else DataNode(k, 1)
        for k, deps in deps_by_key.items()
    }


def by_dask(dsk: dict[Any, Any]) -> list[Any]:
    return topological(dsk, dask.order.order(dsk))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_dask_order(monkeypatch)


REDUCTION = {
    ("x", 0): [],
    ("x", 1): [],
    ("x", 2): [],
    ("x", 3): [],
    ("p", 0): [("x", 0), ("x", 1)],
    ("p", 1): [("x", 2), ("x", 3)],
    "sum-finalize-1a2b": [("p", 0), ("p", 1)],
}


def test_the_same_graph_again_is_not_ordered_again(counted: list[int]) -> None:
    cache = OrderCache()
    first = submission_order(graph(REDUCTION), None, cache=cache)
    again = submission_order(graph(REDUCTION), None, cache=cache)
    assert again == first == by_dask(graph(REDUCTION))
    assert len(counted) == 2  # the first submission, and by_dask above
    assert cache.hits == 1


def test_a_graph_whose_output_is_named_anew_gets_dask_orders_order_for_it(
    counted: list[int],
) -> None:
    """Dask names a compute's final step anew for every compute."""
    cache = OrderCache()
    submission_order(graph(REDUCTION), None, cache=cache)
    again = renamed(graph(REDUCTION), "sum-finalize-1a2b", "sum-finalize-9f8e")
    found = submission_order(again, None, cache=cache)
    assert cache.hits == 1 and len(counted) == 1
    assert found == by_dask(again) and found[-1] == "sum-finalize-9f8e"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: {**d, "sum-finalize-1a2b": [("p", 0)]}, id="a dependency"),
        pytest.param(
            lambda d: (
                {(("y", 0) if k == ("x", 0) else k): v for k, v in d.items()}
                | {("p", 0): [("y", 0), ("x", 1)]}
            ),
            id="a key that is not the output",
        ),
        pytest.param(lambda d: {("x", 9): [], **d}, id="a task more"),
        pytest.param(lambda d: dict(reversed(list(d.items()))), id="the keys' order"),
    ],
)
def test_a_graph_with_another_structure_is_ordered_afresh(change: Any) -> None:
    cache = OrderCache()
    submission_order(graph(REDUCTION), None, cache=cache)
    other = graph(change(dict(REDUCTION)))
    assert submission_order(other, None, cache=cache) == by_dask(other)
    assert cache.hits == 0 and len(cache) == 2


def test_the_kind_of_a_node_is_part_of_the_structure() -> None:
    """dask.order sets data and alias nodes apart: a root that is a task is another
    graph than the same root as data."""
    cache = OrderCache()
    submission_order(graph(REDUCTION), None, cache=cache)
    as_task = graph(REDUCTION)
    as_task[("x", 0)] = Task(("x", 0), _f)
    submission_order(as_task, None, cache=cache)
    alias = graph(REDUCTION)
    alias[("x", 1)] = Alias(("x", 1), ("x", 0))
    submission_order(alias, None, cache=cache)
    assert cache.hits == 0 and len(cache) == 3


def test_with_two_outputs_their_names_count() -> None:
    cache = OrderCache()
    two = {"a": [], "b": ["a"], "c": ["a"], "d": ["b"], "e": ["c"]}
    submission_order(graph(two), None, cache=cache)
    other = renamed(graph(two), "e", "f")
    assert submission_order(other, None, cache=cache) == by_dask(other)
    assert cache.hits == 0


def test_a_graph_using_keys_outside_it_is_not_remembered() -> None:
    cache = OrderCache()
    deps = {**REDUCTION, ("p", 1): [("x", 2), ("x", 3), "held-future"]}
    dsk = graph(deps)
    assert cache.structure(dsk, GraphIndex(dsk)) is None
    submission_order(dsk, None, cache=cache)
    assert len(cache) == 0


def test_what_is_remembered_is_bounded_by_tasks_oldest_first() -> None:
    cache = OrderCache(max_tasks=20)
    graphs = [graph({**REDUCTION, ("x", 4 + i): [], "sum-finalize-1a2b": []}) for i in range(3)]
    # (8 tasks each: the first two fit, the third drops the first)
    for dsk in graphs:
        submission_order(dsk, None, cache=cache)
    assert len(cache) == 2
    submission_order(graphs[0], None, cache=cache)
    assert cache.hits == 0
    submission_order(graphs[2], None, cache=cache)
    assert cache.hits == 1
    too_large = graph({f"k{i}": [f"k{i - 1}"] if i else [] for i in range(21)})
    assert cache.structure(too_large, GraphIndex(too_large)) is None


@st.composite
def single_output_graphs(draw: Any) -> tuple[dict[Any, Any], Any]:
    """A random acyclic graph of Dask nodes with one output (a task on every key that
    nothing else depends on), keys of both of Dask's kinds."""
    n = draw(st.integers(1, 30))
    style = draw(st.sampled_from(["tuple", "str"]))
    keys: list[Any] = [(f"x-{i % 3}", i) if style == "tuple" else f"k{i}" for i in range(n)]
    deps = {
        keys[i]: sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
        for i in range(n)
    }
    named = {k: [keys[d] for d in ds] for k, ds in deps.items()}
    used = {d for ds in named.values() for d in ds}
    output = ("finalize-a", 0) if style == "tuple" else "finalize-a"
    named[output] = [k for k in keys if k not in used]
    return graph(named), output


@settings(max_examples=300, deadline=None)
@given(single_output_graphs(), st.sampled_from(["aaa", ("zzz", 7), "finalize-b", ("x-1", 0.5)]))
def test_dask_order_ignores_the_output_name_so_the_cache_gives_dask_orders_order(
    case: tuple[dict[Any, Any], Any], new_name: Any
) -> None:
    dsk, output = case
    if new_name in dsk:
        return
    cache = OrderCache()
    submission_order(dsk, None, cache=cache)
    other = renamed(dsk, output, new_name)
    found = submission_order(other, None, cache=cache)
    if len(dsk) <= TRIVIAL_TASKS:  # not ordered by dask.order at all
        assert cache.hits == 0 and found == submission_order(other, None)
    else:
        assert cache.hits == 1 and found == by_dask(other)
