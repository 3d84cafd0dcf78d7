"""Layer templates (shoal.client.graph.templates): a task's arguments sent as a template's id
plus its slot values decode to exactly what the task's own pickle gives, on a range of
Dask graphs; what a template cannot reproduce is encoded as before."""

from __future__ import annotations

import functools
import operator

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
from dask._task_spec import DataNode, Task, execute_graph
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized

from shoal.client.graph.dask_graph import Dep, GraphEncoder, materialize
from shoal.client.graph.order import dependency_first
from shoal.client.graph.templates import GIVE_UP_MISSES, LayerTemplates
from shoal.protocol import messages as m
from shoal.protocol.calls import Build, Call
from shoal.protocol.framing import decode_body, encode_body
from shoal.protocol.serialize import (
    MSGPACK,
    PICKLE,
    TEMPLATE,
    FunctionCache,
    FunctionTable,
    loads_task_args,
)


def array_graph(*collections):
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    dsk, _ = materialize(FinalizeCompute(collections_to_expr(list(collections), True)).optimize())
    return dsk


def encode(dsk, templates):
    functions = FunctionTable()
    encoder = GraphEncoder(functions, {})
    if templates:
        encoder.start_graph()
    specs = [encoder.task_spec(k, dsk[k]) for k in dependency_first(dsk)]
    (msg,) = decode_body(encode_body([m.SubmitTasks(specs, [], dict(functions.bytes))]))
    return msg.tasks, msg.functions, encoder


class Value:
    """What a task's dependency decodes to: its key, so that arguments compare."""

    def __init__(self, key):
        self.key = key

    def __eq__(self, other):
        return type(other) is Value and other.key == self.key

    def __repr__(self):
        return f"Value({self.key!r})"


def decoded_args(specs, functions):
    cache = FunctionCache()
    cache.add(functions)
    return {s.key: loads_task_args(s.payload, Value, cache.get) for s in specs}


