"""Dask's ``fuse_linear_task_spec`` on positions instead of keys.

Dask's version (``dask._task_spec.fuse_linear_task_spec``) builds a dependencies
mapping and a dict of dependent sets keyed by the graph's keys, then walks the graph
through them: every step hashes tuple keys again. On a million-task array graph that
is ~2.5 µs per task, most of it spent on graphs without a single chain to fuse.

:func:`fuse_linear_task_spec` is the same walk (this is Dask's algorithm, step for
step), on integer positions: the number of dependencies and of dependents of each key,
and the one dependency or dependent where there is exactly one (the only thing the walk
ever asks of them). The result is the same dict, in the same key order, with the same
fused tasks (``tests/client/test_linear_fuse.py`` compares both on random graphs; the
Blockwise tests compare whole optimised graphs with Dask's). A graph holding anything
but Dask graph nodes takes Dask's function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shoal.protocol.messages import Key


def fuse_linear_task_spec(dsk: Mapping[Key, Any], keys: Iterable[Key]) -> dict[Key, Any]:
    """``dask._task_spec.fuse_linear_task_spec(dsk, keys)``: linear chains of ``dsk``
    fused into one task each, the keys in ``keys`` kept as they are."""
    from dask._task_spec import Alias, DataNode, GraphNode, Task
    from dask._task_spec import fuse_linear_task_spec as dask_fuse
    from dask.optimization import default_fused_keys_renamer

    names = list(dsk)
    nodes = list(dsk.values())
    n = len(names)
    position: dict[Any, int] = {key: i for i, key in enumerate(names)}
    get = position.get
    outside: list[Any] = []  # dependencies that are not keys of dsk: positions n, n+1, ...
    n_deps = [0] * n
    one_dep = [-1] * n  # the one dependency of a key with exactly one
    n_dependents = [0] * n
    one_dependent = [-1] * n  # a dependent (the only one where there is exactly one)
    # Dask's own nodes: ``dependencies`` and ``block_fusion`` are GraphNode's
    # properties (its slot, False), read without a property call per node.
    own_nodes = {Task, Alias, DataNode}
    blocked = bytearray(n)  # block_fusion
    for i, node in enumerate(nodes):
        if type(node) in own_nodes:
            deps = node._dependencies
        elif isinstance(node, GraphNode):
            deps = node.dependencies
            blocked[i] = bool(node.block_fusion)
        else:
            return dask_fuse(dsk, keys)  # (dask works out a legacy task's dependencies)
        n_deps[i] = len(deps)
        for dk in deps:
            p = get(dk)
            if p is None:
                p = position[dk] = n + len(outside)
                outside.append(dk)
            elif p < n:
                n_dependents[p] += 1
                one_dependent[p] = i
            if n_deps[i] == 1:
                one_dep[i] = p
    kept = bytearray(n)  # keys asked for: never fused into a dependent
    for key in set(keys):
        p = get(key)
        if p is not None and p < n:
            kept[p] = 1
    seen = bytearray(n + len(outside))
    result: dict[Key, Any] = {}
    for i in range(n):
        if seen[i]:
            continue
        seen[i] = 1
        if n_deps[i] != 1 and n_dependents[i] != 1 or blocked[i]:
            result[names[i]] = nodes[i]
            continue
        below: list[int] = []  # the chain below i, nearest first
        top = i
        # towards the leaves while each key has one dependency and one dependent
        at = i
        while n_deps[at] == 1:
            new = one_dep[at]
            if seen[new]:
                break
            seen[new] = 1
            if new >= n:  # a dependency outside the graph (a future's key)
                break
            if n_dependents[new] != 1 or blocked[new] or kept[new]:
                result[names[new]] = nodes[new]
                break
            below.append(new)
            at = new
        chain = below[::-1]
        chain.append(i)
        # towards the root while each key has one dependent and one dependency
        up = n_dependents[i]
        while up == 1 and not kept[top]:
            new = one_dependent[top]
            if seen[new]:
                break
            seen[new] = 1
            if n_deps[new] != 1 or blocked[new]:
                result[names[new]] = nodes[new]
                break
            chain.append(new)
            top = new
            up = n_dependents[new]
        top_key = names[top]
        if len(chain) == 1:
            result[top_key] = nodes[chain[0]]
        else:
            tasks = [nodes[c] for c in chain]
            renamed = default_fused_keys_renamer([t.key for t in tasks])
            result[renamed] = Task.fuse(*tasks, key=renamed)
            if renamed != top_key:
                result[top_key] = Alias(top_key, target=renamed)
    return result
