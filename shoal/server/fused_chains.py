"""Dask's fused linear chains, run on a worker without ordering them again per task.

Dask fuses a linear chain of tasks (``fuse_linear_task_spec``, e.g. ``ones`` then
``+ k`` then a partial ``sum``) into one task whose function is
``dask._task_spec._execute_subgraph``. That function runs ``dask.order.order`` on the
few-node subgraph every time it is called: hundreds of microseconds, most of the cost
of a tiny numpy task. A linear chain has one topological order only, so the worker
runs it in that order, the same nodes on the same values, and drops each intermediate
once the next node has used it (as dask does). A subgraph that is not a single chain
goes to dask's own function, unchanged.

The tasks of a layer share their subgraph's nodes (the worker decodes a layer's
template once): its chain, and for each plain ``Task`` (arguments that are references
or values) the function and where its arguments come from, are worked out once and
reused while the nodes are the same objects; a node is then called directly, without
``Task.__call__``'s per-call checks and argument walk.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import is_
from typing import Any

_DASK_MODULE = "dask._task_spec"
_DASK_NAME = "_execute_subgraph"


def is_dask_execute_subgraph(func: Any) -> bool:
    """Whether ``func`` is dask's ``_execute_subgraph`` (checked without importing dask)."""
    return (
        getattr(func, "__module__", None) == _DASK_MODULE
        and getattr(func, "__name__", None) == _DASK_NAME
    )


def with_fast_chains(func: Any) -> Any:
    """``func``, or for dask's ``_execute_subgraph`` a function that runs a linear
    chain directly and anything else through ``func`` itself."""
    if not is_dask_execute_subgraph(func):
        return func
    return make_chain_runner(func)


_MAX_CACHED_CHAINS = 1_024
_MAX_MET_ONCE = 16


def make_chain_runner(fallback: Callable[..., Any]) -> Callable[..., Any]:
    # ``fallback`` is dask's own function: dask is imported already.
    from dask._task_spec import GraphNode, Task, TaskRef

    # A layer's tasks share their fused subgraph's nodes (one decoded template, see
    # shoal/protocol/template_plan.py): its chain and calls are worked out once, keyed
    # by the output node, and reused while every node is the very same object (dask's
    # nodes are immutable).
    # id(output node) -> (output node, its key, keys, nodes, steps): shared chains, and
    # the last few chains met once. ``keys``/``nodes`` are the chain's in order, for
    # checking a task's subgraph against it in C (no Python call per node).
    chains: dict[int, tuple[Any, Any, tuple, tuple, list[tuple[Any, Any, Any]]]] = {}
    met_once: dict[int, tuple[Any, Any, tuple, tuple, list[tuple[Any, Any, Any]]]] = {}

    def direct_call(node: Any) -> tuple[Any, tuple, dict | None] | None:
        """``node``'s function and its arguments as ``(is a reference, key or value)``
        (keyword arguments: None when there are none) when ``Task.__call__`` would only
        look its references up; else None."""
        if type(node) is not Task:
            return None
        items = [*node.args, *node.kwargs.values()]
        if any(
            isinstance(a, GraphNode) or (isinstance(a, TaskRef) and type(a) is not TaskRef)
            for a in items
        ):
            return None
        args = tuple((True, a.key) if type(a) is TaskRef else (False, a) for a in node.args)
        kwargs = {
            k: ((True, a.key) if type(a) is TaskRef else (False, a)) for k, a in node.kwargs.items()
        }
        return node.func, args, kwargs or None

    def steps_of(inner_dsk: Any, outkey: Any) -> list[tuple[Any, Any, Any]] | None:
        out = inner_dsk.get(outkey) if type(inner_dsk) is dict else None
        hit = chains.get(id(out))
        if hit is None:
            hit = met_once.get(id(out))
        if hit is not None and hit[0] is out and hit[1] == outkey:
            _, _, keys, nodes, steps = hit
            if len(keys) == len(inner_dsk) and all(map(is_, map(inner_dsk.get, keys), nodes)):
                if id(out) not in chains:  # met again: shared, worth direct calls
                    steps = [(k, n, direct_call(n)) for k, n, _ in steps]
                    if len(chains) >= _MAX_CACHED_CHAINS:
                        chains.clear()
                    chains[id(out)] = (out, outkey, keys, nodes, steps)
                return steps
        order = chain_order(inner_dsk, outkey)
        if order is None:
            return None
        # Nodes met once so far (each task's own, if its arguments were unpickled) are
        # called as they are; only a few are kept, to be recognised when met again.
        steps = [(k, inner_dsk[k], None) for k in order]
        if len(met_once) >= _MAX_MET_ONCE:
            met_once.clear()
        met_once[id(out)] = (out, outkey, tuple(order), tuple(n for _, n, _ in steps), steps)
        return steps

    def execute_subgraph(inner_dsk: Any, outkey: Any, inkeys: Any, *dependencies: Any) -> Any:
        steps = steps_of(inner_dsk, outkey)
        if steps is None:
            return fallback(inner_dsk, outkey, inkeys, *dependencies)
        values = dict(zip(inkeys, dependencies))
        previous = None
        for key, node, direct in steps:
            args = kwargs = None  # (nothing of the last node's call stays referenced)
            if direct is not None:
                func, spec, kwspec = direct
                try:  # a missing value: the node's own call raises dask's error
                    args = [values[a] if ref else a for ref, a in spec]
                    if kwspec is not None:
                        kwargs = {k: values[a] if ref else a for k, (ref, a) in kwspec.items()}
                except KeyError:
                    args = None
            if args is None:
                values[key] = node(values)
            else:
                values[key] = func(*args, **kwargs) if kwargs else func(*args)
            if previous is not None:  # its only dependent has run: free it
                del values[previous]
            previous = key
        return values[outkey]

    execute_subgraph.__qualname__ = execute_subgraph.__name__ = "execute_fused_chain"
    execute_subgraph.fallback = fallback  # type: ignore[attr-defined]
    return execute_subgraph


def chain_order(inner_dsk: Any, outkey: Any) -> list[Any] | None:
    """The keys of ``inner_dsk`` from first to ``outkey`` when they form one linear
    chain (each node depends on at most one other node of the subgraph, and every node
    is reached from ``outkey``); None for any other shape."""
    if type(inner_dsk) is not dict:
        return None
    order: list[Any] = []
    key = outkey
    while True:
        node = inner_dsk.get(key)
        deps = getattr(node, "dependencies", None)
        if deps is None or not callable(node):
            return None
        order.append(key)
        if len(order) > len(inner_dsk):  # a cycle: not a chain
            return None
        inner = [d for d in deps if d in inner_dsk]
        if not inner:
            break
        if len(inner) > 1:
            return None
        key = inner[0]
    if len(order) != len(inner_dsk):  # nodes off the chain
        return None
    order.reverse()
    return order
