"""A large reduction's tiny leaves fused into their reduction tasks
(shoal.client.graph.tree_fuse): the same results as Dask's sync scheduler from fewer tasks,
only where every rule holds, and the fused tasks encoded as one template each."""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from dask._expr import FinalizeCompute
from dask._task_spec import Alias, DataNode, Task, TaskRef, _identity_cast, execute_graph
from dask.base import collections_to_expr
from dask.core import flatten
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal import Client
from shoal.client.graph import blockwise_expand, reduction_expand, tree_fuse
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.client.graph.layer_encode import (
    NESTED,
    FusedReductionTemplate,
    LayerTemplate,
    ReductionTemplate,
)
from shoal.protocol.serialize import TEMPLATE, FunctionCache, FunctionTable, loads_task_args
from tests.client.test_layer_encode import assert_encoded_alike, encode

MIN_GROUPS_KEY = "shoal.client.fuse-reductions.min-groups"


@pytest.fixture(autouse=True)
def every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every expanded layer gets its template, however few its blocks."""
    monkeypatch.setattr(blockwise_expand, "MIN_BLOCKS", 1)


def _wave(b: Any, block_id: Any = None) -> Any:
    """Values that differ from block to block (for argmax, var, ...)."""
    return b * np.sin(block_id[0] * 1.7 + np.arange(b.shape[0]))


def _wave2(b: Any, block_id: Any = None) -> Any:
    return b * np.sin(block_id[0] * 1.7 + block_id[1] * 0.3 + np.arange(b.size).reshape(b.shape))


def _x1(n: int = 203) -> Any:  # 203 blocks: the last group of a level has 3 inputs
    return da.ones((n,), chunks=1).map_blocks(_wave, dtype=float) + 3


def _x2() -> Any:
    return da.ones((60, 20), chunks=(1, 5)).map_blocks(_wave2, dtype=float) * 2


def _x3() -> Any:
    return da.ones((12, 10, 8), chunks=(1, 2, 2)).map_blocks(_wave3, dtype=float)


def _wave3(b: Any, block_id: Any = None) -> Any:
    return b * np.cos(sum(block_id) * 0.7 + np.arange(b.size).reshape(b.shape))


def fusing() -> dict[str, Any]:
    """Reductions whose first level fuses (with min-groups lowered)."""
    return {
        "graph_scale": lambda: (da.ones((402,), chunks=1) + 3).sum(),
        "sum": lambda: _x1().sum(),
        "mean": lambda: _x1().mean(),
        "var": lambda: _x1().var(),
        "nansum": lambda: da.nansum(_x1()),
        "prod": lambda: (_x1() / 3).prod(),
        "sum-keepdims": lambda: _x1().sum(keepdims=True),
        "max-2d-axis0": lambda: _x2().max(axis=0),
        "sum-2d-axis1": lambda: _x2().sum(axis=1),
        "mean-2d-axis0-keepdims": lambda: _x2().mean(axis=0, keepdims=True),
        "sum-split2": lambda: _x1().sum(split_every=2),
        "sum-split4": lambda: _x1().sum(split_every=4),
        "sum-split8": lambda: _x1().sum(split_every=8),
        "sum-split32": lambda: _x1().sum(split_every=32),
        "last-group-of-one": lambda: _x1(201).sum(),
        "two-outputs": lambda: [_x1().sum(), _x1(204).max()],
        # over several axes: each reduction task lists its inputs as lists of lists
        "sum-2d-all": lambda: _x2().sum(),
        "mean-2d-all": lambda: _x2().mean(),
        "var-2d-all": lambda: _x2().var(),
        "max-2d-all-keepdims": lambda: _x2().max(keepdims=True),
        "sum-2d-split4x2": lambda: _x2().sum(split_every={0: 4, 1: 2}),
        "sum-3d-all": lambda: _x3().sum(),
        "sum-3d-axes01": lambda: _x3().sum(axis=(0, 1)),
    }


def not_fusing() -> dict[str, Any]:
    """Reductions left as they are, with their results: the arg reductions' leaves
    are linearly fused tasks (no layer template)."""
    return {
        "argmax": lambda: _x1().argmax(),
        "argmin": lambda: _x1().argmin(),
        "argmax-2d-axis0": lambda: _x2().argmax(axis=0),
        "argmax-2d-all": lambda: _x2().argmax(),
    }


def materialised(c: Any, least: Any = 1) -> tuple[dict, dict, list]:
    """(the graph the client submits, the layers' templates, the keys) of ``c``."""
    collections = c if isinstance(c, list) else [c]
    expr = FinalizeCompute(collections_to_expr(collections, True)).optimize()
    layers: dict[str, Any] = {}
    with dask.config.set({MIN_GROUPS_KEY: least}):
        dsk, _ = blockwise_expand.materialize(expr, layers)
    return dsk, layers, list(flatten(expr.__dask_keys__()))


def _keys(dsk: dict) -> list:
    """The graph's keys but its finalize tasks' (named anew for every expression)."""
    return [k for k in dsk if "finalize" not in str(k)]


def fused_layers(layers: dict) -> list[str]:
    return [n for n, t in layers.items() if isinstance(t, FusedReductionTemplate)]


def results(dsk: dict, keys: list) -> list:
    got = execute_graph(dict(dsk), keys=set(keys))
    return [got[k] for k in keys]


def through_the_encoder(dsk: dict, layers: dict, keys: list) -> list:
    """The graph encoded (layer templates on), decoded and run as a worker would."""
    specs, functions, _ = encode(dsk, layers)
    cache = FunctionCache()
    cache.add(functions)
    data: dict = {}
    for spec in specs:
        args, kwargs = loads_task_args(spec.payload, data.__getitem__, cache.get)
        data[spec.key] = cache.get(spec.func)(*args, **kwargs)
    return [data[k] for k in keys]


def expected(c: Any) -> list:
    (want,) = dask.compute(c, scheduler="sync")
    return want if isinstance(want, list) else [want]


@pytest.mark.parametrize("name", sorted(fusing()))
def test_fused_reductions_compute_what_dask_computes(name: str) -> None:
    c = fusing()[name]()
    dsk, layers, keys = materialised(c)
    plain, _, _ = materialised(c, least=0)
    assert fused_layers(layers), "nothing fused"
    assert len(dsk) < len(plain)
    want = expected(c)
    for got in (results(dsk, keys), through_the_encoder(dsk, layers, keys)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12)
            assert np.asarray(g).shape == np.asarray(w).shape


@pytest.mark.parametrize("name", sorted(not_fusing()))
def test_other_reductions_are_left_as_they_are(name: str) -> None:
    c = not_fusing()[name]()
    dsk, layers, keys = materialised(c)
    plain, _, _ = materialised(c, least=0)
    assert not fused_layers(layers)
    assert _keys(dsk) == _keys(plain)
    np.testing.assert_array_equal(results(dsk, keys)[0], expected(c)[0])


def test_a_fused_task_is_its_reductions_call_on_its_leaves_inlined() -> None:
    plain, layers, keys, name, groups = _plain()
    dsk = _fuse(plain, layers, keys)
    key = (name, 0)
    p, unfused = dsk[key], plain[key]
    assert p.func is unfused.func and not p.dependencies
    (inner,) = p.args
    assert inner.func is _identity_cast and inner.kwargs == {"typ": list}
    leaves = [plain[a.target] for a in unfused.args[0].args]
    assert list(inner.args) == leaves and all(
        t is leaf for t, leaf in zip(inner.args, leaves, strict=True)
    )
    assert not any(leaf.key in dsk for leaf in leaves)
    # 40 leaves into 10 fused tasks, the rest of the tree as it was
    assert list(dsk) == [k for k in plain if k not in {t for _, ts in groups for t in ts}]


def test_a_fused_task_over_two_axes_keeps_its_lists_of_lists() -> None:
    """Each fused task of a reduction over two axes is its unfused task with every
    ``Alias`` of a leaf replaced by that leaf's very node, in the same place of the
    same lists of lists (swapping two leaves fails it)."""
    c = (da.ones((8, 8), chunks=1).map_blocks(_wave2, dtype=float)).sum()
    plain, layers, keys = materialised(c, least=0)
    templates = dict(layers)
    dsk = tree_fuse.fuse_reduction_leaves(dict(plain), keys, templates, 16)
    (name,) = fused_layers(templates)  # (16 tasks of 2 x 2 leaves; 4 above: not fused)
    fused = [k for k in dsk if type(k) is tuple and k[0] == name]
    assert len(fused) == 16

    def as_unfused(node: Any) -> Any:  # each inlined leaf back to an Alias of its key
        if type(node) is Task and node.key is not None and node.key in plain:
            return Alias(node.key)
        if type(node) is not Task:
            return node
        return Task(node.key, node.func, *map(as_unfused, node.args), **node.kwargs)

    for key in fused:
        p = dsk[key]
        assert not p.dependencies and p.func is plain[key].func
        (outer,) = p.args
        rows = outer.args
        assert len(rows) == 2 and all(len(r.args) == 2 for r in rows)
        leaves = [leaf for r in rows for leaf in r.args]
        assert all(leaf is plain[leaf.key] for leaf in leaves)  # the very nodes
        assert not any(leaf.key in dsk for leaf in leaves)
        assert reduction_expand._same_slots(
            Task(key, p.func, as_unfused(outer)), Task(key, p.func, plain[key].args[0])
        )
        (got,) = results(dsk, [key])
        np.testing.assert_array_equal(got, results(plain, [key])[0])


# ------------------------------------------------------------------------ the rules


def _plain() -> tuple[dict, dict, list, str, list]:
    """An unfused graph_scale graph with its templates, keys, reduction layer and
    its groups ((P's key, its leaves' keys) in order)."""
    dsk, layers, keys = materialised((da.ones((40,), chunks=1) + 3).sum(), least=0)
    (name,) = [
        n
        for n, t in layers.items()
        if type(t) is ReductionTemplate
        and (n, 0) in dsk
        and type(layers.get(dsk[(n, 0)].args[0].args[0].target[0])) is LayerTemplate
    ]
    groups = [(k, [a.target for a in dsk[k].args[0].args]) for k in dsk if k[0] == name]
    return dsk, layers, keys, name, groups


def _fuse(dsk: dict, layers: dict, keys: list, least: int = 4) -> dict:
    """``dsk`` fused; by default only its first level (of 10 groups; the level above
    has 3, under 4)."""
    return tree_fuse.fuse_reduction_leaves(dict(dsk), keys, dict(layers), least)


def _is_fused(dsk: dict, key: Any) -> bool:
    return not dsk[key].dependencies


def test_every_group_fuses_where_the_rules_hold() -> None:
    dsk, layers, keys, _, groups = _plain()
    fused = _fuse(dsk, layers, keys)
    assert all(_is_fused(fused, p) for p, _ in groups)
    assert len(fused) == len(dsk) - sum(len(leaves) for _, leaves in groups)


def test_a_leaf_asked_for_is_not_fused() -> None:
    dsk, layers, keys, _, groups = _plain()
    p, leaves = groups[3]
    fused = _fuse(dsk, layers, [*keys, leaves[1]])
    assert not _is_fused(fused, p) and all(leaf in fused for leaf in leaves)
    assert all(_is_fused(fused, q) for q, _ in groups if q != p)


def test_a_leaf_with_a_dependency_is_not_fused() -> None:
    dsk, layers, keys, _, groups = _plain()
    p, leaves = groups[2]
    leaf = dsk[leaves[0]]
    dsk = {"x": DataNode("x", 1), **dsk}
    dsk[leaves[0]] = Task(leaf.key, leaf.func, *leaf.args, extra=TaskRef("x"))
    fused = _fuse(dsk, layers, keys)
    assert not _is_fused(fused, p) and all(leaf in fused for leaf in leaves)
    assert all(_is_fused(fused, q) for q, _ in groups if q != p)


def test_a_leaf_with_another_dependent_is_not_fused() -> None:
    dsk, layers, keys, _, groups = _plain()
    p, leaves = groups[0]
    dsk = {**dsk, "other": Task("other", repr, TaskRef(leaves[2]))}
    fused = _fuse(dsk, layers, [*keys, "other"])
    assert not _is_fused(fused, p) and all(leaf in fused for leaf in leaves)
    assert all(_is_fused(fused, q) for q, _ in groups if q != p)


def test_a_leaf_in_two_reduction_tasks_is_not_fused() -> None:
    dsk, layers, keys, _, groups = _plain()
    (p, leaves), (q, others) = groups[0], groups[1]
    dsk = dict(dsk)
    node = dsk[q]
    inner = Task(None, _identity_cast, *map(Alias, [*others, leaves[0]]), typ=list)
    dsk[q] = Task(q, node.func, inner)
    fused = _fuse(dsk, layers, keys)
    assert not _is_fused(fused, p) and not _is_fused(fused, q)
    assert all(_is_fused(fused, r) for r, _ in groups if r not in (p, q))


def test_a_leaf_named_twice_is_not_fused() -> None:
    dsk, layers, keys, _, groups = _plain()
    p, leaves = groups[1]
    dsk = dict(dsk)
    inner = Task(None, _identity_cast, *map(Alias, [leaves[0], *leaves]), typ=list)
    dsk[p] = Task(p, dsk[p].func, inner)
    fused = _fuse(dsk, layers, keys)
    assert not _is_fused(fused, p)
    assert all(_is_fused(fused, q) for q, _ in groups if q != p)


def test_a_layer_below_min_groups_is_not_fused() -> None:
    dsk, layers, keys, _, groups = _plain()
    assert len(_fuse(dsk, layers, keys, least=len(groups) + 1)) == len(dsk)
    assert len(_fuse(dsk, layers, keys, least=len(groups))) < len(dsk)
    # groups that do not fuse do not count
    p, leaves = groups[0]
    fused = _fuse(dsk, layers, [*keys, leaves[0]], least=len(groups))
    assert len(fused) == len(dsk)


@pytest.mark.parametrize("off", [0, False])
def test_min_groups_off(off: Any) -> None:
    c = (da.ones((40,), chunks=1) + 3).sum()
    dsk, layers, _ = materialised(c, least=off)
    assert not fused_layers(layers)
    assert _keys(dsk) == _keys(materialised(c, least=0)[0])
    assert fused_layers(materialised(c, least=10)[1])
    assert not fused_layers(materialised(c, least=11)[1])  # 40 leaves: 10 groups


def test_a_bad_min_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="min-groups"):
        materialised((da.ones((40,), chunks=1) + 3).sum(), least="many")


