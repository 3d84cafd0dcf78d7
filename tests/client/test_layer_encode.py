"""Tasks of expanded layers encoded straight from the layer's template
(shoal.client.graph.layer_encode): every task decodes on a worker to exactly the arguments
the generic encoder gives it, with the same function and dependencies; graphs so
encoded compute what Dask computes, also through a real cluster; a task that is not
its layer's template with other per-block values is encoded the generic way."""

from __future__ import annotations

from typing import Any

import cloudpickle
import dask
import dask.array as da
import numpy as np
import pytest
from dask._expr import FinalizeCompute
from dask._task_spec import DataNode, Task, TaskRef, execute_graph
from dask.base import collections_to_expr
from hypothesis import given, settings

from shoal import Client
from shoal.client.graph import blockwise_expand, layer_encode
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.client.graph.order import dependency_first
from shoal.protocol import messages as m
from shoal.protocol.calls import Build, Call
from shoal.protocol.framing import decode_body, encode_body
from shoal.protocol.serialize import TEMPLATE, FunctionCache, FunctionTable, loads_task_args
from tests.client.test_blockwise_expand import _arrays, array_programs
from tests.client.test_templates import Value, collections_to_test


@pytest.fixture(autouse=True)
def every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every expanded layer gets its template, however few its blocks."""
    monkeypatch.setattr(blockwise_expand, "MIN_BLOCKS", 1)


def materialised(*collections: Any) -> tuple[dict, dict]:
    expr = FinalizeCompute(collections_to_expr(list(collections), True)).optimize()
    layers: dict[str, Any] = {}
    dsk, _ = blockwise_expand.materialize(expr, layers)
    return dsk, layers


def encode(dsk: dict, layers: dict | None) -> tuple[list[m.TaskSpec], dict, GraphEncoder]:
    functions = FunctionTable()
    encoder = GraphEncoder(functions, {})
    encoder.start_graph(layers)
    specs = [encoder.task_spec(k, dsk[k]) for k in dependency_first(dsk)]
    (msg,) = decode_body(encode_body([m.SubmitTasks(specs, [], dict(functions.bytes))]))
    return msg.tasks, msg.functions, encoder


def decoded(specs: list[m.TaskSpec], functions: dict) -> dict:
    cache = FunctionCache()
    cache.add(functions)
    return {s.key: (s.func, loads_task_args(s.payload, Value, cache.get)) for s in specs}


def assert_same(a: Any, b: Any) -> None:
    """Exactly the same values: types all the way down, functions by their pickle (a
    by-value function decodes to a new object from each function table)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, list | tuple):
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, Task | Call):
        assert getattr(a, "key", None) == getattr(b, "key", None)
        assert_same(a.func, b.func)
        assert_same(a.args, b.args)
        assert_same(a.kwargs, b.kwargs)
    elif isinstance(a, Build):
        assert a.kind == b.kind
        assert_same(a.items, b.items)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif callable(a) and not isinstance(a, type):
        assert cloudpickle.dumps(a) == cloudpickle.dumps(b), (a, b)
    else:  # objects without an equality of their own: by their pickle
        assert a == b or (a != a and b != b) or cloudpickle.dumps(a) == cloudpickle.dumps(b), (a, b)


def assert_encoded_alike(dsk: dict, layers: dict) -> int:
    """The layer path's tasks decode exactly as the generic path's; returns how many
    tasks took the layer path."""
    generic, generic_functions, _ = encode(dsk, None)
    specs, functions, encoder = encode(dsk, layers)
    want = decoded(generic, generic_functions)
    got = decoded(specs, functions)
    assert list(got) == list(want)
    for key in want:
        assert_same(got[key][1], want[key][1])
    by_key = {s.key: s for s in specs}
    for s in generic:
        assert by_key[s.key].func == s.func  # the function's content hash
        assert sorted(map(repr, by_key[s.key].deps)) == sorted(map(repr, s.deps)), s.key
    return 0 if encoder._layers is None else encoder._layers.encoded


@pytest.mark.parametrize("name", sorted(_arrays()))
def test_array_layers_decode_as_the_generic_encoding(name: str) -> None:
    dsk, layers = materialised(_arrays()[name])
    assert_encoded_alike(dsk, layers)


