"""Structural keys for the function objects Dask makes anew for every graph.

The client's function table pickles each distinct function object once
(:class:`~shoal.protocol.serialize.FunctionTable`, by identity). Dask builds some of a
graph's functions afresh every time a graph is made: ``functools.partial(np.sum,
dtype=...)`` for a reduction's chunk step, toolz ``Compose`` objects for its aggregate,
``Reduction.chunk`` bound to a class for a dataframe reduction. They are new objects in
every compute, so each compute cloudpickled them again (16-27 µs each hot, several
times that after a pause: a few percent of a small notebook compute) although their
bytes, and so their table id, are the same as last time.

A *structural key* names such an object by what its pickle is made of: the very same
functions, classes and modules (by identity, kept alive by the table) and equal plain
values of the same exact types (tuples and lists by their contents at registration).
Two objects with equal keys pickle to the same bytes, but for which of their equal
immutable values a pickle writes once and refers back to (``partial(f, s, s)`` against
two equal strings): the id found under the key is that of a function that unpickles to
an equal one. Only what is immutable enters a key by identity; anything else (an array,
a dict, a user's object, a list met twice, a partial with attributes set, a method
bound to an instance) has no key, and is pickled as before.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable
from typing import Any

# Taken by identity: the same object pickles the same way (functions by reference or
# by value, classes, modules; a function's own mutable state is the table's identity
# cache's assumption already). Builtins only when not bound to an object (``d.get``
# pickles ``d``).
_BY_IDENTITY = (types.FunctionType, types.ModuleType, type)
# Taken by value, with their exact type (``1``, ``1.0`` and ``True`` are equal in Python,
# not in a pickle).
_PLAIN = frozenset({int, str, bytes, bool, type(None)})
_MAX_DEPTH = 8


class _NoKey(Exception):
    pass


def structural_key(obj: Any, pinned: list[Any]) -> Hashable | None:
    """A key equal for two objects only if they pickle to the same bytes, or None. The
    objects the key names by identity are appended to ``pinned``: whoever keeps the key
    must keep them alive (an id is only unique while its object lives)."""
    t = type(obj)
    if t is not functools.partial and t is not types.MethodType and not _is_toolz(t, "Compose"):
        return None  # plain functions are the identity cache's; others have no key
    mark = len(pinned)
    try:
        return _part(obj, pinned, set(), 0)
    except _NoKey:
        del pinned[mark:]
        return None


def _part(obj: Any, pinned: list[Any], seen: set[int], depth: int) -> Hashable:
    if depth > _MAX_DEPTH:
        raise _NoKey
    t = type(obj)
    if t in _PLAIN:
        return (t, obj)
    if t is float:
        return (float, repr(obj))  # -0.0 == 0.0 and nan != nan; their reprs tell apart
    if t is tuple:
        return (tuple, tuple([_part(x, pinned, seen, depth + 1) for x in obj]))
    if t is functools.partial:
        # Its attributes, as its pickle has them: reading ``__dict__`` would make one
        # (and change its pickle: an empty dict where there was None).
        attributes = obj.__reduce__()[2][3]
        if attributes:
            raise _NoKey  # attributes set on it are pickled too
        keywords = tuple((k, _part(v, pinned, seen, depth + 1)) for k, v in obj.keywords.items())
        args = tuple([_part(x, pinned, seen, depth + 1) for x in obj.args])
        func = _part(obj.func, pinned, seen, depth + 1)
        return (functools.partial, func, args, keywords, attributes is None)
    if t is types.MethodType:
        if not isinstance(obj.__self__, type):
            raise _NoKey  # bound to an instance: its state is pickled too
        return (types.MethodType, _identity(obj.__func__, pinned), _identity(obj.__self__, pinned))
    if _is_toolz(t, "Compose"):
        if getattr(obj, "__dict__", None):
            raise _NoKey
        funcs = tuple([_part(f, pinned, seen, depth + 1) for f in obj.funcs])
        return (_identity(t, pinned), _part(obj.first, pinned, seen, depth + 1), funcs)
    if _is_dtype(obj):
        # NumPy's dtypes are immutable; the builtin ones are even one object each.
        return _identity(obj, pinned)
    if t is list:
        if id(obj) in seen:
            raise _NoKey  # one list in two places: a pickle keeps it one object
        seen.add(id(obj))
        return (list, tuple([_part(x, pinned, seen, depth + 1) for x in obj]))
    if (
        isinstance(obj, _BY_IDENTITY)
        or (t is types.BuiltinFunctionType and _unbound(obj))
        or _is_numpy_callable(t)
        or _is_toolz(t, "curry")  # its function and arguments are read-only properties
    ):
        return _identity(obj, pinned)
    raise _NoKey


def _unbound(builtin: Any) -> bool:
    owner = builtin.__self__  # a builtin function's is its module (or None)
    return owner is None or type(owner) is types.ModuleType


def _identity(obj: Any, pinned: list[Any]) -> Hashable:
    pinned.append(obj)
    return ("id", id(obj))


def _is_toolz(t: type, name: str) -> bool:
    # toolz's Compose (dask.array's reductions build them; its state is (first, funcs))
    # and curry (``da.ones`` is one), by name: importing this module imports no toolz.
    return t.__name__ == name and t.__module__ == "toolz.functoolz"


def _is_numpy_callable(t: type) -> bool:
    # NumPy's ufuncs (np.add) and dispatching functions (np.sum is one): immutable, and
    # pickled by reference
    return t.__module__ == "numpy" and t.__name__ in ("ufunc", "_ArrayFunctionDispatcher")


def _is_dtype(obj: Any) -> bool:
    t = type(obj)
    if t.__module__ not in ("numpy.dtypes", "numpy"):
        return False
    import numpy as np

    return isinstance(obj, np.dtype) and obj.metadata is None
