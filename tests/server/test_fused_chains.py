"""Dask's fused linear chains run on the worker in their one order, without dask.order."""

from __future__ import annotations

import gc
import operator
import weakref

import pytest

pytest.importorskip("dask")

import dask.order  # noqa: E402
from dask._task_spec import Task, TaskRef, _execute_subgraph  # noqa: E402

from shoal.server.fused_chains import (  # noqa: E402
    chain_order,
    is_dask_execute_subgraph,
    make_chain_runner,
    with_fast_chains,
)


def _fused(tasks: list[Task]) -> Task:
    fused = Task.fuse(*tasks)
    assert fused.func is _execute_subgraph
    return fused


def _call(fused: Task, func, values: dict) -> object:
    inner, outkey, inkeys, *_ = fused.args
    return func(inner, outkey, inkeys, *(values[k] for k in inkeys))


def _no_order(*args, **kwargs):
    raise AssertionError("dask.order.order called for a linear chain")


def test_only_dasks_execute_subgraph_is_replaced():
    assert is_dask_execute_subgraph(_execute_subgraph)
    assert with_fast_chains(_execute_subgraph) is not _execute_subgraph
    assert with_fast_chains(operator.add) is operator.add
    assert with_fast_chains(b"template bytes") == b"template bytes"


def test_linear_chain_runs_without_dask_order(monkeypatch):
    chain = [
        Task("a", operator.add, TaskRef("x"), 1),
        Task("b", operator.mul, TaskRef("a"), 10),
        Task("c", operator.sub, TaskRef("b"), TaskRef("y")),
    ]
    fused = _fused(chain)
    values = {"x": 4, "y": 7}
    expected = _call(fused, _execute_subgraph, values)
    assert expected == (4 + 1) * 10 - 7
    assert chain_order(fused.args[0], fused.args[1]) == ["a", "b", "c"]
    monkeypatch.setattr(dask.order, "order", _no_order)
    assert _call(fused, with_fast_chains(_execute_subgraph), values) == expected


def test_non_chain_goes_to_dask(monkeypatch):
    # c depends on two nodes of the subgraph: not a chain, dask's own function runs it
    tasks = {
        "a": Task("a", operator.add, TaskRef("x"), 1),
        "b": Task("b", operator.add, TaskRef("x"), 2),
        "c": Task("c", operator.mul, TaskRef("a"), TaskRef("b")),
    }
    assert chain_order(tasks, "c") is None
    calls = []

    def fallback(*args):
        calls.append(args[1])
        return _execute_subgraph(*args)

    fast = make_chain_runner(fallback)
    assert fast(tasks, "c", ("x",), 3) == (3 + 1) * (3 + 2)
    assert calls == ["c"]


@pytest.mark.parametrize(
    "inner, outkey",
    [
        ({"a": Task("a", operator.neg, 1)}, "b"),  # outkey missing
        ({"a": Task("a", operator.neg, 1), "b": Task("b", operator.neg, 2)}, "b"),  # a off it
        (
            {
                "a": Task("a", operator.neg, TaskRef("b")),
                "b": Task("b", operator.neg, TaskRef("a")),
            },
            "b",
        ),  # a cycle
        ([Task("a", operator.neg, 1)], "a"),  # not a dict
        ({"a": 5}, "a"),  # not a graph node
    ],
)
def test_chain_order_refuses_other_shapes(inner, outkey):
    assert chain_order(inner, outkey) is None


class _Big:
    pass


def test_intermediate_dropped_once_used():
    first: list[weakref.ref] = []

    def make():
        value = _Big()
        first.append(weakref.ref(value))
        return value

    def passes(value):
        return "next"

    def check(value):
        gc.collect()
        return first[0]() is None  # the chain no longer holds the first intermediate

    fused = _fused(
        [Task("a", make), Task("b", passes, TaskRef("a")), Task("c", check, TaskRef("b"))]
    )
    assert _call(fused, with_fast_chains(_execute_subgraph), {}) is True


def test_dask_array_chain_same_result():
    import dask.array as da
    import numpy as np
    from dask._task_spec import convert_legacy_graph, fuse_linear_task_spec

    x = (da.ones((8,), chunks=2) + 3).sum()
    graph = dict(x.__dask_graph__())
    graph = fuse_linear_task_spec(convert_legacy_graph(graph), x.__dask_keys__())
    fused = [t for t in graph.values() if isinstance(t, Task) and t.func is _execute_subgraph]
    assert fused
    fast = make_chain_runner(_execute_subgraph)
    for task in fused:
        inner, outkey, inkeys, *_ = task.args
        assert chain_order(inner, outkey) is not None
        assert np.array_equal(fast(inner, outkey, inkeys), _execute_subgraph(inner, outkey, inkeys))


def test_a_chain_is_reused_only_while_its_nodes_are_the_same_objects():
    fast = make_chain_runner(_execute_subgraph)
    first = {
        "a": Task("a", operator.add, TaskRef("x"), 1),
        "b": Task("b", operator.mul, TaskRef("a"), 10),
    }
    assert fast(first, "b", ("x",), 2) == 30
    assert fast(dict(first), "b", ("x",), 3) == 40  # a copy of the same nodes
    # the same output node, another node before it: worked out again
    other = {**first, "a": Task("a", operator.sub, TaskRef("x"), 1)}
    assert fast(other, "b", ("x",), 3) == 20
    # one node more (off the chain): dask's function decides
    assert fast({**first, "z": Task("z", operator.neg, TaskRef("x"))}, "b", ("x",), 3) == 40


def test_direct_calls_give_what_dasks_tasks_give():
    from dask._task_spec import DataNode

    def combine(a, b, *, scale, offset=0):
        return (a + b) * scale + offset

    chain = [
        Task("a", operator.add, TaskRef("x"), 1),
        Task("b", combine, TaskRef("a"), 2, scale=TaskRef("y"), offset=5),
        # a nested node among the arguments: called as dask calls it
        Task("c", operator.add, TaskRef("b"), DataNode(None, 100)),
    ]
    fused = _fused(chain)
    values = {"x": 4, "y": 3}
    expected = _call(fused, _execute_subgraph, values)
    assert expected == ((4 + 1 + 2) * 3 + 5) + 100
    fast = with_fast_chains(_execute_subgraph)
    assert _call(fused, fast, values) == expected
    assert _call(fused, fast, values) == expected  # from the cached chain


def test_a_key_error_raised_by_a_task_is_not_retried():
    calls = []

    def fails(value):
        calls.append(value)
        raise KeyError("inside the task")

    fused = _fused([Task("a", operator.add, TaskRef("x"), 1), Task("b", fails, TaskRef("a"))])
    with pytest.raises(KeyError, match="inside the task"):
        _call(fused, with_fast_chains(_execute_subgraph), {"x": 1})
    assert calls == [2]