@pytest.mark.parametrize("name", sorted(collections_to_test()))
def test_template_collections_decode_as_the_generic_encoding(name: str) -> None:
    dsk, layers = materialised(*collections_to_test()[name])
    used = assert_encoded_alike(dsk, layers)
    if name in ("graph_scale", "elementwise-2d", "anom", "random"):
        assert used > 0, "the layer path was not taken"


@settings(max_examples=40, deadline=None)
@given(array_programs())
def test_random_programs_decode_as_the_generic_encoding(x: Any) -> None:
    dsk, layers = materialised(x)
    assert_encoded_alike(dsk, layers)


@pytest.mark.parametrize("name", ["graph_scale", "anom", "random", "elementwise-2d"])
def test_layer_encoded_graphs_compute_what_dask_computes(name: str) -> None:
    dsk, layers = materialised(*collections_to_test()[name])
    specs, functions, encoder = encode(dsk, layers)
    assert encoder._layers.encoded > 0
    assert any(s.payload.kind == TEMPLATE for s in specs)
    cache = FunctionCache()
    cache.add(functions)
    data: dict = {}
    for spec in specs:
        args, kwargs = loads_task_args(spec.payload, data.__getitem__, cache.get)
        data[spec.key] = cache.get(spec.func)(*args, **kwargs)
    want = execute_graph(dict(dsk))
    for key in dsk:
        np.testing.assert_equal(data[key], want[key])


def test_a_wrong_per_block_value_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above is sharp: a layer encoder taking each block's literal
    (here its chunk's shape) off by one fails it."""
    dsk, layers = materialised(da.ones((40,), chunks=4) + 3)
    assert assert_encoded_alike(dsk, layers) == 10
    real = layer_encode.LayerEncoder._value

    def off_by_one(self: Any, node: Any) -> Any:
        value = real(self, node)
        return tuple(v + 1 for v in value) if type(value) is tuple else value

    monkeypatch.setattr(layer_encode.LayerEncoder, "_value", off_by_one)
    with pytest.raises(AssertionError):
        assert_encoded_alike(dsk, layers)


def _layer_task(dsk: dict, layers: dict) -> tuple[Any, Any]:
    (name,) = [n for n in layers if any(type(k) is tuple and k[0] == n for k in dsk)]
    key = next(k for k in dsk if type(k) is tuple and k[0] == name)
    return key, dsk[key]


def test_a_task_not_its_layers_template_is_encoded_generically() -> None:
    dsk, layers = materialised(da.ones((40,), chunks=4) + 3)
    key, task = _layer_task(dsk, layers)
    encoder = GraphEncoder(FunctionTable(), {})
    encoder.start_graph(layers)
    assert encoder._layers.encode(key[0], task) is not None
    # a constant argument replaced by an equal object: not the template's any more
    args = list(task.args)
    constant = layers[key[0]].arg_constants[0]
    args[constant] = dict(args[constant]) if isinstance(args[constant], dict) else DataNode(None, 0)
    replaced = Task(key, task.func, *args, **task.kwargs)
    assert encoder._layers.encode(key[0], replaced) is None
    # another function, another argument count, another node type: generic
    assert encoder._layers.encode(key[0], Task(key, repr, *task.args)) is None
    assert encoder._layers.encode(key[0], Task(key, task.func, *task.args, 1)) is None
    assert encoder._layers.encode(key[0], DataNode(key, 1)) is None
    # the generic encoder still encodes it, as the generic path does
    spec = encoder.task_spec(key, replaced)
    assert spec.key == key


def test_a_per_block_value_msgpack_cannot_carry_is_encoded_generically() -> None:
    dsk, layers = materialised(da.ones((40,), chunks=4) + 3)
    key, task = _layer_task(dsk, layers)
    layer = layers[key[0]]
    encoder = GraphEncoder(FunctionTable(), {})
    encoder.start_graph(layers)
    for odd in (DataNode(None, np.arange(3)), DataNode(None, 1 << 70), TaskRef("x").__class__):
        args = list(task.args)
        args[layer.arg_slots[0]] = odd
        assert encoder._layers.encode(key[0], Task(key, task.func, *args)) is None


def test_small_layers_are_left_to_the_generic_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blockwise_expand, "MIN_BLOCKS", 11)
    _, layers = materialised(da.ones((40,), chunks=4) + 3)  # 10 blocks
    assert not layers
    _, layers = materialised(da.ones((44,), chunks=4) + 3)  # 11 blocks
    assert layers


