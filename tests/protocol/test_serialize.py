"""Serialisation of user objects: msgpack for plain values, cloudpickle otherwise,
references for dependencies and functions, out-of-band buffers for large arrays."""

from __future__ import annotations

import collections
import dataclasses
import enum
import fractions
import functools
import pickle
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.protocol import serialize as s
from shoal.protocol.framing import FrameDecoder, encode_frame
from shoal.protocol.messages import Key, KeyInMemory, Payload
from shoal.protocol.serialize import (
    INLINE_LIMIT,
    MSGPACK,
    PICKLE,
    FunctionCache,
    FunctionTable,
    SerializationError,
    dumps_exception,
    dumps_inline,
    dumps_task_args,
    dumps_value,
    loads_task_args,
    loads_value,
)

# --- helpers ---------------------------------------------------------------------------


class Ref:
    """Stands in for a Future: a reference to a task's result, by key."""

    def __init__(self, key):
        self.key = key

    def __repr__(self):
        return f"Ref({self.key!r})"


REF_TYPES: dict[type, Callable[[Any], Key]] = {Ref: lambda r: r.key}


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


class MyStr(str):
    pass


def no_key(key):
    raise AssertionError(f"unexpected dependency {key!r}")


def no_func(fid):
    raise AssertionError(f"unexpected function reference {fid!r}")