def test_the_default_leaves_small_graphs_alone() -> None:
    """10,000 groups by default: interactive graphs stay as Dask makes them."""
    c = (da.ones((4 * 9_999,), chunks=1) + 3).sum()
    expr = FinalizeCompute(collections_to_expr([c], True)).optimize()
    layers: dict = {}
    blockwise_expand.materialize(expr, layers)
    assert tree_fuse.min_groups() == tree_fuse.MIN_GROUPS == 10_000
    assert layers and not fused_layers(layers)


def test_annotated_graphs_are_not_fused() -> None:
    with dask.annotate(priority=3):
        c = (da.ones((40,), chunks=1) + 3).sum()
    dsk, layers, keys = materialised(c)
    assert not fused_layers(layers)
    assert _keys(dsk) == _keys(materialised(c, least=0)[0])
    with dask.annotate(retries=2):
        y = da.ones((40,), chunks=1) + 3
    dsk, layers, keys = materialised(y.sum())  # the leaves' layer only
    assert not fused_layers(layers)


def test_low_level_fusion_off_fuses_nothing() -> None:
    c = (da.ones((40,), chunks=1) + 3).sum()
    with dask.config.set({"optimization.fuse.active": False}):
        dsk, layers, keys = materialised(c)
        assert not fused_layers(layers)
        assert len(dsk) == len(materialised(c, least=0)[0])
        np.testing.assert_array_equal(results(dsk, keys)[0], 160.0)


