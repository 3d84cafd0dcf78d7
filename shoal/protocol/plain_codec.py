"""msgpack for task arguments, with extension types so that common values need no pickle.

Exactly round-tripped, by exact type (a subclass is not plain, and is pickled):

* ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``, ``bytes``, ``list``, and
  ``dict`` with ``str``/``int`` keys: msgpack's own types;
* ``tuple``: extension ``TUPLE_EXT`` holding the msgpack of its items (a tuple stays a
  tuple, also nested);
* numpy scalars of bool, integer, float, complex, datetime64 and timedelta64 types:
  ``NUMPY_SCALAR_EXT`` holding ``[dtype.str, raw bytes]`` (``np.float32`` stays
  ``np.float32``, with every bit of its value);
* numpy dtypes without fields, subarrays or metadata whose ``str`` rebuilds them
  (``NUMPY_DTYPE_EXT``);
* references (a type of ``ref_types``: futures, dependencies): ``KEY_EXT`` holding the
  key, resolved on the worker.

The numpy types are recognised without importing numpy (by their module's name), so
that encoding plain values never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from shoal.protocol.messages import Key

KEY_EXT = 1
TUPLE_EXT = 2
NUMPY_SCALAR_EXT = 3
NUMPY_DTYPE_EXT = 4

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_encoder = msgspec.msgpack.Encoder()
_key_decoder = msgspec.msgpack.Decoder(Key)
_SCALARS = frozenset({str, bytes, bool, float, type(None)})
# numpy scalar kinds (dtype.kind) whose raw bytes and dtype string rebuild the scalar
_NUMPY_SCALAR_KINDS = frozenset("biufcmM")


class NotPlain(Exception):
    """The value holds something this codec does not round-trip exactly."""


_SCALAR, _DTYPE = 1, 2
_numpy_kinds: dict[type, int | None] = {}


def _numpy_kind(t: type) -> int | None:
    """``_SCALAR`` for a numpy scalar type this codec takes, ``_DTYPE`` for a dtype class,
    else None; numpy is imported only for a type of one of its modules."""
    try:
        return _numpy_kinds[t]
    except KeyError:
        pass
    kind = None
    if t.__module__.partition(".")[0] == "numpy":
        import numpy as np

        if issubclass(t, np.generic) and np.dtype(t).kind in _NUMPY_SCALAR_KINDS:
            kind = _SCALAR
        elif issubclass(t, np.dtype):
            kind = _DTYPE
    _numpy_kinds[t] = kind
    return kind


def is_numpy_scalar(t: type) -> bool:
    """A numpy scalar type this codec round-trips (np.float32, np.int64, ...)."""
    return _numpy_kind(t) == _SCALAR


# by identity, not equality: dtypes that differ in metadata compare (and hash) equal
_dtype_verdicts: dict[int, tuple[Any, bool]] = {}


def _is_plain_dtype(obj: Any) -> bool:
    """A numpy dtype that ``np.dtype(obj.str)`` rebuilds exactly."""
    hit = _dtype_verdicts.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    import numpy as np

    verdict = False
    if obj.fields is None and obj.subdtype is None and obj.metadata is None:
        try:
            back = np.dtype(obj.str)
            verdict = type(back) is type(obj) and back == obj and back.str == obj.str
        except (TypeError, ValueError):
            pass
    if len(_dtype_verdicts) >= 1_000:
        _dtype_verdicts.clear()
    _dtype_verdicts[id(obj)] = (obj, verdict)
    return verdict


def to_msgpack(obj: Any, ref_types: dict[type, Callable[[Any], Key]], deps: list[Key]) -> Any:
    """``obj`` as msgspec encodes it exactly (extensions for the types above); keys of
    references appended to ``deps``. Raises :class:`NotPlain`."""
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t is int:
        if _INT_MIN <= obj <= _INT_MAX:
            return obj
        raise NotPlain
    if t is list:
        return _items(obj, ref_types, deps)
    if t is tuple:
        return msgspec.msgpack.Ext(TUPLE_EXT, _encode(_items(obj, ref_types, deps)))
    if t is dict:
        out = {}
        for k, v in obj.items():
            tk = type(k)
            if tk is not str and (tk is not int or not _INT_MIN <= k <= _INT_MAX):
                raise NotPlain
            out[k] = to_msgpack(v, ref_types, deps)
        return out
    ref = ref_types.get(t)
    if ref is not None:
        key = ref(obj)
        deps.append(key)
        return msgspec.msgpack.Ext(KEY_EXT, _encoder.encode(key))
    kind = _numpy_kind(t)
    if kind == _SCALAR:
        return msgspec.msgpack.Ext(
            NUMPY_SCALAR_EXT, _encoder.encode([obj.dtype.str, obj.tobytes()])
        )
    if kind == _DTYPE and _is_plain_dtype(obj):
        return msgspec.msgpack.Ext(NUMPY_DTYPE_EXT, _encoder.encode(obj.str))
    raise NotPlain


def _items(obj: Any, ref_types: dict[type, Callable[[Any], Key]], deps: list[Key]) -> list:
    out = []
    for x in obj:
        if type(x) in _SCALARS:  # most items: no call
            out.append(x)
        else:
            out.append(to_msgpack(x, ref_types, deps))
    return out


def _encode(obj: Any) -> bytes:
    try:
        return _encoder.encode(obj)
    except (OverflowError, UnicodeEncodeError, msgspec.EncodeError):  # e.g. a lone surrogate
        raise NotPlain from None


def dumps(obj: Any, ref_types: dict[type, Callable[[Any], Key]], deps: list[Key]) -> bytes:
    """The msgpack of ``obj``; raises :class:`NotPlain` (``deps`` then undefined)."""
    return _encode(to_msgpack(obj, ref_types, deps))


def dumps_key_tuple(keys: list[Key]) -> bytes:
    """``dumps([tuple(refs)])`` of references to ``keys`` (a reduction task's one value:
    the tuple of its inputs), without building the references; raises
    :class:`NotPlain`."""
    key_ext = [msgspec.msgpack.Ext(KEY_EXT, _encoder.encode(key)) for key in keys]
    return _encode([msgspec.msgpack.Ext(TUPLE_EXT, _encode(key_ext))])


def loads(data: bytes | memoryview, resolve_key: Callable[[Key], Any] | None) -> Any:
    """The value :func:`dumps` encoded, references given by ``resolve_key``."""

    def ext_hook(code: int, payload: memoryview) -> Any:
        if code == TUPLE_EXT:
            return tuple(msgspec.msgpack.decode(payload, ext_hook=ext_hook))
        if code == KEY_EXT and resolve_key is not None:
            return resolve_key(_key_decoder.decode(payload))
        if code == NUMPY_SCALAR_EXT:
            import numpy as np

            dtype, raw = msgspec.msgpack.decode(payload)
            return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
        if code == NUMPY_DTYPE_EXT:
            import numpy as np

            return np.dtype(msgspec.msgpack.decode(payload))
        raise ValueError(f"unknown msgpack extension {code} in a task's arguments")

    return msgspec.msgpack.decode(data, ext_hook=ext_hook)
