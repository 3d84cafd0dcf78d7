"""Task-argument templates decoded once per worker: each task only fills in its slots.

A TEMPLATE payload (``serialize.TEMPLATE``, ``client/graph/templates.py``) is a pickle with
placeholders, shared by a layer's tasks, plus each task's own values for them.
Unpickling the template again for every task rebuilds the same objects every time (for
a fused subgraph, its Dask tasks: most of a tiny task's decoding). A
:class:`TemplatePlan` unpickles it once, with markers for the placeholders, and notes
what depends on them: per task, only what holds a placeholder is built again, by the
same calls, in the order the unpickler makes them; the rest is decoded once.

Shared by the tasks of a template, as Dask shares one graph's objects among its tasks:
immutable values (numbers, strings, tuples of them, NumPy dtypes), classes and
functions, functions of the function table (already loaded once per worker), and Dask's
graph nodes (``dask._task_spec``: immutable by Dask's design, the very same objects in
every block of a layer on the client). Lists, dicts and sets are new in every task, and
any other object a call makes is made again per task, so nothing a task might mutate is
shared. A template the plan cannot follow exactly (an object built other than by a
call, an object referenced twice, an unknown opcode's result) is not planned: its
payloads are unpickled per task, as before.
"""

from __future__ import annotations

import io
import pickle
import types
from collections.abc import Callable
from typing import Any

# Immutable by type: shared by every task of a template.
_IMMUTABLE = frozenset(
    {
        int,
        float,
        complex,
        str,
        bytes,
        bool,
        type(None),
        range,
        slice,
        type(Ellipsis),
        types.FunctionType,
        types.BuiltinFunctionType,
    }
)
# Modules whose objects are immutable: Dask's graph nodes, NumPy's dtypes.
_IMMUTABLE_MODULES = frozenset({"dask._task_spec", "numpy.dtypes"})

Fill = Callable[[list[Any], Callable[[Any], Any]], Any]  # (slots, resolve_key) -> value


class _Unplannable(Exception):
    """The template holds something a plan cannot reproduce exactly."""


class _Placeholder:
    """A slot (``kind`` "s", ``ref`` its index) or a key reference ("k", the key)."""

    __slots__ = ("_shoal_kind", "_shoal_ref")

    def __init__(self, kind: str, ref: Any):
        self._shoal_kind = kind
        self._shoal_ref = ref


class _Call:
    """A call the unpickler made with a placeholder among its arguments (or whose
    result may be mutable): made again for every task."""

    __slots__ = ("_shoal_func", "_shoal_args")

    def __init__(self, func: Any, args: tuple):
        self._shoal_func = func
        self._shoal_args = args


class _Global:
    """A class or function the template names (pickle's GLOBAL): called by REDUCE, it
    records the call instead of making it when the result cannot be shared."""

    __slots__ = ("_shoal_obj",)

    def __init__(self, obj: Any):
        self._shoal_obj = obj

    def __call__(self, *args: Any) -> Any:
        if _holds_deferred(args):
            return _Call(self._shoal_obj, args)
        result = self._shoal_obj(*_unwrapped(args))
        return result if _shareable(result) else _Call(self._shoal_obj, args)


def _holds_deferred(obj: Any) -> bool:
    t = type(obj)
    if t is _Placeholder or t is _Call:
        return True
    if t is tuple or t is list or t is set or t is frozenset:
        return any(_holds_deferred(x) for x in obj)
    if t is dict:
        return any(_holds_deferred(k) or _holds_deferred(v) for k, v in obj.items())
    return False


def _unwrapped(obj: Any) -> Any:
    """``obj`` (free of placeholders) with its named globals as themselves."""
    t = type(obj)
    if t is _Global:
        return obj._shoal_obj
    if t is tuple or t is list or t is set or t is frozenset:
        return t(_unwrapped(x) for x in obj)
    if t is dict:
        return {_unwrapped(k): _unwrapped(v) for k, v in obj.items()}
    return obj


def _shareable(obj: Any) -> bool:
    t = type(obj)
    if t in _IMMUTABLE or isinstance(obj, type):
        return True
    if t is tuple or t is frozenset:
        return all(_shareable(x) for x in obj)
    return getattr(t, "__module__", None) in _IMMUTABLE_MODULES