# ------------------------------------------------------------------------ levels


def _levels(n: int = 160) -> tuple[dict, dict, list, list[str]]:
    """An unfused graph_scale graph of ``n`` leaves, its templates, keys, and its
    reduction layers from the leaves up (160 leaves: levels of 40, 10 and 3 tasks)."""
    dsk, layers, keys = materialised((da.ones((n,), chunks=1) + 3).sum(), least=0)
    order: list[str] = []
    below = {k[0] for k in dsk if type(k) is tuple and type(layers.get(k[0])) is LayerTemplate}
    while True:
        above = {
            k[0]
            for k, v in dsk.items()
            if type(k) is tuple
            and type(layers.get(k[0])) is ReductionTemplate
            and v.args[0].args[0].target[0] in below
        }
        if not above:
            return dsk, layers, keys, order
        (name,) = above
        order.append(name)
        below = above


def _tasks_of(dsk: dict, name: str) -> list:
    return [k for k in dsk if type(k) is tuple and k[0] == name]


def test_levels_fuse_while_each_has_min_groups() -> None:
    """Each level of 10 tasks or more fuses into the level above: 160 leaves into 10
    tasks of 16 (4 tasks of 4 leaves each, inlined); the 3 tasks above stay."""
    dsk, layers, keys, (one, two, three) = _levels()
    fused = _fuse(dsk, layers, keys, least=10)
    assert _tasks_of(fused, one) == [] and len(_tasks_of(fused, two)) == 10
    assert len(fused) == len(dsk) - 160 - 40
    p, unfused = fused[(two, 0)], dsk[(two, 0)]
    assert p.func is unfused.func and not p.dependencies
    children = p.args[0].args
    assert [c.key for c in children] == [a.target for a in unfused.args[0].args]
    for child in children:
        assert child is not dsk[child.key] and not child.dependencies
        assert child.func is dsk[child.key].func
        leaves = [dsk[a.target] for a in dsk[child.key].args[0].args]
        assert all(t is leaf for t, leaf in zip(child.args[0].args, leaves, strict=True))
    assert all(fused[k].dependencies for k in _tasks_of(fused, three))  # not fused
    np.testing.assert_array_equal(results(fused, keys)[0], 640.0)
    # one level more with 3 groups allowed: 64, 64 and 32 leaves
    assert len(_fuse(dsk, layers, keys, least=3)) == len(dsk) - 160 - 40 - 10


