"""Serialisation of user objects.

* Plain values (int, float, str, bytes, bool, None, and lists/dicts of them) are
  msgpack: fast, safe, and exactly round-tripped; in task arguments also tuples, numpy
  scalars and dtypes (extension types, :mod:`plain_codec`). Sets, subclasses and
  anything else go through cloudpickle (protocol 5), large buffers out of band.
* A task's arguments may also be a TEMPLATE: arguments pickled once for many tasks with
  placeholders (sent once, in the function table), and this task's values for them
  (``client/graph/templates.py``).
* Functions are serialised once, named by a content hash, and referenced from task
  payloads by that id (the *function table*); workers deserialise each id once.
* Dependencies inside arguments (futures) become key references, resolved on the
  worker against local data.

Only clients and workers call the ``loads_*`` functions; the scheduler passes
:class:`Payload` bytes through untouched.
"""

from __future__ import annotations

import copyreg
import hashlib
import io
import pickle
import sys
import types
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple

import cloudpickle
import msgspec

from shoal.protocol import plain_codec
from shoal.protocol.function_keys import structural_key
from shoal.protocol.messages import Key, Payload
from shoal.protocol.template_plan import TemplatePlan

MSGPACK = 0
PICKLE = 1
# A large bytes, bytearray or memoryview: the value is its one out-of-band buffer, sent
# from where it lies and received in place (a ``bytes`` is built by the frame decoder
# straight from the socket). ``data`` is empty for bytes, else msgpack of the type.
BYTES = 2
# Task arguments only: msgpack [template id, [slot values]]: the template (pickled
# arguments with Slot placeholders) is a function-table entry (see Slot).
TEMPLATE = 3
_KEY_EXT = plain_codec.KEY_EXT
_OOB_THRESHOLD = 64 * 1024  # buffers at least this large travel out of band
INLINE_LIMIT = 1024  # results this small ride along with the completion message

_mp_encoder = msgspec.msgpack.Encoder()
_PLAIN_SCALARS = frozenset({int, float, str, bytes, bool, type(None)})
_BYTES_TYPES = frozenset({bytes, bytearray, memoryview})


class SerializationError(TypeError):
    """A user object could not be serialised; the message names what and why."""


def _plain(obj: Any, ref_types: dict[type, Callable[[Any], Key]] | None) -> bool:
    """True when msgpack round-trips ``obj`` exactly (and every reference is known), with
    no extension types: a value's payload (task arguments use :mod:`plain_codec`)."""
    t = type(obj)
    if t in _PLAIN_SCALARS:
        return t is not int or -(1 << 63) <= obj < (1 << 64)
    if t is list:
        return all(_plain(x, ref_types) for x in obj)
    if t is dict:
        return all(
            type(k) in (str, int) and _plain(k, None) and _plain(v, ref_types)
            for k, v in obj.items()
        )
    return ref_types is not None and t in ref_types


# --- function table -----------------------------------------------------------------

try:  # functions importable by name pickle as a short reference: no table entry needed
    from cloudpickle.cloudpickle import _should_pickle_by_reference as _by_reference
except ImportError:  # pragma: no cover - older or newer cloudpickle

    def _by_reference(obj: Any) -> bool:
        return obj.__module__ != "__main__" and "<" not in obj.__qualname__