def assert_same(a, b):
    """Exactly the same values: types all the way down, Dask tasks field by field."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, list | tuple):
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, Task):
        assert a.key == b.key
        assert_same(a.func, b.func)
        assert_same(a.args, b.args)
        assert_same(a.kwargs, b.kwargs)
    elif isinstance(a, Call):
        assert_same(a.func, b.func)
        assert_same(a.args, b.args)
        assert_same(a.kwargs, b.kwargs)
    elif isinstance(a, Build):
        assert a.kind == b.kind
        assert_same(a.items, b.items)
    elif isinstance(a, functools.partial):
        assert_same(a.func, b.func)
        assert_same(a.args, b.args)
        assert_same(a.keywords, b.keywords)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif callable(a) and not isinstance(a, type):
        assert getattr(a, "__qualname__", repr(a)) == getattr(b, "__qualname__", repr(b))
    else:
        assert a == b or (a != a and b != b), (a, b)


def collections_to_test():
    x = da.ones((12, 10), chunks=(3, 5))
    y = da.arange(60, chunks=7)
    rs = da.random.RandomState(3).random((8, 8), chunks=4)
    return {
        "graph_scale": [(da.ones((40,), chunks=1) + 3).sum()],
        "elementwise-2d": [x * 2 + 1],
        "reduction-axis": [x.sum(axis=0), x.mean(axis=1)],
        "anom": [(x - x.mean(axis=0)).sum()],
        "transpose-matmul": [(x @ x.T).sum()],
        "slicing-rechunk": [y[3:50:2].rechunk(5) * y[:24].rechunk(5)[0]],
        "map-overlap": [y.map_overlap(lambda b: b * 2, depth=1, boundary="none")],
        "random": [rs + rs.T],
        "from-numpy": [da.from_array(np.arange(30.0).reshape(5, 6), chunks=2) ** 2],
        "astype-where": [da.where(y > 20, y, -y).astype("f4")],
        "bag": [
            db.from_sequence(range(20), npartitions=5)
            .map(lambda v: (v, v % 3))
            .fold(lambda acc, t: acc + t[0], operator.add, initial=0)
        ],
        "delayed": [dask.delayed(sum)([dask.delayed(lambda i: (i, "x"))(i) for i in range(6)])],
    }


@pytest.mark.parametrize("name", list(collections_to_test()))
def test_template_payloads_decode_to_exactly_the_pickled_arguments(name):
    dsk = array_graph(*collections_to_test()[name])
    plain_specs, plain_functions, _ = encode(dsk, templates=False)
    specs, functions, encoder = encode(dsk, templates=True)
    want = decoded_args(plain_specs, plain_functions)
    got = decoded_args(specs, functions)
    assert list(got) == list(want)
    for key in want:
        assert_same(got[key], want[key])
    by_key = {s.key: s for s in specs}
    for s in plain_specs:  # the same dependencies, whatever the encoding
        assert sorted(map(repr, by_key[s.key].deps)) == sorted(map(repr, s.deps))
    kinds = {s.payload.kind for s in specs}
    assert kinds <= {MSGPACK, PICKLE, TEMPLATE}
    if name in ("graph_scale", "elementwise-2d", "anom", "reduction-axis"):
        # fused blockwise layers: one template for the layer, the rest are hits
        assert TEMPLATE in kinds and encoder._templates.hits > encoder._templates.misses


@pytest.mark.parametrize("name", ["graph_scale", "anom", "map-overlap", "bag", "random"])
def test_graphs_encoded_with_templates_compute_what_dask_computes(name):
    dsk = array_graph(*collections_to_test()[name])
    specs, functions, _ = encode(dsk, templates=True)
    cache = FunctionCache()
    cache.add(functions)
    data = {}
    for spec in specs:
        args, kwargs = loads_task_args(spec.payload, data.__getitem__, cache.get)
        data[spec.key] = cache.get(spec.func)(*args, **kwargs)
    want = execute_graph(dict(dsk))
    for key in dsk:
        np.testing.assert_equal(data[key], want[key])


def test_template_payloads_are_small_and_the_template_travels_once():
    dsk = array_graph((da.ones((200,), chunks=1) + 3).sum())
    specs, functions, _ = encode(dsk, templates=True)
    templated = [s for s in specs if s.payload.kind == TEMPLATE]
    assert len(templated) >= 200
    template_ids = {s.funcs[0] for s in templated}
    assert len(template_ids) <= 8  # one per layer and shape (a tree level: 4 or 3 inputs)
    assert all(fid in functions for fid in template_ids)
    plain_specs, _, _ = encode(dsk, templates=False)
    pickled = {s.key: len(s.payload.data) for s in plain_specs}
    # the function table holds what the tasks share: each payload is smaller than alone
    assert all(len(s.payload.data) < pickled[s.key] for s in templated)
    assert sum(len(s.payload.data) for s in templated) < 0.5 * sum(
        pickled[s.key] for s in templated
    )


def _f(*args, **kwargs):
    return args, kwargs


def templates():
    return LayerTemplates(FunctionTable(), {Dep: lambda d: d.key})


def test_a_container_met_twice_is_not_templated():
    marker = np.arange(2)  # an object: a template is worth making
    shared = [marker, 2]
    cache = templates()
    for _ in range(3):
        assert cache.encode("fid", (shared, shared), {}) is None
    cache = templates()
    cache.encode("fid", ([marker, 2], [marker, 2]), {})  # the first of its shape
    assert cache.encode("fid", ([marker, 2], [marker, 2]), {}) is not None


def test_plain_arguments_are_left_to_plain_msgpack():
    cache = templates()
    assert cache.encode("fid", ([1, (2, "x")], Dep("k")), {"a": 1.5}) is None
    assert cache.misses == 0


def test_an_object_is_part_of_the_shape_by_identity_slots_by_value():
    cache = templates()
    big = np.arange(5)
    assert cache.encode("fid", (big, 0, Dep("w")), {"k": "u"}) is None  # met once so far
    a = cache.encode("fid", (big, 1, Dep("x")), {"k": "v"})
    b = cache.encode("fid", (big, 2, Dep("y")), {"k": "w"})
    assert (cache.hits, cache.misses) == (1, 2)
    assert a.funcs == b.funcs and a.deps == ["x"] and b.deps == ["y"]
    cache.encode("fid", (np.arange(5), 2, Dep("y")), {"k": "w"})  # another array
    assert cache.misses == 3


def test_a_shape_met_once_leaves_no_entry_in_the_function_table():
    functions = FunctionTable()
    cache = LayerTemplates(functions, {})
    for _ in range(10):  # each task with an object of its own: no layer
        assert cache.encode("fid", (np.arange(3), 1), {}) is None
    assert functions.bytes == {}


def test_a_graph_whose_tasks_share_no_shape_turns_templates_off():
    cache = templates()
    arrays = [np.arange(3) for _ in range(GIVE_UP_MISSES + 10)]
    results = [cache.encode("fid", (a,), {}) for a in arrays]
    assert not cache.enabled
    assert results[-1] is None  # encoded the usual way from then on


def test_an_object_changed_between_graphs_is_not_sent_stale():
    # The cache lives for one graph: a mutated array in the next graph is re-encoded.
    functions = FunctionTable()
    encoder = GraphEncoder(functions, {})
    arr = np.zeros(3)
    seen = []
    for fill in (1.0, 2.0):
        arr[:] = fill
        encoder.start_graph()
        specs = [
            encoder.task_spec(("t", i), Task(("t", i), np.add, DataNode(None, arr), i))
            for i in range(3)
        ]
        cache = FunctionCache()
        cache.add(dict(functions.bytes))
        (a0, i0), _ = loads_task_args(specs[2].payload, {}.__getitem__, cache.get)
        seen.append((a0[0], i0))
    assert seen == [(1.0, 2), (2.0, 2)]


@st.composite
def task_args(draw):
    pinned = [np.arange(3), functools.partial(int, base=2), np.dtype("f4"), object]
    leaf = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats()
        | st.text(max_size=6)
        | st.sampled_from(pinned)
        | st.builds(Dep, st.text(max_size=4))
        | st.builds(np.float32, st.floats(width=32))
    )
    values = st.recursive(
        leaf,
        lambda c: (
            st.lists(c, max_size=3)
            | st.lists(c, max_size=3).map(tuple)
            | st.dictionaries(st.text(max_size=3) | st.integers(0, 3), c, max_size=3)
        ),
        max_leaves=12,
    )
    return tuple(draw(st.lists(values, max_size=4))), draw(
        st.dictionaries(st.text(max_size=3), values, max_size=2)
    )


@settings(max_examples=sized(ci=60, full=200), deadline=None)
@given(st.lists(task_args(), min_size=1, max_size=4))
def test_template_decoding_equals_the_pickle_path_for_any_arguments(tasks):
    functions = FunctionTable()
    cache = LayerTemplates(functions, {Dep: lambda d: d.key})
    for args, kwargs in tasks * 2:  # each shape twice: a miss, then a hit
        encoded = cache.encode("fid", args, kwargs)
        if encoded is None:
            continue
        loader = FunctionCache()
        loader.add(dict(functions.bytes))
        back = loads_task_args(encoded.payload, Value, loader.get)
        want = (args, kwargs)
        assert_same(back, _resolved(want))


def _resolved(obj):
    """``obj`` with each Dep as the worker resolves it (here a Value of its key)."""
    if type(obj) is Dep:
        return Value(obj.key)
    if type(obj) in (list, tuple):
        return type(obj)(_resolved(x) for x in obj)
    if type(obj) is dict:
        return {k: _resolved(v) for k, v in obj.items()}
    return obj


def test_structures_alike_when_flattened_get_templates_of_their_own():
    # Shapes are flat tuples (pre-order, labels and sizes): arguments that a careless
    # flattening would confuse must each decode to exactly themselves.
    m_ = np.arange(2)
    alike = [
        (((m_, 1), 2), {}),
        ((m_, (1, 2)), {}),
        ((m_, 1, 2), {}),
        (((m_, 1, 2),), {}),
        (([m_, 1], 2), {}),
        (({"o": 1, "x": m_},), {}),
        (({"o": m_},), {}),
        (({5: m_},), {}),
        (({"5": m_},), {}),
        (({0: m_},), {}),
        ((m_,), {"o": 1}),
        ((m_, {}), {}),
        ((m_, ()), {}),
        ((m_, []), {}),
        ((m_, Dep("k")), {}),
        ((m_, "k"), {}),
    ]
    functions = FunctionTable()
    cache = LayerTemplates(functions, {Dep: lambda d: d.key})
    for args, kwargs in alike:  # each met once: the next are templated
        cache.encode("fid", args, kwargs)
    for args, kwargs in alike * 2:
        encoded = cache.encode("fid", args, kwargs)
        assert encoded is not None and encoded.payload.kind == TEMPLATE
        loader = FunctionCache()
        loader.add(dict(functions.bytes))
        assert_same(loads_task_args(encoded.payload, Value, loader.get), _resolved((args, kwargs)))
    # a slot is a slot whatever its value: {5: m} and {0: m} share one template, as do
    # (m, Dep) and (m, str); every other structure has its own
    assert len(cache._templates) == len(alike) - 2