def test_a_fused_task_holds_at_most_max_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    dsk, layers, keys, (one, two, _) = _levels()
    monkeypatch.setattr(tree_fuse, "MAX_LEAVES", 15)  # a level-two task has 16
    fused = _fuse(dsk, layers, keys, least=1)
    assert len(_tasks_of(fused, one)) == 40 and all(
        fused[k].dependencies for k in fused if k[0] == two
    )
    monkeypatch.setattr(tree_fuse, "MAX_LEAVES", 16)
    fused = _fuse(dsk, layers, keys, least=1)
    assert _tasks_of(fused, one) == [] and not any(
        fused[k].dependencies for k in _tasks_of(fused, two)
    )
    np.testing.assert_array_equal(results(fused, keys)[0], 640.0)


def test_a_group_over_an_unfused_task_is_not_fused() -> None:
    """A leaf asked for keeps its task unfused at the first level, so the task above
    it has an input that is not a root: it stays as it was, its 9 peers fuse."""
    dsk, layers, keys, (one, two, _) = _levels()
    leaf = dsk[(one, 5)].args[0].args[2].target
    fused = _fuse(dsk, layers, [*keys, leaf], least=9)
    assert leaf in fused and (one, 5) in fused and fused[(one, 5)].dependencies
    p = (two, 1)  # over (one, 4) ... (one, 7)
    assert fused[p].dependencies == {(one, i) for i in range(4, 8)}
    assert {k for k in _tasks_of(fused, one)} == {(one, i) for i in range(4, 8)}
    assert all(not fused[k].dependencies for k in _tasks_of(fused, two) if k != p)
    got = results(fused, [*keys, leaf])
    np.testing.assert_array_equal(got[0], 640.0)
    np.testing.assert_array_equal(got[1], np.full((1,), 4.0))


