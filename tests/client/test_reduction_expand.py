"""Reduction tasks converted by shoal (shoal.client.graph.reduction_expand): the same nodes
as Dask's ``convert_legacy_graph`` on the legacy graphs of array reductions (and of
anything else), in the same order; the whole client path gives Dask's graph and, on a
real cluster, sync's results."""

from __future__ import annotations

import operator
from types import MappingProxyType
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import convert_legacy_graph as dasks_convert
from dask.utils import ensure_dict

from shoal.client.graph import reduction_expand
from shoal.client.graph.layer_encode import ReductionTemplate
from tests.client.test_blockwise_expand import _expr, assert_same_graph, both


def _reductions() -> dict[str, Any]:
    x = da.arange(200, chunks=3)
    m = da.ones((30, 24), chunks=(4, 5))
    return {
        "sum": x.sum(),
        "sum_split_every": x.sum(split_every=3),
        "mean": x.mean(),
        "var": x.var(),
        "argmax": x.argmax(),
        "prod_axis0": m.prod(axis=0),
        "sum_axis1": m.sum(axis=1),
        "sum_2d": m.sum(),  # two axes: nested lists, Dask's way
        "max_keepdims": m.max(axis=0, keepdims=True),
        "cumsum": x.cumsum(axis=0),
        "nanmean_axis0": m.mean(axis=0),
        "moment": x.std(),
    }


def _legacy(coll: Any) -> dict:
    return ensure_dict(coll.__dask_graph__())


@pytest.mark.parametrize("name", sorted(_reductions()))
def test_conversion_equals_dasks(name: str) -> None:
    dsk = _legacy(_reductions()[name])
    templates: dict[str, Any] = {}
    ours = reduction_expand.convert_legacy_graph(dsk, None, templates)
    assert_same_graph(ours, dasks_convert(dsk))
    # cumsum has no tree; a tree over two axes (nested lists, converted by Dask's
    # code) has its template too, for the fusion of its leaves (tree_fuse)
    made = any(isinstance(t, ReductionTemplate) for t in templates.values())
    assert made == (name != "cumsum")


def test_nested_lists_of_keys_are_reductions_too() -> None:
    """A task listing its inputs as lists of keys (``partial_reduce`` over several
    axes) counts towards its layer's template; converted by Dask's code. Lists that are
    not all lists of keys (a literal, an empty list, a key beside a list) do not."""
    dsk = {
        ("a", 0): 1,
        ("a", 1): 2,
        ("n", 0): (sum, [[("a", 0), ("a", 1)], [("a", 1)]]),
        ("n", 1): (sum, [[[("a", 0)], [("a", 1)]], [[("a", 1)]]]),  # three deep
        ("lit", 0): (sum, [[("a", 0), 5]]),
        ("empty", 0): (sum, [[("a", 0)], []]),
        ("mixed", 0): (sum, [[("a", 0)], ("a", 1)]),
    }
    templates: dict[str, Any] = {}
    ours = reduction_expand.convert_legacy_graph(dsk, None, templates)
    assert_same_graph(ours, dasks_convert(dsk))
    assert set(templates) == {"n"}
    assert reduction_expand._nested_keys_in([[("a", 0)], [[("a", 1)]]], dsk)
    for items in ([], [("a", 0)], [[]], [[("a", 0)], []], [[("a", 0), "x"]]):
        assert not reduction_expand._nested_keys_in(items, dsk), items


def test_conversion_of_odd_items_equals_dasks() -> None:
    """Items that are not all keys of the graph (a literal, a missing key, an
    unhashable list or tuple, an empty list, a str key, a dict argument) take Dask's
    path."""
    dsk = {
        ("a", 0): 1,
        ("a", 1): 2,
        "s": 3,
        ("r", 0): (sum, [("a", 0), ("a", 1)]),
        ("r", 1): (sum, [("a", 0), ("missing", 0)]),
        ("r", 2): (sum, [("a", 0), 5]),
        ("r", 3): (sum, []),
        ("r", 4): (len, [[("a", 0)], ("a", 1)]),
        ("r", 5): (sum, ["s", ("a", 1)]),
        ("r", 6): (operator.getitem, [("a", 0)], 0),
        ("r", 7): (dict, {"x": ("a", 0)}),
        ("r", 8): (sum, [("a", 0), ("a", [1])]),  # an unhashable tuple after a key
        "alias": ("a", 0),
    }
    templates: dict[str, Any] = {}
    ours = reduction_expand.convert_legacy_graph(dsk, None, templates)
    assert_same_graph(ours, dasks_convert(dsk))
    assert set(templates) == {"r"}
    # a reduction's key set given by the caller (as Dask's all_keys)
    ours = reduction_expand.convert_legacy_graph(dsk, {("a", 0)}, None)
    assert_same_graph(ours, dasks_convert(dsk, {("a", 0)}))