# ------------------------------------------------------------------------ a real cluster


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(_arrays()))
def test_results_through_shoal_equal_sync(
    client: Client, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[int] = []
    real = GraphEncoder.start_graph

    def spy(self: GraphEncoder, layers: Any = None, templates: bool = True) -> None:
        real(self, layers, templates)
        used.append(len(layers or ()))

    monkeypatch.setattr(GraphEncoder, "start_graph", spy)
    (expected,) = dask.compute(_arrays()[name], scheduler="sync")
    np.testing.assert_array_equal(client.compute(_arrays()[name]).result(), expected)
    np.testing.assert_array_equal(dask.compute(_arrays()[name], scheduler=client.get)[0], expected)
    # Both computes handed the encoder the templates the expansion makes, once each (a
    # get offered to a lane and declined goes to the scheduler as encoded for the lane).
    _, layers = materialised(_arrays()[name])
    assert used == [len(layers)] * 2


def test_reduction_tasks_take_the_layer_path() -> None:
    """The graph_scale graph: every block task and every task of the reduction tree
    (but the final aggregate, fused with finalize) is encoded from its layer's template."""
    from shoal.client.graph.layer_encode import ReductionTemplate

    dsk, layers = materialised((da.ones((400,), chunks=1) + 3).sum())
    reductions = {n for n, t in layers.items() if isinstance(t, ReductionTemplate)}
    assert len(reductions) == 5  # 400 -> 100 -> 25 -> 7 -> 2 -> the aggregate
    in_layers = [
        k
        for k in dsk
        if type(k) is tuple and k[0] in layers and getattr(dsk[k], "func", 0) is layers[k[0]].func
    ]
    # all but two: the tree's 25 -> 7 level has a task of one input, linearly fused
    # with its input into a new task (under the key of the level above, kept by an Alias)
    assert len(in_layers) == 400 + 100 + 25 + 7 + 2 - 2
    assert assert_encoded_alike(dsk, layers) == len(in_layers)


def test_equal_values_of_other_types_are_not_taken_from_the_encoded_values_cache() -> None:
    """Blocks' values are encoded once per distinct value (``1`` for every block of a
    layer): ``True``, ``1.0`` and ``(1,)`` compare equal to ``1`` (or to ``(1,)``) yet
    must decode as what each block holds."""
    dsk, layers = materialised(da.ones((40,), chunks=4) + 3)
    key, task = _layer_task(dsk, layers)
    slot = layers[key[0]].arg_slots[0]
    values = [1, True, 1.0, 1, (1,), (True,), (1.0,), (1,), "1", ("1", 2), ("1", 2.0), 1]
    graph = {}
    for i, value in enumerate(values):
        args = list(task.args)
        args[slot] = DataNode(None, value)
        block = (key[0], 1000 + i)
        graph[block] = Task(block, task.func, *args)
    assert assert_encoded_alike(graph, layers) == len(values)
    specs, functions, _ = encode(graph, layers)
    got = decoded(specs, functions)
    for i, value in enumerate(values):
        assert_same(got[(key[0], 1000 + i)][1][0][slot], value)


def test_a_reduction_tasks_keys_encode_as_the_generic_codec_encodes_them() -> None:
    from shoal.client.graph.dask_graph import Dep
    from shoal.protocol import plain_codec

    keys: list[Any] = [("a", 0), "b", ("c", 1, 2), ("a", 0)]
    deps: list[Any] = []
    generic = plain_codec.dumps([tuple(Dep(k) for k in keys)], {Dep: lambda d: d.key}, deps)
    assert plain_codec.dumps_key_tuple(keys) == generic
    assert deps == keys


def test_blocks_of_the_same_values_share_only_their_frozen_payload() -> None:
    """Blocks whose values are the same (every chunk of ``ones`` has the same shape)
    are encoded once: their TaskSpecs hold the same payload, but each its own lists of
    dependencies and functions (a spec's lists are never another's)."""
    dsk, layers = materialised(da.ones(12, chunks=2) + 1)
    encoder = GraphEncoder(FunctionTable(), {})
    encoder.start_graph(layers)
    specs = [encoder.task_spec(k, dsk[k]) for k in dependency_first(dsk)]
    blocks = [s for s in specs if s.payload.kind == TEMPLATE]
    assert len(blocks) == 6 and len({id(s.payload) for s in blocks}) == 1
    assert len({(tuple(s.deps), tuple(s.funcs)) for s in blocks}) == 1
    assert len({id(s.deps) for s in blocks}) == len({id(s.funcs) for s in blocks}) == 6