def test_the_levels_are_encoded_as_one_template_per_shape() -> None:
    # 166 leaves: 42 tasks (the last of 2 leaves), then 11 (the last over 2 of them)
    fused, layers, keys = materialised((da.ones((166,), chunks=1) + 3).sum(), least=10)
    names = fused_layers(layers)
    assert len(names) == 2
    used = assert_encoded_alike(fused, layers)
    specs, _, encoder = encode(fused, layers)
    top = [s for s in specs if type(s.key) is tuple and s.key[0] in names]
    assert len(top) == 11 and all(s.payload.kind == TEMPLATE for s in top)
    assert used == encoder._layers.encoded >= 11
    made = {n[1] for n in encoder._layers._made if type(n) is tuple}
    # ten tasks of 4 x 4 leaves, and the last over one task of 4 and one of 2
    assert made == {(4, 4, 4, 4), (4, 2)}
    np.testing.assert_allclose(through_the_encoder(fused, layers, keys)[0], 664.0)


def test_a_fused_templates_leaves_share_their_chains_nodes() -> None:
    """Each leaf's constants are copied (a template holds no object twice) but Dask's
    graph nodes are not: on the worker every leaf of a task runs the same fused chain,
    which the chain runner works out once."""
    from shoal.protocol import plain_codec
    from shoal.protocol.calls import Call
    from shoal.protocol.template_plan import TemplatePlan

    dsk, layers, _ = materialised((da.ones((160,), chunks=1) + 3).sum(), least=10)
    specs, functions, _ = encode(dsk, layers)
    cache = FunctionCache()
    cache.add(functions)
    (upper,) = [n for n in fused_layers(layers) if type(layers[n].leaf) is FusedReductionTemplate]
    (spec, *_) = [s for s in specs if type(s.key) is tuple and s.key[0] == upper]
    template_id, slots = plain_codec.loads(spec.payload.data, lambda k: k)
    plan = TemplatePlan.compile(cache.get(template_id), cache.get)
    assert plan is not None
    (call,), _ = plan.fill(slots, lambda k: k)
    subgraphs = []

    def walk(c: Any) -> None:
        if type(c) is Call:
            if isinstance(c.args[0], dict):
                subgraphs.append(c.args[0])
            for a in c.args:
                walk(a)

    walk(call)
    assert len(subgraphs) == 16
    assert len({id(g) for g in subgraphs}) == 16  # a dict of its own per leaf
    first = subgraphs[0]
    assert all(all(g[k] is first[k] for k in first) for g in subgraphs)


