"""The submission order of a graph (shoal.client.graph.order): dask.order up to the
configured bound, a dependency-first post-order above it and for tiny graphs."""

from __future__ import annotations

import dask
import dask.array as da
import pytest
from dask._task_spec import DataNode, Task, TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized

from benchmarks.order_memory import peak_memory
from shoal.client.graph.dask_graph import materialize
from shoal.client.graph.order import (
    TRIVIAL_TASKS,
    dependency_first,
    order_bound,
    submission_order,
)


def _f(*args):
    return None


def array_graph(x):
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    dsk, _ = materialize(FinalizeCompute(collections_to_expr([x], True)).optimize())
    return dsk


def graph(deps_by_key):
    """Dask nodes for ``{key: [dependency keys]}``."""
    return {
        k: Task(k, _f, *(TaskRef(d) for d in deps)) if deps else DataNode(k, 1)
        for k, deps in deps_by_key.items()
    }


def assert_topological(dsk, keys):
    assert sorted(map(repr, keys)) == sorted(map(repr, dsk))
    place = {k: i for i, k in enumerate(keys)}
    for k, node in dsk.items():
        for d in node.dependencies:
            if d in dsk:
                assert place[d] < place[k], f"{k!r} before its dependency {d!r}"


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    keys = [f"k{i}" for i in range(n)]
    deps = {}
    for i, k in enumerate(keys):
        earlier = keys[:i]
        deps[k] = (
            draw(st.lists(st.sampled_from(earlier), max_size=4, unique=True)) if earlier else []
        )
    order = draw(st.permutations(keys))  # the dict's order is not a topological one
    return {k: deps[k] for k in order}


@settings(max_examples=sized(ci=60, full=200), deadline=None)
@given(dags())
def test_dependency_first_is_a_topological_order_of_every_key(deps_by_key):
    dsk = graph(deps_by_key)
    assert_topological(dsk, dependency_first(dsk))


def test_dependency_first_finishes_each_subtree_of_a_reduction_first():
    # a 4-way reduction tree over 64 leaves: depth-first, at most depth x fan-in alive
    x = (da.ones((64,), chunks=1) + 1).sum(split_every=4)
    dsk = array_graph(x)
    keys = dependency_first(dsk)
    assert_topological(dsk, keys)
    assert peak_memory(dsk, keys) <= 4 * 4


def test_dependency_first_ignores_dependencies_outside_the_graph():
    dsk = {"a": Task("a", _f, TaskRef("held-elsewhere")), "b": Task("b", _f, TaskRef("a"))}
    assert dependency_first(dsk) == ["a", "b"]


def test_dependency_first_refuses_a_cycle():
    dsk = {"a": Task("a", _f, TaskRef("b")), "b": Task("b", _f, TaskRef("a"))}
    with pytest.raises(ValueError, match="cycle"):
        dependency_first(dsk)


def test_above_the_bound_and_for_tiny_graphs_dask_order_is_not_called(monkeypatch):
    import dask.order

    def refuse(*args, **kwargs):
        raise AssertionError("dask.order called")

    monkeypatch.setattr(dask.order, "order", refuse)
    chain = graph({f"k{i}": ([f"k{i - 1}"] if i else []) for i in range(10)})
    assert submission_order(chain, max_tasks=9) == [f"k{i}" for i in range(10)]
    tiny = graph({f"k{i}": [] for i in range(TRIVIAL_TASKS)})
    assert_topological(tiny, submission_order(tiny, max_tasks=None))
    with pytest.raises(AssertionError, match="dask.order called"):
        submission_order(chain, max_tasks=10)  # at the bound: dask.order


def test_up_to_the_bound_the_order_is_dask_orders():
    from dask.order import order

    x = da.ones((6, 6), chunks=2)
    dsk = array_graph((x - x.mean(axis=0)).sum())
    priorities = order(dsk)
    assert submission_order(dsk, max_tasks=len(dsk)) == sorted(dsk, key=priorities.__getitem__)
    assert submission_order(dsk, max_tasks=None) == sorted(dsk, key=priorities.__getitem__)


def test_the_bound_is_configured_and_checked():
    assert order_bound() == 100_000
    with dask.config.set({"shoal.client.order.max-tasks": None}):
        assert order_bound() is None
    with dask.config.set({"shoal.client.order.max-tasks": 5}):
        assert order_bound() == 5
    for bad in (-1, "many", 2.5, True):
        with (
            dask.config.set({"shoal.client.order.max-tasks": bad}),
            pytest.raises(ValueError, match="shoal.client.order.max-tasks"),
        ):
            order_bound()


def test_graph_scale_reduction_holds_as_little_in_either_order():
    # the large-graph benchmark's shape, small: the cheap order must not hold more
    from dask.order import order

    dsk = array_graph((da.ones((3000,), chunks=1) + 2).sum())
    priorities = order(dsk)
    by_dask = peak_memory(dsk, sorted(dsk, key=priorities.__getitem__))
    assert peak_memory(dsk, dependency_first(dsk)) <= by_dask


def test_a_value_used_twice_is_consumed_as_soon_as_it_can_be():
    # x - x.mean(axis=0): depth first alone holds nearly all of x (the mean of each
    # column needs the whole column before any x - mean runs); running the ready
    # dependents that release inputs keeps it near dask.order's peak.
    from dask.order import order

    x = da.random.random((24, 24), chunks=1)
    dsk = array_graph((x - x.mean(axis=0)).sum())
    priorities = order(dsk)
    by_dask = peak_memory(dsk, sorted(dsk, key=priorities.__getitem__))
    keys = dependency_first(dsk)
    assert_topological(dsk, keys)
    assert peak_memory(dsk, keys) <= 1.25 * by_dask
