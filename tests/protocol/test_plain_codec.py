"""Task arguments as msgpack with extension types (shoal.protocol.plain_codec): tuples,
numpy scalars and dtypes round-trip exactly, without pickle, through the task-argument
functions that clients and workers use."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sizes import sized

from shoal.protocol import plain_codec
from shoal.protocol.messages import Payload
from shoal.protocol.serialize import (
    MSGPACK,
    PICKLE,
    FunctionCache,
    FunctionTable,
    SerializationError,
    dumps_task_args,
    loads_task_args,
)


class Ref:
    def __init__(self, key):
        self.key = key


REF_TYPES = {Ref: lambda r: r.key}


def roundtrip(args, kwargs=None, values=None):
    functions = FunctionTable()
    payload, deps, _ = dumps_task_args(args, kwargs or {}, REF_TYPES, functions)
    cache = FunctionCache()
    cache.add(functions.bytes)
    back = loads_task_args(payload, (values or {}).__getitem__, cache.get)
    return payload, deps, back


def assert_identical(a, b):
    """Equal, of exactly the same type all the way down, numpy scalars bit for bit."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_identical(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_identical(a[k], b[k])
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    elif isinstance(a, np.dtype):
        assert a == b and a.str == b.str
    elif isinstance(a, float):
        assert a == b and str(a) == str(b) or (a != a and b != b)  # -0.0, NaN
    else:
        assert a == b


numpy_scalar_dtypes = (
    hnp.boolean_dtypes()
    | hnp.integer_dtypes(endianness="=")
    | hnp.unsigned_integer_dtypes(endianness="=")
    | hnp.floating_dtypes(endianness="=")
    | hnp.complex_number_dtypes(endianness="=")
    | hnp.datetime64_dtypes(endianness="=")
    | hnp.timedelta64_dtypes(endianness="=")
)
numpy_scalars = numpy_scalar_dtypes.flatmap(lambda dt: hnp.arrays(dt, ()).map(lambda a: a[()]))
numpy_dtypes = (
    numpy_scalar_dtypes
    | hnp.byte_string_dtypes()
    | hnp.unicode_string_dtypes()
    | st.just(np.dtype("O"))
    | hnp.floating_dtypes(endianness=">")
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | numpy_scalars
    | numpy_dtypes
)
extended_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=5) | st.integers(-5, 5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=sized(ci=100, full=300), deadline=None)
@given(st.lists(extended_values, max_size=4), st.dictionaries(st.text(max_size=5), extended_values))
def test_tuples_numpy_scalars_and_dtypes_roundtrip_exactly_without_pickle(args, kwargs):
    payload, deps, back = roundtrip(tuple(args), kwargs)
    assert payload.kind == MSGPACK
    assert deps == []
    assert_identical(back, (tuple(args), kwargs))


@settings(max_examples=100, deadline=None)
@given(extended_values)
def test_codec_roundtrips_a_value_exactly(value):
    data = plain_codec.dumps(value, {}, [])
    assert_identical(plain_codec.loads(data, None), value)


@pytest.mark.parametrize(
    "value",
    [
        (1, (2, ("a", ())), [()]),
        np.float32(1.5),
        np.float64(-0.0),
        np.float16("nan"),
        np.int8(-3),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex64(1 - 2j),
        np.longdouble("1.1"),
        np.datetime64("2024-02-29T12:00", "m"),
        np.datetime64("NaT"),
        np.timedelta64(5, "us"),
        np.dtype("f4"),
        np.dtype(">i8"),
        np.dtype("<M8[ns]"),
        np.dtype("U7"),
        np.dtype("O"),
    ],
    ids=repr,
)
def test_examples_take_the_msgpack_path_exactly(value):
    payload, _, back = roundtrip((value,), {"kw": value})
    assert payload.kind == MSGPACK
    assert_identical(back, ((value,), {"kw": value}))


def test_references_inside_tuples_become_dependencies():
    payload, deps, back = roundtrip(((Ref("a"), (Ref(("b", 1)),)),), values={"a": 1, ("b", 1): 2})
    assert payload.kind == MSGPACK
    assert deps == ["a", ("b", 1)]
    assert_identical(back, (((1, (2,)),), {}))


@pytest.mark.parametrize(
    "value",
    [
        np.str_("s"),  # a numpy str scalar: pickled, as it has no fixed-size raw form here
        np.dtype([("a", "f4")]),  # fields: its str would lose them
        np.dtype("f4", metadata={"m": 1}),
        (1, {2}),  # a set inside a tuple
        (2**70,),
        ("\ud800",),  # a lone surrogate
        {(1, 2): "tuple key"},
    ],
    ids=repr,
)
def test_what_the_codec_cannot_carry_exactly_is_pickled(value):
    with pytest.raises(plain_codec.NotPlain):
        plain_codec.dumps(value, {}, [])
    payload, _, back = roundtrip((value,))
    assert payload.kind == PICKLE
    if isinstance(value, np.dtype):
        assert back[0][0] == value and back[0][0].metadata == value.metadata
    else:
        assert_identical(back, ((value,), {}))


def test_an_unknown_extension_is_a_clear_error():
    import msgspec

    data = msgspec.msgpack.encode([[msgspec.msgpack.Ext(99, b"")], {}])
    with pytest.raises(SerializationError, match="unknown msgpack extension 99"):
        loads_task_args(Payload(MSGPACK, data), {}.__getitem__, {}.__getitem__)
