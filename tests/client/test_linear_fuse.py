"""shoal's position-based ``fuse_linear_task_spec`` gives exactly Dask's result: the
same keys in the same order, the same (fused) tasks and aliases."""

from __future__ import annotations

from typing import Any

import dask.array as da
import pytest
from dask._task_spec import Alias, DataNode, Task, TaskRef, convert_legacy_graph
from dask._task_spec import fuse_linear_task_spec as dask_fuse
from dask.core import flatten
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized

from shoal.client.graph.linear_fuse import fuse_linear_task_spec


def _f(*args: Any) -> Any:
    return args


def _same(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    for key, node in theirs.items():
        mine = ours[key]
        assert type(mine) is type(node), key
        assert mine == node, key  # Task: by token (its function and nested tasks)
        assert mine.key == node.key and mine.dependencies == node.dependencies


@st.composite
def graphs(draw: Any) -> tuple[dict, list]:
    """A random DAG of Tasks (chains likely), with DataNodes, aliases, dependencies
    outside the graph, and some keys asked for."""
    n = draw(st.integers(1, 40))
    keys: list[Any] = [("x", i) if draw(st.booleans()) else f"k-{i}" for i in range(n)]
    dsk: dict[Any, Any] = {}
    for i, key in enumerate(keys):
        kind = draw(st.sampled_from(["task", "task", "task", "data", "alias"]))
        if kind == "data" or i == 0 and kind == "alias":
            dsk[key] = DataNode(key, i)
            continue
        if kind == "alias":
            dsk[key] = Alias(key, keys[draw(st.integers(0, i - 1))])
            continue
        deps: list[Any] = []
        if i and draw(st.integers(0, 3)):  # mostly one dependency: chains
            count = draw(st.sampled_from([1, 1, 1, 2, 3]))
            deps = draw(st.lists(st.sampled_from(keys[:i]), min_size=1, max_size=count))
        if draw(st.integers(0, 9)) == 0:
            deps.append(("outside", draw(st.integers(0, 2))))
        dsk[key] = Task(key, _f, *[TaskRef(d) for d in deps])
    order = draw(st.permutations(keys))  # the graph's key order matters to the walk
    dsk = {k: dsk[k] for k in order}
    asked = draw(st.lists(st.sampled_from(keys), max_size=4))
    return dsk, asked


@settings(max_examples=sized(ci=120, full=400), deadline=None)
@given(graphs())
def test_random_graphs_fuse_as_dask_does(case: tuple[dict, list]) -> None:
    dsk, asked = case
    _same(fuse_linear_task_spec(dsk, asked), dask_fuse(dsk, asked))


def test_a_long_chain_and_a_reduction_fuse_as_dask_does() -> None:
    chain = {("c", 0): Task(("c", 0), _f)}
    for i in range(1, 6):
        chain[("c", i)] = Task(("c", i), _f, TaskRef(("c", i - 1)))
    wide = {("w", i): Task(("w", i), _f) for i in range(8)}
    wide["total"] = Task("total", _f, *[TaskRef(("w", i)) for i in range(8)])
    dsk = {**chain, **wide}
    ours = fuse_linear_task_spec(dsk, [("c", 5), "total"])
    _same(ours, dask_fuse(dsk, [("c", 5), "total"]))
    assert len(ours) == 1 + 9  # the chain is one task (its top key kept), the rest as is


def test_an_array_graph_fuses_as_dask_does() -> None:
    x = ((da.ones((40,), chunks=2) + 1) * 2).sum(split_every=3)
    dsk = convert_legacy_graph(dict(x.__dask_graph__()))  # not optimised: chains left
    keys = list(flatten(x.__dask_keys__()))
    _same(fuse_linear_task_spec(dsk, keys), dask_fuse(dsk, keys))


def test_a_graph_of_legacy_tasks_fails_as_in_dask() -> None:
    dsk = {"a": 1, "b": (_f, "a"), "c": (_f, "b")}
    with pytest.raises(AttributeError) as theirs:
        dask_fuse(dsk, ["c"])
    with pytest.raises(AttributeError) as ours:
        fuse_linear_task_spec(dsk, ["c"])
    assert str(ours.value) == str(theirs.value)


class _Blocking(Task):
    """A node of another class, that Dask's fusion must leave whole (``block_fusion``)."""

    @property
    def block_fusion(self) -> bool:
        return True


def test_nodes_of_other_classes_are_asked_as_dask_asks_them() -> None:
    """Dask's own node classes are read through their slots; any other class through
    its properties, as Dask's fusion does: a node blocking fusion stays whole."""
    chain = {("c", 0): Task(("c", 0), _f)}
    for i in range(1, 6):
        cls = _Blocking if i == 3 else Task
        chain[("c", i)] = cls(("c", i), _f, TaskRef(("c", i - 1)))
    ours = fuse_linear_task_spec(chain, [("c", 5)])
    _same(ours, dask_fuse(chain, [("c", 5)]))
    assert ("c", 3) in ours and len(ours) == 3
