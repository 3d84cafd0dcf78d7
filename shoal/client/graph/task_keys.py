"""Structural keys for Dask tasks pickled anew in every compute, and their cache.

A task that neither a layer template nor msgpack can carry is pickled whole: a fused
subgraph (``da.ones(...).sum()``'s aggregate, every block of ``random(...) @ ...``) at
40-60 µs per task hot, several times that right after a pause. Dask materialises its
graph anew for every compute, so a notebook cell run again pickled the same tasks
again, though every object inside them was the same (functions, seeds) or equal (keys,
numbers): most of the client's encoding time on such cells.

A task's *structural key* names what its pickle is made of: the task's function and
those of the tasks inside it (by identity, kept alive by the cache, or by
:func:`~shoal.protocol.function_keys.value_key` for the partials Dask makes anew),
every key it refers to, and its plain values by exact type and value (tuples, lists
and dicts by their contents now; NumPy's ``SeedSequence`` by its state). Two tasks with
equal keys encode to payloads that decode to equal arguments, so the payload of the
first is sent for the second. Anything else (an array, a user's object, one of Dask's
container nodes, a list met twice) gives no key, and the task is pickled as before.
Looking at a task costs a fifth of pickling it.

The key is made from the values as they are at this compute, so a list changed in
place since the last one gives a new key: nothing is taken from an earlier graph that
this one does not hold.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import FunctionType
from typing import Any

from shoal.protocol.function_keys import NoKey, value_key
from shoal.protocol.serialize import TaskArgs

MAX_ENTRIES = 2048  # distinct tasks remembered (a few notebook cells' worth)
MAX_PAYLOAD = 8192  # bytes: a larger payload is not remembered (then it holds data)
_MAX_DEPTH = 24
# Taken by value with their exact type, as one token pair: ``1``, ``1.0`` and ``True``
# are equal in Python, not in a pickle.
_PLAIN = frozenset({str, int, bool, bytes, type(None)})


class PickledTasks:
    """The pickled arguments of recent tasks, by structural key (one per client)."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        from dask._task_spec import Alias, DataNode, Task, TaskRef

        self._task: Any = Task
        self._taskref: Any = TaskRef
        self._alias: Any = Alias
        self._data: Any = DataNode
        self._entries: dict[Hashable, tuple[list[Any], TaskArgs]] = {}
        self._max_entries = max_entries
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, node: Any, pinned: list[Any]) -> Hashable | None:
        """``node``'s structural key (a Dask ``Task``), or None. The objects it names by
        identity are appended to ``pinned``."""
        if type(node) is not self._task:
            return None  # Dask's container nodes pickle their own state
        mark = len(pinned)
        out: list[Any] = []
        try:
            out.append(value_key(node.func, pinned, set(), 0))
            walk = self._walk
            seen: set[int] = set()
            args = node.args
            out.append(len(args))
            for a in args:
                walk(a, out, pinned, seen, 0)
            for k, v in node.kwargs.items():
                out.append(k)
                walk(v, out, pinned, seen, 0)
        except NoKey:
            del pinned[mark:]
            return None
        return tuple(out)

    def get(self, key: Hashable) -> TaskArgs | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        self.hits += 1
        return hit[1]

    def put(self, key: Hashable, pinned: list[Any], encoded: TaskArgs) -> None:
        if len(encoded.payload.data) > MAX_PAYLOAD:
            return
        if len(self._entries) >= self._max_entries:
            self._entries.clear()  # rare: a cache of recent cells, not of every graph
        self._entries[key] = (pinned, encoded)

    def _walk(self, obj: Any, out: list[Any], pinned: list[Any], seen: set[int], depth: int) -> None:
        """Append ``obj``'s tokens to ``out``: a type (or a tag) first, then what the
        pickle holds of it, containers with their length first, so that the sequence of
        tokens reads back in one way only."""
        t = type(obj)
        if t in _PLAIN:  # most tokens: the parts of keys
            out.append(t)
            out.append(obj)
            return
        if t is FunctionType:  # by identity, held by the key itself (as value_key's)
            out.append(t)
            out.append(obj)
            return
        if depth > _MAX_DEPTH:
            raise NoKey
        walk = self._walk
        depth += 1
        if t is tuple:
            out.append(tuple)
            out.append(len(obj))
            for x in obj:
                tx = type(x)
                if tx in _PLAIN:  # (inline: a key's parts; a call per part costs more)
                    out.append(tx)
                    out.append(x)
                else:
                    walk(x, out, pinned, seen, depth)
        elif t is self._taskref:
            out.append(t)
            key = obj.key
            if type(key) is tuple:  # a key's parts, inline as above
                out.append(tuple)
                out.append(len(key))
                for x in key:
                    tx = type(x)
                    if tx in _PLAIN:
                        out.append(tx)
                        out.append(x)
                    else:
                        walk(x, out, pinned, seen, depth)
            else:
                walk(key, out, pinned, seen, depth)
        elif t is self._task:
            # Inside a fused subgraph a task travels as (key, function, args, kwargs).
            out.append(t)
            walk(obj.key, out, pinned, seen, depth)
            func = obj.func
            if type(func) is FunctionType:
                out.append(func)
            else:
                out.append(value_key(func, pinned, seen, 0))
            args = obj.args
            out.append(len(args))
            for x in args:
                walk(x, out, pinned, seen, depth)
            kwargs = obj.kwargs
            out.append(len(kwargs))
            for k, v in kwargs.items():
                out.append(k)
                walk(v, out, pinned, seen, depth)
        elif t is list or t is dict:
            if id(obj) in seen:
                raise NoKey  # one container in two places: a pickle keeps it one object
            seen.add(id(obj))
            out.append(t)
            out.append(len(obj))
            if t is list:
                for x in obj:
                    walk(x, out, pinned, seen, depth)
            else:
                for k, v in obj.items():
                    walk(k, out, pinned, seen, depth)
                    walk(v, out, pinned, seen, depth)
        elif t is self._alias:
            out.append(t)
            walk(obj.key, out, pinned, seen, depth)
            walk(obj.target, out, pinned, seen, depth)
        elif t is self._data:
            out.append(t)
            walk(obj.key, out, pinned, seen, depth)
            walk(obj.value, out, pinned, seen, depth)
        elif t.__name__ == "SeedSequence" and t.__module__ == "numpy.random.bit_generator":
            # Immutable but for its count of children spawned, which it pickles too.
            out.append(value_key(t, pinned, seen, 0))
            walk(obj.entropy, out, pinned, seen, depth)
            walk(obj.spawn_key, out, pinned, seen, depth)
            out.append(obj.pool_size)
            out.append(obj.n_children_spawned)
        else:  # a function, a float, a partial, ...: one token
            out.append(value_key(obj, pinned, seen, 0))