def function_id(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


class FunctionTable:
    """Client side: each distinct function object is pickled and hashed once."""

    def __init__(self, max_cached: int = 10_000):
        self._by_obj: dict[int, tuple[Any, str]] = {}  # id(func) -> (func, fid)
        # A partial, Compose or bound method Dask makes anew per graph, by what it is
        # made of (shoal/protocol/function_keys.py) -> (the objects the key names, fid)
        self._by_structure: dict[Hashable, tuple[list[Any], str]] = {}
        self.bytes: dict[str, bytes] = {}
        self._max_cached = max_cached

    def register(self, func: Any) -> str:
        hit = self._by_obj.get(id(func))
        if hit is not None and hit[0] is func:
            return hit[1]
        pinned: list[Any] = []
        key = structural_key(func, pinned)
        found = self._by_structure.get(key) if key is not None else None
        if found is not None:
            fid = found[1]
        else:
            try:
                data = cloudpickle.dumps(func, protocol=5)
            except Exception as e:
                raise SerializationError(f"cannot serialise function {func!r}: {e}") from e
            fid = function_id(data)
            self.bytes.setdefault(fid, data)
            if key is not None:
                if len(self._by_structure) >= self._max_cached:
                    self._by_structure.clear()  # rare, as below
                self._by_structure[key] = (pinned, fid)
        if len(self._by_obj) >= self._max_cached:
            self._by_obj.clear()  # rare; the content hash keeps ids stable anyway
        self._by_obj[id(func)] = (func, fid)
        return fid

    def register_template(self, pickled: bytes) -> str:
        """A task-argument template's id: it travels in the table like a function, once
        per connection, and a worker loads it (as these bytes) once."""
        data = pickle.dumps(pickled, protocol=5)
        fid = function_id(data)
        self.bytes.setdefault(fid, data)
        return fid


class FunctionCache:
    """Worker side: function bytes by id, deserialised once on first use."""

    def __init__(self) -> None:
        self._bytes: dict[str, bytes] = {}
        self._loaded: dict[str, Any] = {}

    def add(self, functions: dict[str, bytes]) -> None:
        self._bytes.update(functions)

    def __contains__(self, fid: str) -> bool:
        return fid in self._bytes

    def get(self, fid: str) -> Any:
        fn = self._loaded.get(fid)
        if fn is None:
            try:
                data = self._bytes[fid]
            except KeyError:
                raise SerializationError(f"unknown function id {fid!r}") from None
            fn = self._loaded[fid] = cloudpickle.loads(data)
        return fn


# --- task arguments -----------------------------------------------------------------


class Slot:
    """A placeholder in a task-argument template: the ``index``-th of the values that
    follow the template in its payload."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def template_body(
    body: Any,
    ref_types: dict[type, Callable[[Any], Key]],
    functions: FunctionTable,
    reducers: Reducers | None = None,
) -> TaskArgs:
    """``body`` (``(args, kwargs)`` holding :class:`Slot` placeholders) pickled, with the
    references and function ids the template itself holds (``payload.data`` is the
    pickle: registered with :meth:`FunctionTable.register_template`)."""
    deps: list[Key] = []
    funcs: list[str] = []
    payload, _ = _pickle(body, ref_types, functions, deps, False, funcs, reducers)
    return TaskArgs(payload, deps, funcs)


def template_payload(template_id: str, slots: bytes) -> bytes:
    """A TEMPLATE payload's data: msgpack ``[template id, slot values]``, the values
    already encoded (:func:`plain_codec.dumps` of a list)."""
    return b"\x92" + _mp_encoder.encode(template_id) + slots


class TableFunction:
    """A callable that travels as a function-table reference wherever it stands in a
    payload (a function inside a nested or fused task): serialised once per client,
    deserialised once per worker, however many tasks use it."""

    __slots__ = ("func",)

    def __init__(self, func: Any):
        self.func = func


Reducers = Mapping[type, Callable[[Any], Any]]


class _ReducingPickler(cloudpickle.Pickler):
    """cloudpickle with extra reducers by exact type (a compact form for a known type)."""

    reducers: Reducers = {}

    def reducer_override(self, obj: Any) -> Any:
        reduce = self.reducers.get(type(obj))
        if reduce is not None:
            return reduce(obj)
        return super().reducer_override(obj)


class _NeedsCloudpickle(Exception):
    """The fast pickler met something only cloudpickle serialises correctly."""


_by_reference_cache: dict[int, tuple[Any, bool]] = {}
_NEVER_REFERENCED = frozenset(
    {str, int, float, bytes, bool, type(None), tuple, list, dict, set, frozenset, complex}
)
_dispatch_tables: dict[int, tuple[Reducers, dict[type, Any]]] = {}


def _dispatch_table(reducers: Reducers) -> dict[type, Any]:
    """copyreg's table with ``reducers`` over it, merged once per reducers mapping."""
    hit = _dispatch_tables.get(id(reducers))
    if hit is None or hit[0] is not reducers:
        hit = _dispatch_tables[id(reducers)] = (reducers, {**copyreg.dispatch_table, **reducers})
    return hit[1]


def _pickled_by_reference(obj: Any) -> bool:
    """cloudpickle's verdict for a function or class, cached per object."""
    hit = _by_reference_cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    verdict = _by_reference(obj)
    if len(_by_reference_cache) >= 10_000:
        _by_reference_cache.clear()
    _by_reference_cache[id(obj)] = (obj, verdict)
    return verdict


def _out_of_band(buffers: list[memoryview]) -> Callable[[pickle.PickleBuffer], bool]:
    """A pickler's ``buffer_callback``: large buffers appended to ``buffers`` (sent out
    of band), small ones left in the pickle."""

    def buffer_callback(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < _OOB_THRESHOLD:
            return True
        buffers.append(raw)
        return False

    return buffer_callback


def _pickle(
    obj: Any,
    ref_types: dict[type, Callable[[Any], Key]] | None = None,
    functions: FunctionTable | None = None,
    deps: list[Key] | None = None,
    out_of_band: bool = True,
    funcs: list[str] | None = None,
    reducers: Reducers | None = None,
) -> tuple[Payload, list[memoryview]]:
    """Pickle ``obj``: references for ``ref_types`` (their keys appended to ``deps``),
    function-table entries for by-value functions and classes (ids appended to
    ``funcs``), large buffers out of band.

    With a function table, the C pickler is tried first: every by-value function or
    class reaches ``persistent_id`` and goes to the table, so what is left pickles by
    reference as plain pickle does, at several times cloudpickle's speed. Whatever it
    cannot handle is pickled again by cloudpickle."""
    buffers: list[memoryview] = []
    buffer_callback = _out_of_band(buffers)
    ndeps = len(deps) if deps is not None else 0
    nfuncs = len(funcs) if funcs is not None else 0

    def persistent_id(o: Any) -> Any:
        t = type(o)
        if t in _NEVER_REFERENCED:  # most objects: answered by one set lookup
            return None
        if t is Slot:
            return ("s", o.index)
        if ref_types and t in ref_types:
            key = ref_types[t](o)
            if deps is not None:
                deps.append(key)
            return ("k", key)
        if t is TableFunction:
            if functions is None:
                raise _NeedsCloudpickle
            fid = functions.register(o.func)
        elif t is types.FunctionType or isinstance(o, type):
            if _pickled_by_reference(o):
                return None
            if functions is None:
                raise _NeedsCloudpickle
            fid = functions.register(o)
        else:
            return None
        if funcs is not None:
            funcs.append(fid)
        return ("f", fid)

    callback = buffer_callback if out_of_band else None
    if functions is not None:
        f = io.BytesIO()
        fast = pickle.Pickler(f, protocol=5, buffer_callback=callback)
        if reducers:
            fast.dispatch_table = _dispatch_table(reducers)
        fast.persistent_id = persistent_id  # type: ignore[method-assign]
        try:
            fast.dump(obj)
            return Payload(PICKLE, f.getvalue(), len(buffers)), buffers
        except SerializationError:
            raise
        except Exception:  # e.g. a module, a code object: cloudpickle knows more
            buffers.clear()
            if deps is not None:
                del deps[ndeps:]
            if funcs is not None:
                del funcs[nfuncs:]

    f = io.BytesIO()
    cls = _ReducingPickler if reducers else cloudpickle.Pickler
    pickler = cls(f, protocol=5, buffer_callback=callback)
    if reducers:
        pickler.reducers = reducers
    if ref_types or functions is not None:

        def cloud_persistent_id(o: Any) -> Any:
            try:
                return persistent_id(o)
            except _NeedsCloudpickle:
                return None

        pickler.persistent_id = cloud_persistent_id
    try:
        pickler.dump(obj)
    except SerializationError:
        raise
    except Exception as e:
        raise SerializationError(f"cannot serialise {type(obj).__name__}: {e}") from e
    return Payload(PICKLE, f.getvalue(), len(buffers)), buffers


class TaskArgs(NamedTuple):
    payload: Payload
    deps: list[Key]  # keys referenced by the arguments, in order of appearance
    funcs: list[str]  # function-table ids referenced by the arguments (by-value functions)


def dumps_task_args(
    args: tuple,
    kwargs: dict,
    ref_types: dict[type, Callable[[Any], Key]],
    functions: FunctionTable,
    reducers: Reducers | None = None,
) -> TaskArgs:
    """Encode ``(args, kwargs)`` with the dependency keys and function ids they use."""
    plain = plain_task_args(args, kwargs, ref_types)
    if plain is not None:
        return plain
    return pickled_task_args(args, kwargs, ref_types, functions, reducers)


def plain_task_args(
    args: tuple, kwargs: dict, ref_types: dict[type, Callable[[Any], Key]]
) -> TaskArgs | None:
    """``(args, kwargs)`` as msgpack, or None when they hold something it cannot carry."""
    deps: list[Key] = []
    try:
        data = plain_codec.dumps([list(args), kwargs], ref_types, deps)
    except plain_codec.NotPlain:
        return None
    return TaskArgs(Payload(MSGPACK, data), deps, [])


def pickled_task_args(
    args: tuple,
    kwargs: dict,
    ref_types: dict[type, Callable[[Any], Key]],
    functions: FunctionTable,
    reducers: Reducers | None = None,
) -> TaskArgs:
    deps: list[Key] = []
    # The scheduler holds task payloads as one opaque piece: no out-of-band buffers.
    funcs: list[str] = []
    payload, _ = _pickle((args, kwargs), ref_types, functions, deps, False, funcs, reducers)
    return TaskArgs(payload, deps, funcs)


def loads_task_args(
    payload: Payload,
    resolve_key: Callable[[Key], Any],
    resolve_func: Callable[[str], Any],
) -> tuple[tuple, dict]:
    if payload.kind == MSGPACK:
        try:
            args, kwargs = plain_codec.loads(payload.data, resolve_key)
        except ValueError as e:  # an unknown extension
            raise SerializationError(str(e)) from None
        return tuple(args), kwargs
    if payload.kind == PICKLE:
        args, kwargs = _unpickle(payload.data, [], resolve_key, resolve_func)
        return tuple(args), kwargs
    if payload.kind == TEMPLATE:
        template_id, slots = plain_codec.loads(payload.data, resolve_key)
        template = resolve_func(template_id)
        if type(template) is TemplatePlan:  # decoded once by this worker: fill it in
            return template.fill(slots, resolve_key)
        if type(template) is not bytes:
            raise SerializationError(f"function-table entry {template_id!r} is not a template")
        args, kwargs = _unpickle(template, [], resolve_key, resolve_func, slots)
        return tuple(args), kwargs
    raise SerializationError(f"unknown payload kind {payload.kind}")


def _unpickle(
    data: bytes,
    buffers: list[memoryview],
    resolve_key: Callable[[Key], Any] | None,
    resolve_func: Callable[[str], Any] | None,
    slots: list[Any] | None = None,
) -> Any:
    if resolve_key is None:  # nothing to resolve: the same load, without a file object
        return pickle.loads(data, buffers=buffers)
    unpickler = pickle.Unpickler(io.BytesIO(data), buffers=buffers)

    def persistent_load(pid: Any) -> Any:
        kind, ref = pid
        if kind == "s" and slots is not None:
            return slots[ref]
        if kind == "k":
            return resolve_key(tuple(ref) if isinstance(ref, list) else ref)
        if kind == "f" and resolve_func is not None:
            return resolve_func(ref)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")

    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    return unpickler.load()


# --- values (results, scattered data, exceptions) -----------------------------------


def _dumps_bytes(obj: Any) -> tuple[Payload, list[memoryview]] | None:
    """A BYTES payload for a large bytes, bytearray or contiguous memoryview."""
    t = type(obj)
    if t is bytes:
        if len(obj) < _OOB_THRESHOLD:
            return None
        return Payload(BYTES, b"", 1), [memoryview(obj)]
    if t is bytearray:
        if len(obj) < _OOB_THRESHOLD:
            return None
        return Payload(BYTES, _mp_encoder.encode(["bytearray"]), 1), [memoryview(obj)]
    if t is memoryview:
        if obj.nbytes < _OOB_THRESHOLD or not obj.c_contiguous:
            return None
        info = ["memoryview", obj.format, list(obj.shape), obj.readonly]
        return Payload(BYTES, _mp_encoder.encode(info), 1), [obj.cast("B")]
    return None


def _loads_bytes(payload: Payload, buffers: list[memoryview]) -> Any:
    if len(buffers) != 1:
        raise SerializationError(f"a bytes payload carries {len(buffers)} buffers, not 1")
    buf = buffers[0]
    if not payload.data:
        obj = buf.obj
        if type(obj) is bytes and len(obj) == buf.nbytes:  # built in place on receipt
            return obj
        return buf.tobytes()
    info = msgspec.msgpack.decode(payload.data)
    if info == ["bytearray"]:
        obj = buf.obj
        if type(obj) is bytearray and len(obj) == buf.nbytes:  # received in place
            return obj
        return bytearray(buf)
    if isinstance(info, list) and len(info) == 4 and info[0] == "memoryview":
        _, fmt, shape, readonly = info
        view = memoryview(bytes(buf) if readonly else buf.cast("B"))
        if readonly and not view.readonly:  # pragma: no cover
            view = view.toreadonly()
        return view.cast(fmt, shape) if shape else view.cast(fmt)
    raise SerializationError(f"unknown bytes payload {info!r}")


def dumps_value(obj: Any) -> tuple[Payload, list[memoryview]]:
    if type(obj) in _BYTES_TYPES:
        out = _dumps_bytes(obj)
        if out is not None:
            return out
    if _plain(obj, None):
        try:
            return Payload(MSGPACK, _mp_encoder.encode(obj)), []
        except (OverflowError, UnicodeEncodeError, msgspec.EncodeError):
            pass
    if _plain_numpy(obj):
        return _pickle_plain(obj)
    return _pickle(obj)


# NumPy dtype kinds whose arrays and scalars reduce to NumPy's own functions and plain
# values only (no object, structured or user-defined dtype: those may name classes that
# only cloudpickle can send by value).
_NUMPY_PLAIN_KINDS = frozenset("biufcmMSU")


def _plain_numpy(obj: Any) -> bool:
    """Whether ``obj`` is a NumPy array (not a subclass) or scalar of a builtin dtype:
    the C pickler writes the very bytes cloudpickle would, several times faster (no
    ``reducer_override`` call per object), as numpy reduces it by itself."""
    t = type(obj)
    if t.__module__ != "numpy":  # ndarray, float64, int64, ... (not numpy.ma, matrix)
        return False
    np = sys.modules["numpy"]
    if t is not np.ndarray and not issubclass(t, np.generic):
        return False
    dtype = obj.dtype
    return type(dtype).__module__ == "numpy.dtypes" and dtype.kind in _NUMPY_PLAIN_KINDS


def _pickle_plain(obj: Any) -> tuple[Payload, list[memoryview]]:
    """``_pickle(obj)`` for an object the C pickler reduces as cloudpickle does."""
    buffers: list[memoryview] = []
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=_out_of_band(buffers))
    except Exception as e:
        raise SerializationError(f"cannot serialise {type(obj).__name__}: {e}") from e
    return Payload(PICKLE, data, len(buffers)), buffers


def loads_value(payload: Payload, buffers: list[memoryview] | None = None) -> Any:
    if payload.kind == MSGPACK:
        return msgspec.msgpack.decode(payload.data)
    if payload.kind == PICKLE:
        return _unpickle(payload.data, buffers or [], None, None)
    if payload.kind == BYTES:
        return _loads_bytes(payload, buffers or [])
    raise SerializationError(f"unknown payload kind {payload.kind}")


def loads_values(
    keys: list[Key], payloads: list[Payload], buffers: list[memoryview]
) -> tuple[dict[Key, Any], dict[Key, Exception]]:
    """Values by key, and the exception of each value that could not be loaded (its
    unpickling raised): one bad value does not sink the others. ``buffers`` are the
    out-of-band buffers of all payloads, in order."""
    out: dict[Key, Any] = {}
    errors: dict[Key, Exception] = {}
    cursor = 0
    for key, payload in zip(keys, payloads):
        try:
            out[key] = loads_value(payload, buffers[cursor : cursor + payload.nbuffers])
        except Exception as e:
            errors[key] = e
        cursor += payload.nbuffers
    return out, errors


def dumps_inline(obj: Any) -> Payload | None:
    """A payload for small plain results, or None when the value must stay remote."""
    t = type(obj)
    if t in _PLAIN_SCALARS:
        if t in (str, bytes) and len(obj) > INLINE_LIMIT:
            return None
        if t is int and not -(1 << 63) <= obj < (1 << 64):
            return None
        try:
            return Payload(MSGPACK, _mp_encoder.encode(obj))
        except UnicodeEncodeError:  # a str with lone surrogates: dumps_value pickles it
            return None
    return None


class _TooLarge(Exception):
    pass


class _BoundedWriter:
    """A pickle's file that gives up past ``limit`` bytes: pickling a large value to
    find that it is too large to inline costs about ``limit`` bytes of work, not its
    size (protocol 5 writes in frames of at most 64 KiB)."""

    __slots__ = ("parts", "size", "limit")

    def __init__(self, limit: int):
        self.parts: list[bytes] = []
        self.size = 0
        self.limit = limit

    def write(self, data: Any) -> int:
        # A buffer of at least a frame's size comes as a PickleBuffer (protocol 5, no
        # buffer_callback: written in band, without a copy), which has no len().
        n = memoryview(data).nbytes
        self.size += n
        if self.size > self.limit:
            raise _TooLarge
        self.parts.append(bytes(data))
        return n


def dumps_result_inline(obj: Any, limit: int, nbytes: int) -> Payload | None:
    """A payload (no out-of-band buffers) for a result a client wants: plain values as
    :func:`dumps_inline`, anything else pickled when that takes at most ``limit``
    bytes; None when it is larger or does not pickle (the client then fetches it, and
    the fetch reports why it cannot be sent). ``nbytes``, the :func:`sizeof` estimate,
    skips the attempt for values far too large."""
    plain = dumps_inline(obj)
    if plain is not None or limit <= 0 or nbytes > 2 * limit:
        return plain
    # The C pickler first (several times faster to set up than cloudpickle's); what it
    # cannot pickle by reference (a function or class defined in a task) goes to
    # cloudpickle, as in dumps_value.
    for pickler in (pickle.Pickler, cloudpickle.CloudPickler):
        writer = _BoundedWriter(limit)
        try:
            pickler(writer, protocol=5).dump(obj)
        except _TooLarge:
            return None
        except Exception:  # does not pickle by reference, or at all
            continue
        return Payload(PICKLE, b"".join(writer.parts))
    return None


def dumps_exception(exc: BaseException) -> Payload:
    try:
        data = cloudpickle.dumps(exc, protocol=5)
        pickle.loads(data)  # e.g. a custom __init__ with extra required arguments
        return Payload(PICKLE, data)
    except Exception:
        fallback = RuntimeError(f"{type(exc).__name__}: {exc} (the exception was not picklable)")
        return Payload(PICKLE, pickle.dumps(fallback, protocol=5))


def sizeof(obj: Any) -> int:
    """A cheap estimate of an object's memory footprint in bytes."""
    t = type(obj)
    if t.__module__.partition(".")[0] == "pandas":
        # (pandas' own __sizeof__ is a deep memory_usage: a Series per call and, for
        # some indexes, a hash table: milliseconds for every task result)
        return _pandas_sizeof(obj)
    nbytes = getattr(obj, "nbytes", None)
    if type(nbytes) is int:
        return nbytes
    if t is bytes or t is bytearray or t is str:
        return len(obj) + 33
    if t is list or t is tuple:
        return sys.getsizeof(obj) + 8 * min(len(obj), 64)
    return sys.getsizeof(obj)


_OBJECT_SAMPLE = 20  # items sampled of an object array to estimate its size


def _array_sizeof(values: Any) -> int:
    """An ndarray or a pandas extension array."""
    import numpy as np

    if isinstance(values, np.ndarray) and values.dtype == object and len(values):
        step = max(1, len(values) // _OBJECT_SAMPLE)
        sample = values[::step][:_OBJECT_SAMPLE]
        each = sum(sys.getsizeof(v) for v in sample) / len(sample)
        return int(values.nbytes + each * len(values))
    return int(values.nbytes)


def _index_sizeof(index: Any) -> int:
    import pandas as pd

    if isinstance(index, pd.RangeIndex | pd.MultiIndex):
        return int(index.nbytes)
    return _array_sizeof(index._values)


def _pandas_sizeof(obj: Any) -> int:
    import pandas as pd

    try:
        if isinstance(obj, pd.DataFrame):
            columns = sum(_array_sizeof(block.values) for block in obj._mgr.blocks)
            return columns + _index_sizeof(obj.index) + _index_sizeof(obj.columns) + 100
        if isinstance(obj, pd.Series):
            return _array_sizeof(obj._values) + _index_sizeof(obj.index) + 100
        if isinstance(obj, pd.Index):
            return _index_sizeof(obj) + 100
    except (AttributeError, TypeError):  # another pandas' internals
        pass
    return sys.getsizeof(obj)
