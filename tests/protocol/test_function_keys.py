"""Structural keys of the function objects Dask makes anew per graph: equal keys only
for objects that pickle alike, and a function table that pickles each such function
once however many times it is made again."""

from __future__ import annotations

import functools
import operator
from typing import Any

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolz import compose, curry

from shoal.protocol import serialize
from shoal.protocol.function_keys import structural_key
from shoal.protocol.serialize import FunctionTable, function_id


def key(obj: Any) -> Any:
    return structural_key(obj, [])


def fresh_id(obj: Any) -> str:
    return function_id(cloudpickle.dumps(obj, protocol=5))


@curry
def scaled(factor: float, x: Any) -> Any:
    return factor * x


SCALE_TWO = scaled(2.0)  # long-lived, as Dask's curried functions are


class Reduction:
    @classmethod
    def chunk(cls, x: Any) -> Any:
        return x

    def method(self, x: Any) -> Any:
        return x


# What Dask builds per graph: equal objects made twice must share a key.
MADE_AGAIN = [
    lambda: functools.partial(np.sum, dtype=np.dtype("float64")),
    lambda: functools.partial(np.sum, dtype=np.dtype("float64"), axis=(0, 1), keepdims=True),
    lambda: compose(
        functools.partial(np.sum, axis=(0, 1), keepdims=False),
        functools.partial(np.concatenate, axis=[0, 1]),
    ),
    lambda: functools.partial(SCALE_TWO, 3),
    lambda: functools.partial(np.add, 1, out=None),
    lambda: Reduction.chunk,
    lambda: functools.partial(operator.getitem, ("a", b"b", None, True, -1, 2**70)),
]


@pytest.mark.parametrize("make", MADE_AGAIN)
def test_made_again_it_has_the_same_key_and_the_id_of_a_fresh_pickle(make: Any) -> None:
    first, second = make(), make()
    assert first is not second
    assert key(first) is not None and key(first) == key(second)
    table = FunctionTable()
    assert table.register(first) == fresh_id(first)
    assert table.register(second) == fresh_id(second)


def test_a_hit_pickles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    table = FunctionTable()
    calls = []
    dumps = cloudpickle.dumps

    def counting(obj: Any, *args: Any, **kwargs: Any) -> bytes:
        calls.append(obj)
        return dumps(obj, *args, **kwargs)

    monkeypatch.setattr(serialize.cloudpickle, "dumps", counting)
    fids = {table.register(functools.partial(np.sum, dtype=np.dtype("f8"))) for _ in range(5)}
    assert len(fids) == 1 and len(calls) == 1


@pytest.mark.parametrize(
    "a, b",
    [
        (functools.partial(np.sum, 1), functools.partial(np.sum, 1.0)),
        (functools.partial(np.sum, 1), functools.partial(np.sum, True)),
        (functools.partial(np.sum, 0.0), functools.partial(np.sum, -0.0)),
        (functools.partial(np.sum, (1, 2)), functools.partial(np.sum, [1, 2])),
        (functools.partial(np.sum, axis=0), functools.partial(np.sum, keepdims=0)),
        (functools.partial(np.sum, dtype="f8"), functools.partial(np.sum, dtype=np.dtype("f8"))),
        (functools.partial(np.sum, 1), functools.partial(np.prod, 1)),
        (Reduction.chunk, functools.partial(Reduction.chunk)),
    ],
)
def test_objects_that_pickle_differently_have_different_keys(a: Any, b: Any) -> None:
    assert key(a) is not None and key(b) is not None
    assert key(a) != key(b)
    assert fresh_id(a) != fresh_id(b)


def test_what_may_change_unseen_has_no_key() -> None:
    array = np.arange(3)
    shared = [1, 2]
    tagged = functools.partial(np.sum, 1)
    tagged.note = "set on it"  # type: ignore[attr-defined]
    for obj in (
        functools.partial(np.sum, array),  # an array: mutable, and large
        functools.partial(np.sum, {"a": 1}),
        functools.partial(np.sum, shared, shared),  # one list in two places
        tagged,
        Reduction().method,  # bound to an instance: its state is pickled too
        functools.partial({"a": 1}.get, "a"),  # a builtin bound to a dict: pickles it
        np.sum,  # a plain function: the identity cache's
        functools.partial(lambda x: x, object()),
    ):
        assert key(obj) is None, obj


def test_a_list_is_keyed_by_its_contents_when_registered() -> None:
    table = FunctionTable()
    axes = [0, 1]
    before = table.register(functools.partial(np.concatenate, axis=axes))
    axes.append(2)
    after = table.register(functools.partial(np.concatenate, axis=axes))
    assert before != after and after == fresh_id(functools.partial(np.concatenate, axis=axes))


def test_a_key_leaves_the_pickle_as_it_was() -> None:
    made = functools.partial(np.sum, axis=[0, 1])
    before = cloudpickle.dumps(made, protocol=5)
    assert key(made) is not None
    assert cloudpickle.dumps(made, protocol=5) == before  # (no __dict__ made by looking)
    touched = functools.partial(np.sum, axis=[0, 1])
    assert touched.__dict__ == {}  # now pickled with an empty dict, not None
    assert key(touched) != key(made)


def test_the_objects_a_key_names_are_kept_alive() -> None:
    pinned: list[Any] = []
    inner = curry(lambda x, y: x + y)
    assert structural_key(functools.partial(inner, 1), pinned) is not None
    assert inner in pinned  # its id stays its own while the key lives


def test_a_refused_key_pins_nothing() -> None:
    pinned: list[Any] = []
    assert structural_key(functools.partial(np.sum, np.sum, np.arange(2)), pinned) is None
    assert pinned == []


# plain values as a partial's arguments: every pair with equal keys pickles to one id
_values = st.recursive(
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True),
        st.booleans(),
        st.none(),
        st.text(max_size=4),
        st.binary(max_size=4),
    ),
    lambda inner: st.one_of(st.tuples(inner, inner), st.lists(inner, max_size=3)),
    max_leaves=6,
)


def _same(x: Any, y: Any) -> bool:
    """Equal with exact types, NaN equal to NaN: what a pickle cannot tell apart."""
    if type(x) is not type(y):
        return False
    if type(x) is float:
        return repr(x) == repr(y)
    if type(x) in (tuple, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return bool(x == y)


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, max_size=3), st.lists(_values, max_size=3))
def test_equal_keys_only_for_arguments_a_pickle_cannot_tell_apart(
    a: list[Any], b: list[Any]
) -> None:
    fa = functools.partial(np.sum, *a)
    fb = functools.partial(np.sum, *b)
    ka, kb = key(fa), key(fb)
    assert ka is not None and kb is not None
    assert (ka == kb) == _same(a, b)
    table = FunctionTable()
    fid_a, fid_b = table.register(fa), table.register(fb)
    assert (fid_a == fid_b) == (ka == kb)
    # the bytes behind b's id load to b's arguments
    assert _same(list(cloudpickle.loads(table.bytes[fid_b]).args), b)
