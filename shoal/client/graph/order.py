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
from typing import TYPE_CHECKING, Any

from shoal.protocol.messages import Key

if TYPE_CHECKING:
    from shoal.client.graph.order_cache import OrderCache

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


class GraphIndex:
    """A graph on positions (ints): its keys in order, each key's dependencies in the
    graph (positions, sorted), each key's dependents (in key order), and the
    dependencies outside the graph. Dask's tuple keys are hashed anew at every lookup:
    made once per submission, for both :func:`~shoal.client.graph.dask_graph.check_graph`
    and :func:`dependency_first`, instead of a position map and a walk over every
    dependency in each."""

    __slots__ = ("keys", "deps_of", "dependents", "outside")

    def __init__(self, dsk: Mapping[Key, Any]):
        keys = list(dsk)
        get = {key: i for i, key in enumerate(keys)}.get
        deps_of: list[list[int]] = []
        dependents: list[list[int]] = [[] for _ in keys]
        outside: list[Key] = []
        for i, node in enumerate(dsk.values()):
            ds = node.dependencies
            deps = [p for p in map(get, ds) if p is not None]
            if len(deps) != len(ds):
                outside.extend([dk for dk in ds if get(dk) is None])
            if len(deps) > 1:
                deps.sort()
            deps_of.append(deps)
            for p in deps:
                dependents[p].append(i)
        self.keys = keys
        self.deps_of = deps_of
        self.dependents = dependents
        self.outside = outside


def submission_order(
    dsk: Mapping[Key, Any],
    max_tasks: int | None,
    index: GraphIndex | None = None,
    cache: OrderCache | None = None,
) -> list[Key]:
    """The keys of ``dsk`` (Dask graph nodes, acyclic) in the order to submit them: every
    key after its dependencies in the graph. ``index``: ``dsk``'s :class:`GraphIndex`,
    if the caller has made it. ``cache``: the orders ``dask.order`` gave graphs of the
    same structure before (order_cache.py), consulted and added to."""
    from shoal.client.graph.dask_graph import topological

    if len(dsk) <= TRIVIAL_TASKS or (max_tasks is not None and len(dsk) > max_tasks):
        return dependency_first(dsk, index)
    from dask.order import order

    structure = None
    if cache is not None:
        if index is None:
            index = GraphIndex(dsk)
        structure = cache.structure(dsk, index)
        if structure is not None and (found := cache.get(structure, index.keys)) is not None:
            return found
    ordered: list[Key] = topological(dsk, order(dsk))  # type: ignore[arg-type]
    if cache is not None and index is not None and structure is not None:
        cache.put(structure, index.keys, ordered)
    return ordered


def dependency_first(dsk: Mapping[Key, Any], index: GraphIndex | None = None) -> list[Key]:
    """A depth-first post-order of ``dsk`` (acyclic) from its outputs (the keys no other
    key depends on), in the graph's own key order; each key's dependencies are taken in
    that order too. Dependencies outside ``dsk`` are ignored.

    After each key, its dependents that are now ready and release a result (the last
    dependent of one of their inputs) run at once, and so on from them: a value used by
    two branches (``x - x.mean()``) is consumed as soon as it can be, instead of being
    held until the depth-first walk comes back to it.

    ``index``: ``dsk``'s :class:`GraphIndex`, if the caller has made it."""
    # The walk runs on positions (ints), not keys: Dask's tuple keys are hashed anew
    # at every dict or set lookup. Every list is kept in the graph's key order once,
    # when built (dependents appended in that order, dependencies sorted), so that
    # the walk never sorts.
    if index is None:
        index = GraphIndex(dsk)
    keys, deps_of, dependents = index.keys, index.deps_of, index.dependents
    n = len(keys)
    unplaced_deps = [len(deps) for deps in deps_of]
    unplaced_dependents = [len(ds) for ds in dependents]
    out: list[int] = []
    done = [False] * n

    def place(i: int) -> None:
        ready = [i]
        while ready:
            k = ready.pop()
            if done[k]:
                continue
            done[k] = True
            out.append(k)
            for d in deps_of[k]:
                unplaced_dependents[d] -= 1
            eager = []
            for dependent in dependents[k]:
                left = unplaced_deps[dependent] - 1
                unplaced_deps[dependent] = left
                if left == 0 and not done[dependent]:
                    for d in deps_of[dependent]:
                        if unplaced_dependents[d] == 1:
                            eager.append(dependent)
                            break
            if eager:
                eager.reverse()  # the first in key order runs first
                ready.extend(eager)

    expanded = [False] * n
    for output in range(n):
        if dependents[output]:
            continue
        stack = [output]
        while stack:
            i = stack[-1]
            if done[i]:
                stack.pop()
            elif expanded[i]:
                stack.pop()
                place(i)
            else:
                expanded[i] = True
                # reversed onto the stack: the first dependency is run first
                stack.extend([d for d in reversed(deps_of[i]) if not done[d]])
    if len(out) != n:  # only a cycle leaves keys unreached
        raise ValueError("the graph has a dependency cycle")
    return [keys[i] for i in out]
