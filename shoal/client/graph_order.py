"""The order in which a graph's tasks are submitted (and so run among equals).

``dask.order`` keeps peak memory low on the graphs that need care, at ~30 µs per task:
most of a large graph's client time. So it is bounded:

* a graph of at most ``TRIVIAL_TASKS`` tasks gets its dependency-first order at once
  (whatever the order, it holds at most that many results);
* up to ``shoal.client.order.max-tasks`` tasks: ``dask.order``;
* above: :func:`dependency_first`, a depth-first post-order from the graph's outputs
  that also runs at once the ready dependents that release an input (a few µs per
  task). On a reduction tree it finishes each subtree before starting the next, so the
  results held stay at about depth x fan-in, as with ``dask.order``
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
    that order too. Dependencies outside ``dsk`` are ignored.

    After each key, its dependents that are now ready and release a result (the last
    dependent of one of their inputs) run at once, and so on from them: a value used by
    two branches (``x - x.mean()``) is consumed as soon as it can be, instead of being
    held until the depth-first walk comes back to it."""
    position = {key: i for i, key in enumerate(dsk)}
    deps_of: dict[Key, list[Key]] = {}
    dependents: dict[Key, list[Key]] = {key: [] for key in dsk}
    for key, node in dsk.items():
        deps = [d for d in node.dependencies if d in position]
        deps_of[key] = deps
        for d in deps:
            dependents[d].append(key)
    unplaced_deps = {key: len(deps) for key, deps in deps_of.items()}
    unplaced_dependents = {key: len(ds) for key, ds in dependents.items()}
    rank = position.__getitem__
    out: list[Key] = []
    done: set[Key] = set()

    def place(key: Key) -> None:
        ready = [key]
        while ready:
            k = ready.pop()
            if k in done:
                continue
            done.add(k)
            out.append(k)
            for d in deps_of[k]:
                unplaced_dependents[d] -= 1
            eager = []
            for dependent in dependents[k]:
                unplaced_deps[dependent] -= 1
                if (
                    unplaced_deps[dependent] == 0
                    and dependent not in done
                    and any(unplaced_dependents[d] == 1 for d in deps_of[dependent])
                ):
                    eager.append(dependent)
            if eager:
                eager.sort(key=rank, reverse=True)  # the first in key order runs first
                ready.extend(eager)

    expanded: set[Key] = set()
    for output in dsk:
        if dependents[output]:
            continue
        stack = [output]
        while stack:
            key = stack[-1]
            if key in done:
                stack.pop()
            elif key in expanded:
                stack.pop()
                place(key)
            else:
                expanded.add(key)
                todo = [d for d in deps_of[key] if d not in done]
                if todo:
                    # reversed onto the stack: the first dependency is run first
                    todo.sort(key=rank, reverse=True)
                    stack.extend(todo)
    if len(out) != len(dsk):  # only a cycle leaves keys unreached
        raise ValueError("the graph has a dependency cycle")
    return out