def _nodes(node: Any) -> list[Any]:
    """``node`` and every task inlined in it, depth first."""
    if type(node) is not Task:
        return []
    out = [node]
    for a in node.args:
        out.extend(_nodes(a))
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    split_every=st.sampled_from([2, 3, 4, 8]),
    least=st.integers(1, 60),
    max_leaves=st.sampled_from([4, 9, 16, 64]),
)
def test_any_tree_fuses_to_the_same_result_within_the_rules(
    n: int, split_every: int, least: int, max_leaves: int
) -> None:
    """Whatever the tree's size and fan-in, and the rules' bounds: the fused graph
    computes what the unfused one does (run directly and through the encoder), keeps
    every key asked for, holds every leaf exactly once, fuses only levels of at least
    ``least`` tasks, and no task fused above the first level holds more than
    ``max_leaves`` leaves."""
    c = (da.ones((n,), chunks=1) + 3).sum(split_every=split_every)
    plain, layers, keys = materialised(c, least=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tree_fuse, "MAX_LEAVES", max_leaves)
        fused = tree_fuse.fuse_reduction_leaves(dict(plain), keys, layers, least)
    assert_fused_within_rules(plain, fused, layers, keys, float(4 * n), least, max_leaves)


def assert_fused_within_rules(
    plain: dict, fused: dict, layers: dict, keys: list, want: float, least: int, max_leaves: int
) -> None:
    """The fused graph keeps every key asked for, computes ``want`` (directly and
    through the encoder), holds every leaf exactly once, fuses only levels of at least
    ``least`` tasks, and no task fused above the first level holds more than
    ``max_leaves`` leaves."""
    assert all(k in fused for k in keys) and set(fused) <= set(plain)
    np.testing.assert_array_equal(results(fused, keys)[0], want)
    np.testing.assert_array_equal(through_the_encoder(fused, layers, keys)[0], want)
    every = [t for v in fused.values() for t in _nodes(v)]
    by_layer: dict[Any, list[Any]] = {}
    for t in every:
        if type(t.key) is tuple:
            by_layer.setdefault(t.key[0], []).append(t)
    # each leaf Dask left as a task of its own (a lone input may be in a linear chain)
    # is in the fused graph exactly once, as itself or inlined: none lost, none twice
    leaf_names = {n for n, t in layers.items() if type(t) is LayerTemplate}
    for leaf_name in leaf_names:
        want_keys = sorted(k for k in plain if type(k) is tuple and k[0] == leaf_name)
        got_keys = sorted(t.key for t in by_layer.get(leaf_name, []))
        assert got_keys == want_keys
    for name in fused_layers(layers):
        roots = [t for t in by_layer[name] if not t.dependencies]
        assert len(roots) >= least
        if type(layers[name].leaf) is FusedReductionTemplate:
            for t in roots:
                held = [u for u in _nodes(t) if type(u.key) is tuple and u.key[0] in leaf_names]
                assert len(held) <= max_leaves


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    # (Dask's own graph loses blocks with a split of 1 on an axis: not a tree)
    split_rows=st.sampled_from([2, 3, 4]),
    split_cols=st.sampled_from([2, 3, 4]),
    least=st.integers(1, 40),
    max_leaves=st.sampled_from([4, 9, 16, 64]),
)
def test_any_tree_over_two_axes_fuses_to_the_same_result_within_the_rules(
    rows: int, cols: int, split_rows: int, split_cols: int, least: int, max_leaves: int
) -> None:
    """The same over a 2-D array reduced over both axes, whose reduction tasks list
    their inputs as lists of lists (of any fan-in per axis): the fused graph computes
    what the unfused one does, directly and through the encoder, and holds every leaf
    exactly once."""
    c = (da.ones((rows, cols), chunks=1) + 3).sum(split_every={0: split_rows, 1: split_cols})
    plain, layers, keys = materialised(c, least=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tree_fuse, "MAX_LEAVES", max_leaves)
        fused = tree_fuse.fuse_reduction_leaves(dict(plain), keys, layers, least)
    want = float(4 * rows * cols)
    np.testing.assert_array_equal(results(plain, keys)[0], want)
    assert_fused_within_rules(plain, fused, layers, keys, want, least, max_leaves)


