"""Dask graphs as shoal tasks.

A Dask collection or graph (an expression, a ``HighLevelGraph`` or a plain dict; Dask's
``Task``/``Alias``/``DataNode``/``TaskRef`` spec, nested containers, fused subgraphs,
legacy tuples through Dask's own converter) becomes one :class:`TaskSpec` per key:

* the task's function goes to the client's function table (serialised once per
  distinct function, sent once per connection), also when it is a ``functools.partial``
  (taken apart) or inside a fused subgraph or a nested call (a by-value function in the
  payload is replaced by its table id);
* its arguments become the payload, each dependency replaced by a reference that the
  worker resolves against local data; inline tasks become :mod:`shoal.protocol.calls`
  objects evaluated on the worker; everything else is passed through untouched;
* priorities come from ``dask.order`` (the order of submission), annotations from the
  graph's layers and ``dask.annotate``.

The scheduler sees keys, dependencies and opaque bytes only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from shoal.protocol import messages as m
from shoal.protocol.calls import Build, Call, identity, rebuild_task, run_nested
from shoal.protocol.messages import Key, check_key
from shoal.protocol.serialize import (
    FunctionTable,
    TableFunction,
    TaskArgs,
    pickled_task_args,
    plain_task_args,
)

if TYPE_CHECKING:
    from shoal.client.graph.order import GraphIndex

ANNOTATIONS = ("priority", "retries", "workers", "resources", "allow_other_workers", "duration")


class Dep:
    """A dependency's place in a task's arguments: the worker puts its value there."""

    __slots__ = ("key",)

    def __init__(self, key: Key):
        self.key = key


def _dep_key(dep: Dep) -> Key:
    return dep.key


# ------------------------------------------------------------------------ materialising


def materialize(graph: Any) -> tuple[dict[Key, Any], dict[str, dict[Key, Any]]]:
    """``(dsk, annotations by type)`` for an expression, a HighLevelGraph or a dict;
    every value of ``dsk`` is a Dask ``GraphNode``."""
    from dask._expr import Expr, HLGExpr, LLGExpr
    from dask.highlevelgraph import HighLevelGraph

    from shoal.client.graph.reduction_expand import convert_legacy_graph

    if isinstance(graph, HighLevelGraph):
        graph = HLGExpr(graph)
    elif isinstance(graph, Mapping):
        graph = LLGExpr(dict(graph))
    if not isinstance(graph, Expr):
        raise TypeError(
            f"expected a Dask graph (an expression, HighLevelGraph or dict), got "
            f"{type(graph).__name__}"
        )
    dsk = graph.__dask_graph__()
    annotations = graph.__dask_annotations__()
    return convert_legacy_graph(dsk), annotations  # (Dask's, with shoal's fast paths)


def cull(dsk: Mapping[Key, Any], keys: Iterable[Key]) -> dict[Key, Any]:
    """The part of ``dsk`` that ``keys`` need; keys outside ``dsk`` are left to the caller."""
    out: dict[Key, Any] = {}
    stack = list(keys)
    while stack:
        key = stack.pop()
        if key in out:
            continue
        node = dsk.get(key)
        if node is None:
            continue
        out[key] = node
        stack.extend(node.dependencies)
    return out


def alias_targets(dsk: Mapping[Key, Any], keys: Iterable[Key]) -> dict[Key, Key]:
    """For each of ``keys`` that is an ``Alias`` (Dask's finalize step often is one), the
    key in ``dsk`` whose value it names, through chains of aliases."""
    from dask._task_spec import Alias

    out: dict[Key, Key] = {}
    for key in keys:
        target: Key = key
        node: Any = dsk.get(key)
        seen = {key}
        while isinstance(node, Alias) and node.target in dsk and node.target not in seen:
            target = node.target  # type: ignore[assignment]  # dask types keys its own way
            seen.add(target)
            node = dsk[target]
        if target != key:
            out[key] = target
    return out


def skip_aliases(dsk: dict[Key, Any], keep: Iterable[Key]) -> dict[Key, Any]:
    """``dsk`` without its ``Alias`` nodes (but those of ``keep``): their dependents
    refer to the aliased key itself. An alias run as a task costs a scheduler round trip
    and a level of the graph for an identity (Dask's array reductions make one per
    chunk). ``dsk`` itself is returned when it has none, or when a dependent cannot be
    rewritten exactly (its dependencies after the rewrite are not the expected ones)."""
    from dask._task_spec import Alias

    kept = set(keep)
    targets: dict[Key, Key] = {
        key: node.target  # type: ignore[misc]  # dask types keys its own way
        for key, node in dsk.items()
        if type(node) is Alias and key not in kept and node.target != key
    }
    if not targets:
        return dsk
    subs: dict[Key, Key] = {}
    for key in targets:
        final: Key = key
        seen = set()
        while final in targets:
            if final in seen:
                return dsk  # a cycle of aliases: check_graph names it
            seen.add(final)
            final = targets[final]
        subs[key] = final
    out: dict[Key, Any] = {}
    for key, node in dsk.items():
        if key in subs:
            continue
        deps = node.dependencies
        if any(d in subs for d in deps):
            node = node.substitute({d: subs[d] for d in deps if d in subs})
            if set(node.dependencies) != {subs.get(d, d) for d in deps}:
                return dsk
        out[key] = node
    return out


def check_graph(dsk: Mapping[Key, Any], external: Callable[[Key], bool]) -> GraphIndex:
    """Refuse a graph that depends on a key it neither has nor ``external`` knows, or
    that has a cycle; the error names the keys. Returns the graph's
    :class:`~shoal.client.graph.order.GraphIndex` (for its order)."""
    from shoal.client.graph.order import GraphIndex

    # On positions (Dask's tuple keys are hashed anew at every lookup), one pass over
    # the dependencies for both checks, shared with the order.
    index = GraphIndex(dsk)
    keys, dependents = index.keys, index.dependents
    missing = {dk for dk in index.outside if not external(dk)}
    if missing:
        shown = ", ".join(sorted(map(repr, missing))[:20])
        raise ValueError(
            f"the graph depends on {len(missing)} key(s) that exist nowhere (not in the graph "
            f"and not held by this client): {shown}"
        )
    pending = [len(deps) for deps in index.deps_of]
    # Kahn's algorithm: whatever never becomes free is on or after a cycle.
    free = [i for i, n in enumerate(pending) if n == 0]
    freed = 0
    while free:
        i = free.pop()
        freed += 1
        for d in dependents[i]:
            pending[d] -= 1
            if pending[d] == 0:
                free.append(d)
    if freed < len(keys):
        stuck = {keys[i]: n for i, n in enumerate(pending) if n}
        on_cycle = _cycle_keys(dsk, stuck)
        shown = " -> ".join(map(repr, on_cycle))
        raise ValueError(f"the graph has a dependency cycle: {shown}")
    return index


def topological(dsk: Mapping[Key, Any], priorities: Mapping[Key, int]) -> list[Key]:
    """The keys in priority order (``dask.order``'s), moved where needed so that every
    key comes after its dependencies in the graph."""
    ordered = sorted(dsk, key=priorities.__getitem__)
    rank = {key: i for i, key in enumerate(ordered)}
    if all(
        rank[dk] < i for i, key in enumerate(ordered) for dk in dsk[key].dependencies if dk in rank
    ):
        return ordered  # the usual case: Dask's order already runs dependencies first
    out: list[Key] = []
    placed: set[Key] = set()
    for key in ordered:  # depth first through unplaced dependencies, in priority order
        stack = [key]
        while stack:
            k = stack[-1]
            if k in placed:
                stack.pop()
                continue
            todo = [dk for dk in dsk[k].dependencies if dk in rank and dk not in placed]
            if todo:
                stack.extend(sorted(todo, key=rank.__getitem__, reverse=True))
                continue
            stack.pop()
            placed.add(k)
            out.append(k)
    return out


def _cycle_keys(dsk: Mapping[Key, Any], pending: Mapping[Key, int]) -> list[Key]:
    """One cycle among the keys Kahn's algorithm could not free, in dependency order."""
    key = next(iter(pending))
    seen: dict[Key, int] = {}
    path: list[Key] = []
    while key not in seen:
        seen[key] = len(path)
        path.append(key)
        key = next(dk for dk in dsk[key].dependencies if dk in pending)
    return [*path[seen[key] :], key]


# ------------------------------------------------------------------------ encoding


class GraphEncoder:
    """Turns Dask graph nodes into task specs for one client."""

    def __init__(self, functions: FunctionTable, ref_types: dict[type, Callable[[Any], Key]]):
        self.functions = functions
        self.ref_types = {**ref_types, Dep: _dep_key}
        from dask._task_spec import Alias, DataNode, NestedContainer, Task, TaskRef

        # Dask's classes, imported here so that importing shoal does not import dask.
        self._alias: Any = Alias
        self._data: Any = DataNode
        self._task: Any = Task
        self._container: Any = NestedContainer
        self._taskref: Any = TaskRef
        self._nested = False  # the node being encoded has an inline task
        # Tasks of a fused subgraph travel as (key, function, args, kwargs), their
        # functions by function-table reference.
        self._reducers: dict[type, Any] = {Task: _reduce_task}
        self._templates: Any = None  # a graph's LayerTemplates (start_graph)
        self._layers: Any = None  # a graph's LayerEncoder (start_graph)

    def start_graph(self, layers: dict[str, Any] | None = None, templates: bool = True) -> None:
        """Encode the next tasks with a fresh template cache: one per graph, as its
        objects may have changed since the last graph (see templates.py). ``layers``:
        the templates of the graph's expanded layers (``layer_encode``), by name.
        Without ``templates`` (a graph too small to have layers), each task is encoded
        alone."""
        self._layers = None
        if not templates:
            self._templates = None
            return
        from shoal.client.graph.layer_encode import LayerEncoder
        from shoal.client.graph.templates import LayerTemplates

        self._templates = LayerTemplates(self.functions, self.ref_types, self._reducers)
        if layers:
            self._layers = LayerEncoder(
                layers, self.functions, self.ref_types, self._reducers, self, Dep
            )

    def task_spec(
        self,
        key: Key,
        node: Any,
        priority: int = 0,
        retries: int = 0,
        restrictions: m.TaskRestrictions | None = None,
    ) -> m.TaskSpec:
        func: Any
        args: tuple
        kwargs: dict
        if self._layers is not None and type(key) is tuple:
            fast = self._layers.encode(key[0], node)
            if fast is not None:
                return self._spec(key, fast[0], fast[1], priority, retries, restrictions)
        if type(node) is self._task:  # the usual node, before the isinstance chain
            func, args, kwargs = self._task_call(node)
        elif isinstance(node, self._alias):
            func, args, kwargs = identity, (Dep(node.target),), {}
        elif isinstance(node, self._data):
            func, args, kwargs = identity, (node.value,), {}
        elif isinstance(node, self._task):
            func, args, kwargs = self._task_call(node)
        else:
            raise TypeError(f"the graph's value for {key!r} is not a task: {node!r}")
        fid = self.functions.register(func)
        # Templates first: their walk also finds the plain tasks, for which it gives up.
        encoded = None
        if self._templates is not None:
            encoded = self._templates.encode(fid, args, kwargs)
        if encoded is None:
            encoded = plain_task_args(args, kwargs, self.ref_types)
        if encoded is None:
            encoded = pickled_task_args(
                args, kwargs, self.ref_types, self.functions, self._reducers
            )
        return self._spec(key, fid, encoded, priority, retries, restrictions)

    def _spec(
        self,
        key: Key,
        fid: str,
        encoded: TaskArgs,
        priority: int,
        retries: int,
        restrictions: m.TaskRestrictions | None,
    ) -> m.TaskSpec:
        payload, deps, funcs = encoded
        try:
            return m.TaskSpec(
                key,
                fid,
                payload,
                list(dict.fromkeys(deps)) if len(deps) > 1 else list(deps),
                priority=priority,
                retries=retries,
                funcs=list(dict.fromkeys(funcs)) if len(funcs) > 1 else list(funcs),
                restrictions=restrictions,
            )
        except ValueError:
            # TaskSpec checks its key (as decoding does): once per task, not twice. A
            # bad one is named as everywhere on the client, by a TypeError.
            check_key(key)
            raise

    def _task_call(self, node: Any) -> tuple[Any, tuple, dict]:
        """``(func, args, kwargs)`` of a Dask ``Task``, its arguments as :meth:`_arg`
        makes them."""
        self._nested = False
        arg = self._arg
        args = tuple([arg(a) for a in node.args])
        kwargs = {k: arg(v) for k, v in node.kwargs.items()} if node.kwargs else {}
        func = node.func
        if self._nested:
            return run_nested, (Call(TableFunction(func), args, kwargs),), {}
        # A partial is taken apart, as for submit: one table entry for its function,
        # however many different partials of it the graph holds.
        while isinstance(func, functools.partial):
            args = func.args + args
            kwargs = {**func.keywords, **kwargs}
            func = func.func
        return func, args, kwargs

    def _arg(self, a: Any) -> Any:
        """An argument as the task will see it: dependencies become references, Dask's
        containers and inline tasks become values or nested calls. Anything else is the
        user's own value and is passed on as it is, not looked into."""
        t = type(a)
        if t is self._taskref:
            return Dep(a.key)
        if t in _NOT_DASK:  # most arguments: no isinstance against Dask's ABC classes
            return a
        if t is self._data:
            return a.value
        if t is self._alias:
            return Dep(a.target)
        if isinstance(a, self._alias):
            return Dep(a.target)
        if isinstance(a, self._data):
            return a.value
        if isinstance(a, self._container):
            items = [self._arg(x) for x in a.args]
            kind = _CONTAINER_KINDS.get(a.klass, "list")
            if any(type(x) is Call or type(x) is Build for x in items):
                return Build(kind, items)
            if kind == "dict":
                return dict(zip(items[::2], items[1::2]))
            return items if kind == "list" else a.klass(items)
        if isinstance(a, self._task):
            self._nested = True
            args = tuple(self._arg(x) for x in a.args)
            kwargs = {k: self._arg(v) for k, v in a.kwargs.items()}
            return Call(TableFunction(a.func), args, kwargs)
        return a


def _reduce_task(task: Any) -> Any:
    return (rebuild_task, (task.key, TableFunction(task.func), task.args, task.kwargs))


_CONTAINER_KINDS: dict[Any, str] = {list: "list", tuple: "tuple", set: "set", dict: "dict"}
# Builtin types, never one of Dask's graph node classes: passed on as they are.
_NOT_DASK = frozenset({str, int, float, bool, type(None), bytes, tuple, list, dict})


def annotations_for(
    key: Key,
    by_type: Mapping[str, Mapping[Key, Any]],
    defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """A key's annotations: its layer's, else the defaults (the call's and ``dask.annotate``'s)."""
    out = {}
    for name in ANNOTATIONS:
        per_key = by_type.get(name)
        value = per_key.get(key) if per_key else None
        if value is None:
            value = defaults.get(name)
            if callable(value):
                value = value(key)
        if value is not None:
            out[name] = value
    return out
