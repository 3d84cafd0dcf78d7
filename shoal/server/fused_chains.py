"""Dask's fused linear chains, run on a worker without ordering them again per task.

Dask fuses a linear chain of tasks (``fuse_linear_task_spec``, e.g. ``ones`` then
``+ k`` then a partial ``sum``) into one task whose function is
``dask._task_spec._execute_subgraph``. That function runs ``dask.order.order`` on the
few-node subgraph every time it is called: hundreds of microseconds, most of the cost
of a tiny numpy task. A linear chain has one topological order only, so the worker
runs it in that order, the same nodes on the same values, and drops each intermediate
once the next node has used it (as dask does). A subgraph that is not a single chain
goes to dask's own function, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
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


def make_chain_runner(fallback: Callable[..., Any]) -> Callable[..., Any]:
    def execute_subgraph(inner_dsk: Any, outkey: Any, inkeys: Any, *dependencies: Any) -> Any:
        order = chain_order(inner_dsk, outkey)
        if order is None:
            return fallback(inner_dsk, outkey, inkeys, *dependencies)
        values = dict(zip(inkeys, dependencies))
        previous = None
        for key in order:
            values[key] = inner_dsk[key](values)
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