def test_lists_of_lists_are_encoded_as_one_template_per_shape() -> None:
    """A reduction over two axes: its fused tasks take the template path too (their
    shapes tagged NESTED: lists of lists), and decode exactly as the generic
    encoder's."""
    dsk, layers, keys = materialised((da.ones((40, 40), chunks=1) + 3).sum(), least=10)
    names = fused_layers(layers)
    used = assert_encoded_alike(dsk, layers)
    specs, _, encoder = encode(dsk, layers)
    fused = [s for s in specs if type(s.key) is tuple and s.key[0] in names]
    assert fused and all(s.payload.kind == TEMPLATE for s in fused)
    assert used == encoder._layers.encoded >= len(fused)
    # a task's shape: (NESTED, its rows), a row the shapes of its inputs (at the first
    # level, how many leaves it has); tasks of 64 leaves (MAX_LEAVES) and a few of 16
    first = (NESTED, (2, 2))
    second = (NESTED, ((first, first), (first, first)))
    third = (NESTED, ((second, second), (second, second)))
    assert {n[1] for n in encoder._layers._made if type(n) is tuple} == {second, third}
    leaf = next(n for n, t in layers.items() if type(t) is LayerTemplate)
    held = [u for v in dsk.values() for u in _nodes(v) if type(u.key) is tuple and u.key[0] == leaf]
    assert len(held) == 1600  # every leaf, once
    np.testing.assert_allclose(through_the_encoder(dsk, layers, keys)[0], 6400.0)


# ------------------------------------------------------------------------ the encoder