class TemplatePlan:
    """A template decoded once: :meth:`fill` gives one task's ``(args, kwargs)``."""

    __slots__ = ("_fill",)

    def __init__(self, fill: Fill):
        self._fill = fill

    @classmethod
    def compile(cls, template: bytes, resolve_func: Callable[[str], Any]) -> TemplatePlan | None:
        """The plan of ``template`` (its function references loaded by
        ``resolve_func``), or None when it must be unpickled per task."""
        unpickler = _PlanningUnpickler(io.BytesIO(template), resolve_func)
        try:
            body = unpickler.load()
            shared_ids = unpickler.shared_ids
            constant, fill = _Compiler(shared_ids).compile(body)
        except Exception:  # anything unusual: the per-task unpickle decides (and errs)
            return None
        if constant:  # no placeholder at all: still a fresh body per task
            return None
        if type(body) is not tuple or len(body) != 2:
            return None
        return cls(fill)

    def fill(self, slots: list[Any], resolve_key: Callable[[Any], Any]) -> tuple[tuple, dict]:
        """One task's ``(args, kwargs)``: what unpickling the template with ``slots``
        in place would give."""
        args, kwargs = self._fill(slots, resolve_key)
        return tuple(args), kwargs


class _PlanningUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, resolve_func: Callable[[str], Any]):
        super().__init__(file)
        self._resolve_func = resolve_func
        self.shared_ids: set[int] = set()  # function-table objects (already shared)

    def find_class(self, module: str, name: str) -> Any:
        return _Global(super().find_class(module, name))

    def persistent_load(self, pid: Any) -> Any:
        kind, ref = pid
        if kind == "s":
            return _Placeholder("s", ref)
        if kind == "k":
            return _Placeholder("k", tuple(ref) if isinstance(ref, list) else ref)
        if kind == "f":
            obj = self._resolve_func(ref)
            self.shared_ids.add(id(obj))
            return obj
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


class _Compiler:
    """Turns a decoded body into ``(constant, value)`` or ``(False, fill)`` pieces."""

    def __init__(self, shared_ids: set[int]):
        self._shared_ids = shared_ids
        self._seen: set[int] = set()  # containers and calls: each may appear once

    def _once(self, obj: Any) -> None:
        if id(obj) in self._seen:  # one object in two places: a plan would make two
            raise _Unplannable
        self._seen.add(id(obj))

    def compile(self, obj: Any) -> tuple[bool, Any]:
        t = type(obj)
        if t is _Placeholder:
            ref = obj._shoal_ref
            if obj._shoal_kind == "s":
                return False, lambda slots, resolve: slots[ref]
            return False, lambda slots, resolve: resolve(ref)
        if t is _Global:
            return True, obj._shoal_obj
        if t is tuple or t is frozenset:
            return self._sequence(t, obj)
        if t is list or t is set:
            self._once(obj)
            return self._sequence(t, obj, fresh=True)
        if t is dict:
            self._once(obj)
            return self._dict(obj)
        if t is bytearray:  # pickle's BYTEARRAY8 (an array's in-band data): a new copy
            self._once(obj)
            return False, lambda slots, resolve: bytearray(obj)
        if t is _Call:
            self._once(obj)
            func = obj._shoal_func
            args = self._pieces(obj._shoal_args)
            return False, lambda slots, resolve: func(*[f(slots, resolve) for f in args])
        if id(obj) in self._shared_ids or _shareable(obj):
            return True, obj
        raise _Unplannable

    def _pieces(self, items: Any) -> list[Fill]:
        return [_as_fill(*self.compile(x)) for x in items]

    def _sequence(self, t: type, obj: Any, fresh: bool = False) -> tuple[bool, Any]:
        compiled = [self.compile(x) for x in obj]
        if all(constant for constant, _ in compiled):
            value = t(v for _, v in compiled)
            if not fresh:
                return True, value
            return False, lambda slots, resolve: t(value)  # a new copy per task
        if all(c or _is_slot(x) for x, (c, _) in zip(obj, compiled)):
            # only values and slots (most sequences): one comprehension, no call per item
            spec = [(False, v) if c else (True, x._shoal_ref) for x, (c, v) in zip(obj, compiled)]
            if t is list:
                return False, lambda slots, resolve: [slots[v] if s else v for s, v in spec]
            return False, lambda slots, resolve: t([slots[v] if s else v for s, v in spec])
        pieces = [_as_fill(*c) for c in compiled]
        if t is list:
            return False, lambda slots, resolve: [f(slots, resolve) for f in pieces]
        return False, lambda slots, resolve: t([f(slots, resolve) for f in pieces])

    def _dict(self, obj: dict) -> tuple[bool, Any]:
        compiled = [(self.compile(k), self.compile(v)) for k, v in obj.items()]
        if all(ck and cv for (ck, _), (cv, _) in compiled):
            value = {k: v for (_, k), (_, v) in compiled}
            return False, lambda slots, resolve: value.copy()  # a new dict per task
        pairs = [(_as_fill(*k), _as_fill(*v)) for k, v in compiled]
        return False, lambda slots, resolve: {
            fk(slots, resolve): fv(slots, resolve) for fk, fv in pairs
        }


def _is_slot(obj: Any) -> bool:
    return type(obj) is _Placeholder and obj._shoal_kind == "s"


def _as_fill(constant: bool, value: Any) -> Fill:
    if constant:
        return lambda slots, resolve: value
    return value