def assert_same(a, b):
    """Equal, and of exactly the same type all the way down."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(k, next(k2 for k2 in b if k2 == k))
            assert_same(a[k], b[k])
    else:
        assert a == b or (a != a and b != b)  # NaN


def roundtrip_args(args, kwargs=None, functions=None):
    kwargs = kwargs or {}
    functions = functions if functions is not None else FunctionTable()
    payload, deps, _ = dumps_task_args(args, kwargs, REF_TYPES, functions)
    cache = FunctionCache()
    cache.add(functions.bytes)
    back = loads_task_args(payload, no_key, cache.get)
    return payload, deps, back


# --- task arguments: the msgpack path ------------------------------------------------------

PLAIN_ARGS = [
    (),
    (1, 2.5, "s", b"b", None, True, False),
    (-(2**63), 2**64 - 1, 0.0, float("inf"), ""),
    ([1, [2, [3, "x"]]], {"a": 1, "b": [None]}),
    ({1: "int keys", 2: {"nested": [b""]}},),
    ("ünïcode ✓",),
]


@pytest.mark.parametrize("args", PLAIN_ARGS, ids=repr)
def test_plain_args_take_the_msgpack_path(args):
    payload, deps, back = roundtrip_args(args, {"k": [1, "two"], "n": None})
    assert payload.kind == MSGPACK
    assert payload.nbuffers == 0
    assert deps == []
    assert_same(back, (args, {"k": [1, "two"], "n": None}))


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(-5, 5), children, max_size=4)
    ),
    max_leaves=15,
)


@settings(max_examples=100)
@given(st.lists(plain_values, max_size=4), st.dictionaries(st.text(max_size=5), plain_values))
def test_plain_values_roundtrip_exactly_via_msgpack(args, kwargs):
    payload, deps, back = roundtrip_args(tuple(args), kwargs)
    assert payload.kind == MSGPACK
    assert_same(back, (tuple(args), kwargs))


any_values = st.recursive(
    plain_values
    | st.integers()
    | st.sampled_from(list(Color))
    | st.fractions()
    | st.text(max_size=5).map(MyStr),
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.frozensets(st.integers(), max_size=3)
        | st.dictionaries(st.text(max_size=3) | st.tuples(st.integers()), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=100)
@given(st.lists(any_values, max_size=3))
def test_any_values_roundtrip_exactly(args):
    payload, deps, back = roundtrip_args(tuple(args))
    assert payload.kind in (MSGPACK, PICKLE)
    assert_same(back, (tuple(args), {}))


# --- task arguments: the pickle path ------------------------------------------------------

PICKLED_ARGS = {
    "set": {1, 2, 3},
    "frozenset": frozenset({"a"}),
    "dataclass": Point(1, 2.5),
    "intenum": Color.GREEN,
    "big-int": 2**70,
    "big-negative-int": -(2**64),
    "just-above-u64": 2**64,
    "tuple-dict-key": {("a", 1): "v"},
    "float-dict-key": {1.5: "v"},
    "bool-dict-key": {True: "v"},
    "str-subclass": MyStr("s"),
    "bytearray": bytearray(b"ba"),
    "fraction": fractions.Fraction(1, 3),
    "ordereddict": collections.OrderedDict(a=1),
    "numpy-array": np.arange(12, dtype="i2").reshape(3, 4),
    "partial": functools.partial(int, base=2),
    "surrogate-str": "\ud800",
    "numpy-str-scalar": np.str_("s"),
    "structured-dtype": np.dtype([("a", "f4")]),
    "tuple-holding-a-set": (1, {2}),
}


@pytest.mark.parametrize("arg", list(PICKLED_ARGS.values()), ids=list(PICKLED_ARGS))
def test_other_args_take_the_pickle_path_and_roundtrip(arg):
    payload, deps, back = roundtrip_args((arg, 1), {"kw": arg})
    assert payload.kind == PICKLE
    assert payload.nbuffers == 0  # task payloads are one opaque piece
    assert deps == []
    if isinstance(arg, functools.partial):
        (got, one), kw = back
        assert type(got) is functools.partial and got("101") == 5 and one == 1
        return
    assert_same(back, ((arg, 1), {"kw": arg}))


def test_types_are_preserved_on_the_pickle_path():
    (t, e, n), _ = roundtrip_args(((1, 2), Color.RED, 2**100))[2]
    assert type(t) is tuple and t == (1, 2)
    assert type(e) is Color and e is Color.RED
    assert n == 2**100


def test_large_numpy_task_arg_stays_in_band():
    arr = np.random.default_rng(0).random(100_000)
    payload, _, back = roundtrip_args((arr,))
    assert payload.kind == PICKLE and payload.nbuffers == 0
    assert len(payload.data) > arr.nbytes
    assert_same(back[0][0], arr)


def test_loads_task_args_rejects_unknown_kind():
    with pytest.raises(SerializationError, match="kind"):
        loads_task_args(Payload(kind=7, data=b""), no_key, no_func)


# --- dependencies ----------------------------------------------------------------------------


def test_references_become_dependencies_on_the_msgpack_path():
    args = (Ref("a"), 1, [Ref(("x", 1)), {"k": Ref(7)}])
    payload, deps, _ = dumps_task_args(args, {"kw": Ref("b")}, REF_TYPES, FunctionTable())
    assert payload.kind == MSGPACK
    assert deps == ["a", ("x", 1), 7, "b"]
    seen = []

    def resolve_key(key):
        seen.append(key)
        return f"value-of-{key}"

    back = loads_task_args(payload, resolve_key, no_func)
    assert back == (
        ("value-of-a", 1, ["value-of-('x', 1)", {"k": "value-of-7"}]),
        {"kw": "value-of-b"},
    )
    assert seen == deps
    assert type(seen[1]) is tuple  # a tuple key stays a tuple


def test_references_become_dependencies_on_the_pickle_path():
    args = ((Ref("a"), {1, 2}), Point(1, 2.0), [Ref(("x", 1, ("y", 2)))])
    payload, deps, _ = dumps_task_args(args, {"kw": Ref(3)}, REF_TYPES, FunctionTable())
    assert payload.kind == PICKLE
    assert deps == ["a", ("x", 1, ("y", 2)), 3]
    data = {"a": "A", ("x", 1, ("y", 2)): "X", 3: "three"}
    seen = []

    def resolve_key(key):
        seen.append(key)
        return data[key]

    back = loads_task_args(payload, resolve_key, no_func)
    assert back == ((("A", {1, 2}), Point(1, 2.0), ["X"]), {"kw": "three"})
    assert seen == deps
    assert_same(seen[1], ("x", 1, ("y", 2)))


def test_reference_objects_are_not_pickled():
    class Secret(Ref):
        def __reduce__(self):
            raise AssertionError("a reference must not be pickled")

    ref_types: dict[type, Callable[[Any], Key]] = {Secret: lambda r: r.key}
    for args in [(Secret("a"),), ((Secret("a"),),)]:  # msgpack path, pickle path
        payload, deps, _ = dumps_task_args(args, {}, ref_types, FunctionTable())
        assert deps == ["a"]


def test_fallback_to_pickle_does_not_duplicate_dependencies():
    # msgpack is tried first (Ref, then a surrogate str it cannot encode): the keys
    # found on that attempt must not be counted twice.
    payload, deps, _ = dumps_task_args((Ref("a"), "\ud800"), {}, REF_TYPES, FunctionTable())
    assert payload.kind == PICKLE
    assert deps == ["a"]
    assert loads_task_args(payload, lambda k: str(k).upper(), no_func) == (("A", "\ud800"), {})


# --- functions ---------------------------------------------------------------------------


def test_lambdas_and_closures_go_to_the_function_table():
    marker = "a-distinctive-marker-1f3a"
    lam = lambda x: x + marker  # noqa: E731
    n = 41

    def closure(x):
        return x + n

    table = FunctionTable()
    args = (lam, [lam, lam], (closure,))
    payload, deps, funcs = dumps_task_args(args, {"f": lam}, REF_TYPES, table)
    assert payload.kind == PICKLE
    assert deps == []
    assert len(table.bytes) == 2
    # The task names every table entry its payload uses, so the worker gets them all.
    assert set(funcs) == set(table.bytes)
    # The body lives in the table, once; the payload only references it.
    assert marker.encode() not in payload.data
    assert sum(marker.encode() in data for data in table.bytes.values()) == 1
    assert all(len(fid) == 24 for fid in table.bytes)
    for fid in table.bytes:
        assert fid.encode() in payload.data

    cache = FunctionCache()
    cache.add(table.bytes)
    (f1, fs, (c,)), kw = loads_task_args(payload, no_key, cache.get)
    assert f1("x") == "x" + marker
    assert fs[0] is f1 and fs[1] is f1 and kw["f"] is f1  # deserialised once
    assert c(1) == 42


def test_function_cache_deserialises_each_function_once(monkeypatch):
    table = FunctionTable()
    fid = table.register(lambda: 3)
    cache = FunctionCache()
    cache.add(table.bytes)
    assert fid in cache and "nope" not in cache
    calls = []
    real_loads = s.cloudpickle.loads

    def counting_loads(data):
        calls.append(data)
        return real_loads(data)

    monkeypatch.setattr(s.cloudpickle, "loads", counting_loads)
    f = cache.get(fid)
    assert f() == 3
    assert cache.get(fid) is f
    assert len(calls) == 1


def test_function_cache_unknown_id():
    with pytest.raises(SerializationError, match="unknown function id"):
        FunctionCache().get("0" * 24)


def test_register_returns_the_same_id_and_pickles_once(monkeypatch):
    calls = []
    real_dumps = s.cloudpickle.dumps

    def counting_dumps(obj, *args, **kwargs):
        calls.append(obj)
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(s.cloudpickle, "dumps", counting_dumps)
    table = FunctionTable()

    def f(x):
        return x * 2

    ids = {table.register(f) for _ in range(5)}
    payload, _, _ = dumps_task_args((f, [f]), {"g": f}, REF_TYPES, table)
    dumps_task_args((f,), {}, REF_TYPES, table)
    assert ids == {table.register(f)}
    assert calls == [f]
    assert list(table.bytes) == list(ids)


def test_identical_functions_defined_twice_share_a_content_id():
    source = "def double(x):\n    return 2 * x\n"
    ns1, ns2 = {"__name__": "user_module"}, {"__name__": "user_module"}
    exec(source, ns1)
    exec(source, ns2)
    assert ns1["double"] is not ns2["double"]

    def make():
        return lambda x: x - 1

    table = FunctionTable()
    assert table.register(ns1["double"]) == table.register(ns2["double"])
    assert table.register(make()) == table.register(make())
    assert len(table.bytes) == 2
    # and a different function gets a different id
    assert table.register(lambda x: x - 2) not in {table.register(make())}
    assert len(table.bytes) == 3


def test_function_id_is_a_content_hash():
    assert s.function_id(b"abc") == s.function_id(b"abc")
    assert s.function_id(b"abc") != s.function_id(b"abd")


def test_unpicklable_function_raises():
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    with pytest.raises(SerializationError, match="cannot serialise function"):
        FunctionTable().register(uses_lock)
    with pytest.raises(SerializationError, match="cannot serialise function"):
        dumps_task_args(([uses_lock],), {}, REF_TYPES, FunctionTable())


# --- errors ---------------------------------------------------------------------------------


@pytest.fixture
def open_socket():
    sock = socket.socket()
    yield sock
    sock.close()


def test_unpicklable_lock_raises_serialization_error():
    with pytest.raises(SerializationError, match=r"_thread\.lock") as info:
        dumps_task_args((1, [threading.Lock()]), {}, REF_TYPES, FunctionTable())
    assert isinstance(info.value, TypeError)  # SerializationError is a TypeError


def test_unpicklable_socket_raises_serialization_error(open_socket):
    with pytest.raises(SerializationError, match="socket"):
        dumps_task_args((), {"conn": open_socket}, REF_TYPES, FunctionTable())
    with pytest.raises(SerializationError, match="socket"):
        dumps_value({"conn": open_socket})


# --- values ------------------------------------------------------------------------------------


def test_dumps_value_plain_is_msgpack():
    value = {"a": [1, 2.5, None, "s", b"b"]}
    payload, buffers = dumps_value(value)
    assert payload.kind == MSGPACK and buffers == []
    assert_same(loads_value(payload), value)


@pytest.mark.parametrize("value", [(1, 2), {1, 2}, Point(1, 2.0), 2**80, Color.RED], ids=repr)
def test_dumps_value_other_is_pickle(value):
    payload, buffers = dumps_value(value)
    assert payload.kind == PICKLE and buffers == []
    assert_same(loads_value(payload), value)


_PLAIN_NUMPY = [
    np.ones(1).sum(keepdims=True),
    np.arange(12).reshape(3, 4).T,  # not contiguous
    np.arange(10)[::3],
    np.array(["a", "bc"]),
    np.array([b"x"]),
    np.array([1 + 2j]),
    np.array(["2020-01-01"], dtype="datetime64[D]"),
    np.array([True, False]),
    np.float64(2.5),
    np.int8(-3),
    np.timedelta64(5, "s"),
    np.random.default_rng(3).random(20_000),  # out of band
]


@pytest.mark.parametrize("value", _PLAIN_NUMPY, ids=lambda v: f"{type(v).__name__}-{v.dtype}")
def test_plain_numpy_values_are_pickled_as_cloudpickle_does(value):
    payload, buffers = dumps_value(value)
    old_payload, old_buffers = s._pickle(value)  # cloudpickle's own
    assert payload == old_payload
    assert [bytes(b) for b in buffers] == [bytes(b) for b in old_buffers]
    assert_same(loads_value(payload, buffers), value)


def test_plain_numpy_values_skip_cloudpickle(monkeypatch):
    def no_cloudpickle(*args, **kwargs):
        raise AssertionError("cloudpickle used for a plain numpy value")

    monkeypatch.setattr(s.cloudpickle, "Pickler", no_cloudpickle)
    for value in _PLAIN_NUMPY:
        assert_same(loads_value(*dumps_value(value)), value)


class _MyArray(np.ndarray):
    pass


@pytest.mark.parametrize(
    "value",
    [
        np.array([lambda x: x + 1, 2], dtype=object),  # only cloudpickle sends a lambda
        np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
        np.arange(3).view(_MyArray),
        np.ma.masked_array([1, 2], mask=[0, 1]),
    ],
    ids=["object", "structured", "subclass", "masked"],
)
def test_other_numpy_values_still_go_through_cloudpickle(value, monkeypatch):
    used = []
    real = s.cloudpickle.Pickler

    def counting(*args, **kwargs):
        used.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(s.cloudpickle, "Pickler", counting)
    payload, buffers = dumps_value(value)
    assert used
    back = loads_value(payload, buffers)
    assert type(back) is type(value)
    if value.dtype == object:
        assert back[0](1) == 2 and back[1] == 2
    else:
        np.testing.assert_array_equal(back, value)


def test_large_array_travels_out_of_band():
    arr = np.random.default_rng(1).random((300, 300))
    payload, buffers = dumps_value(arr)
    assert payload.kind == PICKLE
    assert payload.nbuffers >= 1 and len(buffers) == payload.nbuffers
    assert len(payload.data) < 1000  # the data is not in the pickle
    assert sum(b.nbytes for b in buffers) == arr.nbytes
    assert_same(loads_value(payload, buffers), arr)


def test_several_large_arrays_and_small_ones():
    rng = np.random.default_rng(2)
    value: dict[str, Any] = {
        "a": rng.random(20_000),
        "b": [rng.integers(0, 9, 50_000)],
        "small": np.arange(3),
    }
    payload, buffers = dumps_value(value)
    assert payload.nbuffers == 2 == len(buffers)
    back = loads_value(payload, buffers)
    assert_same(back["a"], value["a"])
    assert_same(back["b"][0], value["b"][0])
    assert_same(back["small"], value["small"])


def test_small_array_stays_in_band():
    arr = np.arange(10)
    payload, buffers = dumps_value(arr)
    assert payload.kind == PICKLE and payload.nbuffers == 0 and buffers == []
    assert_same(loads_value(payload), arr)


def test_array_through_a_frame_is_zero_copy_and_writable():
    arr = np.arange(50_000, dtype="f8")
    payload, buffers = dumps_value(arr)
    pieces = encode_frame([KeyInMemory(key="x", value=payload)], buffers)
    [frame] = FrameDecoder().feed(b"".join(bytes(p) for p in pieces))
    [msg] = frame.messages
    assert isinstance(msg, KeyInMemory) and msg.value is not None
    back = loads_value(msg.value, frame.buffers)
    assert_same(back, arr)
    assert back.flags.writeable
    back[0] = -1.0  # writes land in the frame's buffer, not a copy
    assert np.frombuffer(frame.buffers[0], dtype="f8")[0] == -1.0


def test_pandas_frame_travels_one_buffer_per_block_and_arrives_without_a_copy():
    # A frame's columns go as its blocks' own memory (one out-of-band buffer per block,
    # nothing in the pickle), and the receiver's frame is built on the received buffers:
    # a worker-to-worker transfer of a frame costs what one of an array of its size does.
    pd = pytest.importorskip("pandas")
    rows = 40_000
    frame = pd.DataFrame(
        {
            "a": np.arange(rows, dtype="f8"),
            "b": np.full(rows, 2.5),
            "i": np.arange(rows, dtype="i8"),
        }
    )
    payload, buffers = dumps_value(frame)
    blocks = frame._mgr.blocks
    assert payload.kind == PICKLE and payload.nbuffers == len(blocks) == 2 == len(buffers)
    assert sum(b.nbytes for b in buffers) == 3 * 8 * rows
    assert len(payload.data) < 2000  # the data is not in the pickle
    pieces = encode_frame([KeyInMemory(key="x", value=payload)], buffers)
    [received] = FrameDecoder().feed(b"".join(bytes(p) for p in pieces))
    [msg] = received.messages
    assert isinstance(msg, KeyInMemory) and msg.value is not None
    back = loads_value(msg.value, received.buffers)
    pd.testing.assert_frame_equal(back, frame)
    for block in back._mgr.blocks:
        assert any(
            np.shares_memory(block.values, np.frombuffer(buf, dtype="u1"))
            for buf in received.buffers
        ), "a block of the received frame was copied out of its buffer"


def test_loads_value_rejects_unknown_kind():
    with pytest.raises(SerializationError, match="kind"):
        loads_value(Payload(kind=9, data=b""))


# --- inline results ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [0, -1, 2**64 - 1, -(2**63), 1.5, True, None, "", "s" * INLINE_LIMIT, b"b" * INLINE_LIMIT],
    ids=lambda v: repr(v)[:20],
)
def test_dumps_inline_small_plain_scalars(value):
    payload = dumps_inline(value)
    assert payload is not None and payload.kind == MSGPACK
    assert_same(loads_value(payload), value)


@pytest.mark.parametrize(
    "value",
    [
        "s" * (INLINE_LIMIT + 1),
        b"b" * (INLINE_LIMIT + 1),
        2**64,
        -(2**63) - 1,
        [1],
        {"a": 1},
        (1,),
        {1},
        MyStr("s"),
        Color.RED,
        np.float64(1.0),
        np.arange(3),
        Point(1, 2.0),
        "\ud800",
    ],
    ids=lambda v: repr(v)[:20],
)
def test_dumps_inline_refuses_everything_else(value):
    assert dumps_inline(value) is None


# --- exceptions ------------------------------------------------------------------------------------


def test_dumps_exception_roundtrip():
    exc = KeyError("missing", 3)
    back = loads_value(dumps_exception(exc))
    assert type(back) is KeyError and back.args == ("missing", 3)


def test_dumps_exception_local_class():
    class LocalError(ValueError):
        pass

    back = loads_value(dumps_exception(LocalError("boom")))
    assert type(back).__name__ == "LocalError" and isinstance(back, ValueError)
    assert back.args == ("boom",)


def test_unpicklable_exception_becomes_runtime_error():
    exc = ValueError("boom")
    exc.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        pickle.dumps(exc)
    back = loads_value(dumps_exception(exc))
    assert type(back) is RuntimeError
    assert "ValueError: boom" in str(back)
    assert "not picklable" in str(back)


def test_exception_that_cannot_be_unpickled_becomes_runtime_error():
    class NeedsTwo(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a} and {b}")

    back = loads_value(dumps_exception(NeedsTwo(1, 2)))
    assert type(back) is RuntimeError
    assert "NeedsTwo: 1 and 2" in str(back)


# --- sizeof ------------------------------------------------------------------------------------------


def test_sizeof():
    assert s.sizeof(np.zeros(1000)) == 8000
    assert s.sizeof(b"x" * 100) > 100
    assert s.sizeof("x" * 100) > 100
    assert s.sizeof(list(range(1000))) > 1000
    assert s.sizeof(object()) > 0


def test_sizeof_of_pandas_objects_counts_their_data():
    pd = pytest.importorskip("pandas")
    n = 10_000
    frame = pd.DataFrame(
        {"i": np.arange(n), "f": np.zeros(n), "s": pd.array(["abc"] * n, dtype="string")},
        index=pd.date_range("2000", periods=n, freq="s"),
    )
    numeric = 8 * n * 2 + 8 * n  # two columns and the index
    assert numeric + 3 * n < s.sizeof(frame) < numeric + 20 * n
    objects = pd.Series(["x" * 100] * n, dtype=object)
    assert s.sizeof(objects) > 100 * n  # the strings, not only their pointers
    assert s.sizeof(frame["i"]) >= 8 * n
    assert s.sizeof(pd.Index(np.arange(n))) >= 8 * n
    assert 0 < s.sizeof(pd.RangeIndex(n)) < 1000


# --- results inline for a client that wants them ---------------------------------------------

INLINE_LIMIT_64K = 64 * 1024


def inline(obj: Any, limit: int = INLINE_LIMIT_64K) -> Payload | None:
    return s.dumps_result_inline(obj, limit, s.sizeof(obj))


@pytest.mark.parametrize(
    "value",
    [np.float64(1.5), np.int8(-3), np.datetime64("2026-01-02"), np.arange(10), (1, "a"), {1}],
)
def test_a_small_result_of_any_type_goes_inline_and_loads_back_exactly(value: Any):
    payload = inline(value)
    assert payload is not None and payload.kind == s.PICKLE and payload.nbuffers == 0
    got = s.loads_value(payload)
    assert type(got) is type(value)
    assert np.array_equal(got, value) if isinstance(value, np.ndarray) else got == value


def test_plain_results_stay_msgpack():
    for value in (1, 2.5, "text", b"raw", None, True):
        payload = inline(value)
        assert payload is not None and payload.kind == s.MSGPACK
        assert s.loads_value(payload) == value


def test_the_inline_limit_is_on_the_serialised_size():
    assert inline(b"x" * (63 * 1024)) is not None
    assert inline(b"x" * (65 * 1024)) is None
    assert inline(np.zeros(63 * 1024 // 8)) is not None
    assert inline(np.zeros(65 * 1024 // 8)) is None
    # small estimate, large pickle: stopped by the size of what was written
    many = [str(i) * 100 for i in range(2000)]
    assert s.sizeof(many) < INLINE_LIMIT_64K and inline(many) is None
    assert inline(np.float64(1.0), limit=0) is None  # off: only plain values
    assert inline(7, limit=0) is not None


def test_a_large_buffer_under_the_limit_goes_inline():
    # The pickler hands a buffer of a frame's size or more (64 KiB) to the writer as a
    # PickleBuffer: 80 KB, the result of ``(x.T @ x)`` for 100 columns, used to be
    # refused for that (a TypeError taken for "does not pickle") and fetched instead.
    gram = np.arange(100 * 100, dtype=np.float64).reshape(100, 100)
    payload = inline(gram, limit=256 * 1024)
    assert payload is not None and payload.nbuffers == 0
    assert np.array_equal(s.loads_value(payload), gram)
    assert inline(np.zeros(257 * 1024 // 8), limit=256 * 1024) is None


def test_a_result_that_does_not_pickle_is_left_to_the_fetch():
    assert inline(threading.Lock()) is None


def test_a_function_made_in_a_task_goes_by_value():
    def local(x: int) -> int:
        return x + 1

    payload = inline(local)
    assert payload is not None and s.loads_value(payload)(1) == 2