def test_fused_tasks_take_the_template_path() -> None:
    """Every fused task is encoded from its template (of its number of leaves), and
    decodes exactly as the generic encoder's."""
    # (102 groups on the first level, 26 above: only the first fuses)
    dsk, layers, keys = materialised((da.ones((406,), chunks=1) + 3).sum(), least=30)
    (name,) = fused_layers(layers)
    fused = [k for k in dsk if type(k) is tuple and k[0] == name]
    assert len(fused) == 102  # 101 of 4 leaves, the last of 2
    used = assert_encoded_alike(dsk, layers)
    specs, _, encoder = encode(dsk, layers)
    kinds = {s.key: s.payload.kind for s in specs}
    assert all(kinds[k] == TEMPLATE for k in fused)
    assert used == encoder._layers.encoded >= len(fused)
    # two templates (4 and 2 leaves) registered for the layer
    assert {n for n in encoder._layers._made if type(n) is tuple} == {(name, 4), (name, 2)}


def test_a_fused_task_not_of_its_template_is_encoded_generically() -> None:
    dsk, layers, _ = materialised((da.ones((40,), chunks=1) + 3).sum(), least=4)
    (name,) = fused_layers(layers)
    key = (name, 0)
    node = dsk[key]
    encoder = GraphEncoder(FunctionTable(), {})
    encoder.start_graph(layers)
    assert encoder._layers.encode(name, node) is not None
    leaves = list(node.args[0].args)
    leaf = leaves[1]
    args = list(leaf.args)
    args[0] = dict(args[0])  # an equal constant, not the template's own
    leaves[1] = Task(None, leaf.func, *args, **leaf.kwargs)
    other = Task(key, node.func, Task(None, _identity_cast, *leaves, typ=list))
    assert encoder._layers.encode(name, other) is None
    assert encoder._layers.encode(name, Task(key, node.func, *leaves)) is None  # no list
    assert encoder.task_spec(key, other).key == key  # the generic path takes it


def test_fused_templates_are_planned_once_per_worker() -> None:
    """The worker decodes a fused template once (template_plan), not per task."""
    from shoal.protocol import plain_codec
    from shoal.protocol.template_plan import TemplatePlan

    dsk, layers, _ = materialised((da.ones((42,), chunks=1) + 3).sum())
    names = fused_layers(layers)
    assert len(names) == 2  # two levels: 11 tasks of 4 leaves into 3 of 16, 16 and 10
    specs, functions, _ = encode(dsk, layers)
    cache = FunctionCache()
    cache.add(functions)
    planned = 0
    for spec in specs:
        if type(spec.key) is tuple and spec.key[0] in names:
            template_id, _ = plain_codec.loads(spec.payload.data, lambda k: k)
            assert TemplatePlan.compile(cache.get(template_id), cache.get) is not None
            planned += 1
    assert planned == 3  # the upper level's tasks: the lower's are inlined in them


# ------------------------------------------------------------------------ a real cluster


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(fusing()))
def test_fused_results_through_shoal_equal_sync(
    client: Client, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted: list[Any] = []
    real = GraphEncoder.task_spec

    def spy(self: GraphEncoder, key: Any, *args: Any, **kwargs: Any) -> Any:
        submitted.append(key)
        return real(self, key, *args, **kwargs)

    monkeypatch.setattr(GraphEncoder, "task_spec", spy)
    c = fusing()[name]()
    want = expected(c)
    with dask.config.set({MIN_GROUPS_KEY: 1}):
        futures = client.compute(c)
        got = [f.result() for f in futures] if isinstance(futures, list) else [futures.result()]
        gets = dask.compute(c, scheduler=client.get)[0]
    gets = gets if isinstance(gets, list) else [gets]
    for g, w in zip([*got, *gets], [*want, *want], strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    # fewer tasks went to the scheduler than Dask's graph has
    dsk, _, _ = materialised(c, least=0)
    assert 0 < len(set(submitted)) < len(dsk)


def test_leaf_constants_that_cannot_be_copied_take_the_generic_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shoal.client.graph import layer_encode

    dsk, layers, keys = materialised((da.ones((40,), chunks=1) + 3).sum())

    def refuse(obj: Any, memo: Any = None) -> Any:
        raise TypeError("cannot copy")

    monkeypatch.setattr(layer_encode, "deepcopy", refuse)
    (name, *_) = fused_layers(layers)
    encoder = GraphEncoder(FunctionTable(), {})
    encoder.start_graph(layers)
    assert encoder._layers.encode(name, dsk[(name, 0)]) is None
    np.testing.assert_allclose(through_the_encoder(dsk, layers, keys)[0], 160.0)
