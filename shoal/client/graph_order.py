"""The order in which a graph's tasks are submitted (and so run among equals).

``dask.order`` keeps peak memory low on the graphs that need care, at ~30 µs per task:
most of a large graph's client time. So it is bounded:

* a graph of at most ``TRIVIAL_TASKS`` tasks gets its dependency-first order at once
  (whatever the order, it holds at most that many results);
* up to ``shoal.client.order.max-tasks`` tasks: ``dask.order``;
* above: :func:`dependency_first`, a depth-first post-order from the graph's outputs
  (~2 µs per task). On a reduction tree it finishes each subtree before starting the
  next, so the results held stay at about depth x fan-in, as with ``dask.order``
  (``benchmarks/order_memory.py`` measures both on dask's own ordering test graphs and on
  large array reductions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.protocol.messages import Key

TRIVIAL_TASKS = 4
DEFAULT_MAX_TASKS = 100_000


def order_bound() -> int | None:
    """``shoal.client.order.max-tasks``: the largest graph ``dask.order`` orders (None:
    no bound)."""
    from shoal import config

    value = config.get("client.order.max-tasks")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"shoal.client.order.max-tasks must be a task count (an int >= 0) or null, "
            f"got {value!r}"
        )
    return value


def submission_order(dsk: Mapping[Key, Any], max_tasks: int | None) -> list[Key]:
    """The keys of ``dsk`` (Dask graph nodes, acyclic) in the order to submit them: every
    key after its dependencies in the graph."""
    from shoal.client.dask_graph import topological

    if len(dsk) <= TRIVIAL_TASKS or (max_tasks is not None and len(dsk) > max_tasks):
        return dependency_first(dsk)
    from dask.order import order

    return topological(dsk, order(dsk))  # type: ignore[arg-type]


def dependency_first(dsk: Mapping[Key, Any]) -> list[Key]:
    """A depth-first post-order of ``dsk`` (acyclic) from its outputs (the keys no other
    key depends on), in the graph's own key order; each key's dependencies are taken in
    that order too. Dependencies outside ``dsk`` are ignored."""
    position = {key: i for i, key in enumerate(dsk)}
    needed: set[Key] = set()
    for node in dsk.values():
        needed.update(node.dependencies)
    out: list[Key] = []
    done: set[Key] = set()
    expanded: set[Key] = set()
    rank = position.__getitem__
    for output in dsk:
        if output in needed:
            continue
        stack = [output]
        while stack:
            key = stack[-1]
            if key in done:
                stack.pop()
            elif key in expanded:
                stack.pop()
                done.add(key)
                out.append(key)
            else:
                expanded.add(key)
                deps = [d for d in dsk[key].dependencies if d in position and d not in done]
                if deps:
                    # reversed onto the stack: the first dependency is run first
                    deps.sort(key=rank, reverse=True)
                    stack.extend(deps)
    if len(out) != len(dsk):  # only a cycle leaves keys unreached
        raise ValueError("the graph has a dependency cycle")
    return out