def test_a_wrong_conversion_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is sharp: a conversion reading each task's inputs shifted by
    one (an off-by-one) fails it."""
    real = reduction_expand._reduction_task

    def off_by_one(key: Any, func: Any, items: list) -> Any:
        return real(key, func, items[1:] + items[:1])

    monkeypatch.setattr(reduction_expand, "_reduction_task", off_by_one)
    dsk = _legacy(da.arange(40, chunks=3).sum())
    with pytest.raises(AssertionError):
        assert_same_graph(reduction_expand.convert_legacy_graph(dsk), dasks_convert(dsk))


@pytest.mark.parametrize("name", sorted(_reductions()))
def test_client_graph_equals_dasks(name: str) -> None:
    (dsk, annotations), (ref, ref_annotations) = both(_reductions()[name])
    assert_same_graph(dsk, ref)
    assert annotations == ref_annotations
    expr = _expr(_reductions()[name])
    got, _ = reduction_expand_materialize(expr)
    (value,) = dask.get(got, list(dask.core.flatten(expr.__dask_keys__())))
    np.testing.assert_array_equal(value, dask.compute(_reductions()[name], scheduler="sync")[0])


def reduction_expand_materialize(expr: Any) -> Any:
    from shoal.client.graph import blockwise_expand

    return blockwise_expand.materialize(expr, {})


def test_nodes_built_directly_have_every_slot_dasks() -> None:
    from dask._task_spec import Alias, Task, _identity_cast

    reduction_expand._builder.cache_clear()
    assert reduction_expand._builder() is reduction_expand._built  # on this Dask
    items = [("x", 2), ("x", 0), "y"]
    want = Task(("r", 1), max, Task(None, _identity_cast, *map(Alias, items), typ=list))
    assert reduction_expand._same_slots(reduction_expand._built(("r", 1), max, items), want)
    assert not reduction_expand._same_slots(reduction_expand._built(("r", 1), max, items[:2]), want)


def test_a_dask_whose_nodes_differ_gets_its_constructors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where building the nodes directly would not give Dask's (a slot Dask's
    constructor sets differently), the constructors are used."""
    real = reduction_expand._built

    def stale(key: Any, func: Any, items: list) -> Any:
        node = real(key, func, items)
        node._data_producer = True
        return node

    monkeypatch.setattr(reduction_expand, "_built", stale)
    reduction_expand._builder.cache_clear()
    try:
        assert reduction_expand._builder() is not stale
        dsk = _legacy(da.arange(40, chunks=3).sum())
        assert_same_graph(reduction_expand.convert_legacy_graph(dsk), dasks_convert(dsk))
    finally:
        reduction_expand._builder.cache_clear()


def test_cull_of_a_materialized_layer_equals_dasks() -> None:
    """Whole, in part, and with items that are not keys or not reduction tasks: the
    same layer (keys in the same order) and the same dependencies as Dask's."""
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    coll = da.arange(200, chunks=3).sum(split_every=4)
    hlg = coll.__dask_graph__()
    all_keys = hlg.get_all_external_keys()
    odd = MaterializedLayer(
        {
            ("o", 0): (sum, [("x", 1), 5, ("o", 1)]),
            ("o", 1): (sum, [(operator.add, 1, 2)]),
            ("o", 2): (operator.add, ("o", 0), 1),
            ("o", 3): (sum, []),
            ("o", 4): (sum, [("x", 1), ("x", [1]), ("o", 3)]),  # an unhashable tuple
        }
    )
    layers = [layer for layer in hlg.layers.values() if type(layer) is MaterializedLayer] + [odd]
    assert len(layers) > 2
    for layer in layers:
        keys = list(layer.keys())
        for wanted in (set(keys), set(keys[:1]), set(keys[::2]) | {("elsewhere", 0)}):
            want = layer.cull(set(wanted), all_keys | set(odd.keys()) | {("x", 1)})
            got = reduction_expand.cull_materialized(
                layer, set(wanted), all_keys | set(odd.keys()) | {("x", 1)}
            )
            if not layer.has_legacy_tasks:  # Dask's task spec already: Dask's cull
                assert got is None
                continue
            assert got is not None
            assert list(got[0].mapping) == list(want[0].mapping)
            assert got[0].mapping == want[0].mapping
            assert got[1] == want[1]
            assert [list(v) for v in got[1].values()] == [list(v) for v in want[1].values()]
    assert reduction_expand.cull_materialized(HighLevelGraph({}, {}), set(), set()) is None


def test_a_dict_of_tasks_and_legacy_values_converts_in_dasks_order() -> None:
    """Tasks kept where they are, legacy values converted in their places, a value
    naming its own key dropped: Dask's dict, in Dask's order (also not a dict)."""
    from dask._task_spec import Task, TaskRef

    dsk = {
        ("t", 0): Task(("t", 0), operator.neg, 1),
        ("a", 0): 1,
        "self": "self",
        ("t", 1): Task(("t", 1), operator.neg, TaskRef(("a", 0))),
        ("r", 0): (sum, [("a", 0), ("t", 1)]),
        ("a", 1): (operator.add, ("a", 0), 1),
        ("t", 2): Task(("t", 2), operator.neg, TaskRef(("r", 0))),
    }
    want = dasks_convert(dsk)
    assert "self" not in want
    assert_same_graph(reduction_expand.convert_legacy_graph(dsk), want)
    mapping = MappingProxyType(dsk)  # not a dict: the loop over every value
    assert_same_graph(reduction_expand.convert_legacy_graph(mapping), want)
