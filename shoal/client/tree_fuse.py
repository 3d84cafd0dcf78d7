"""A reduction's tiny leaves fused into their reduction task.

``(da.ones((c,), chunks=1) + k).sum()`` becomes, after Dask's optimisation, one leaf
task per chunk (``ones``, ``+ k`` and the chunk's partial sum, one Blockwise task with
no dependency) and a reduction tree over them (``partial_reduce``, 4 inputs per task
by default): three quarters of the tasks are leaves doing microseconds of work, each
costing the scheduler and a worker far more than that. Dask's legacy optimiser fused
such leaves into their reduction (``dask.optimization.fuse`` with ``ave_width``); this
module does the same on Dask's task spec, one level only: a reduction task ``P =
func([L1, ..., Lk])`` becomes ``func([leaf1(...), ..., leafk(...)])``, the leaves
inlined as inner tasks of ``P`` (the very nodes, keys and all, as Dask's ``Task.fuse``
keeps them in a fused subgraph), and the ``Li`` keys leave the graph. ``P``
keeps its key, its function and its result; each leaf does the same work as before,
inside ``P``'s task, one after another.

A group (``P`` with its leaves) is fused only when all of these hold:

* every ``Li`` is a task of one large expanded Blockwise layer (it has a
  ``LayerTemplate``: the encoder then sends the fused task as one template, see
  ``layer_encode.FusedReductionTemplate``) and ``P`` a task of a reduction layer (a
  ``ReductionTemplate``: exactly ``func([Alias(L1), ..., Alias(Lk)])``);
* every ``Li`` is a root (no dependency at all): fusing moves no data anywhere, and
  ``P`` becomes a root too;
* every ``Li`` has exactly one dependent, ``P`` (and is named once in ``P``'s list):
  no other task needs its value, so dropping its key loses nothing;
* no ``Li`` is among the keys asked for (those are results someone holds);
* no node involved has ``block_fusion`` (a node Dask must not fuse): every one is
  exactly Dask's ``Task``, whose ``block_fusion`` is False;
* no layer of the graph carries annotations (priority, retries, resources, workers,
  ...; ``dask.annotate``): annotations are per key, and a leaf's would be lost or its
  reduction's imposed on it. The caller checks this (it has the layers);
* the reduction layer has at least ``shoal.client.fuse-reductions.min-groups`` such
  groups (10,000 by default; 0 or false: never fuse): only graphs of tens of thousands
  of leaves fuse, so the fused layer alone still has far more tasks than any
  cluster has threads, and small graphs (interactive work) are left exactly as Dask
  makes them.

Low-level fusion switched off (``optimization.fuse.active: False``) leaves the graph
unfused: the array path that calls this is not taken then.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from shoal.client.layer_encode import (
    FusedReductionTemplate,
    LayerTemplate,
    ReductionTemplate,
    Template,
)
from shoal.protocol.messages import Key

MIN_GROUPS = 10_000  # the default of shoal.client.fuse-reductions.min-groups
CONFIG_KEY = "client.fuse-reductions.min-groups"


def min_groups() -> int:
    """``shoal.client.fuse-reductions.min-groups``: the fewest fused tasks a reduction
    layer must get to be fused (0: never fuse)."""
    from shoal import config

    value = config.get(CONFIG_KEY)
    if value is False or value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"shoal.{CONFIG_KEY} must be a count of tasks (an int >= 0) or false, got {value!r}"
        )
    return value


def fuse_reduction_leaves(
    dsk: dict[Key, Any],
    keys: Iterable[Key],
    templates: dict[str, Template],
    least: int | None = None,
) -> dict[Key, Any]:
    """``dsk`` with the leaves of its large reductions fused into their reduction
    tasks (see the module's docstring), changed in place, ``templates`` updated for the
    encoder. ``least``: the fewest groups per layer (default: the
    configured ``min-groups``)."""
    if least is None:
        least = min_groups()
    if least <= 0 or not templates:
        return dsk
    leaf_layers = {n for n, t in templates.items() if type(t) is LayerTemplate}
    reductions = {n: t for n, t in templates.items() if type(t) is ReductionTemplate}
    if not leaf_layers or not reductions:
        return dsk
    from dask._task_spec import Alias, Task, _identity_cast

    # One pass over the graph: the candidate groups by reduction layer (P's key, P,
    # its leaves' keys), P of the exact shape the reduction conversion makes, its
    # inputs all of one leaf layer; and every key another task depends on.
    candidates: dict[str, list[tuple[Key, Any, list[Any], str]]] = {}
    needed: set[Key] = set()
    for key, node in dsk.items():
        if type(node) is Task:
            deps = node._dependencies
            if not deps:
                continue  # a root (a possible leaf): depends on nothing
            if type(key) is tuple and key and key[0] in reductions:
                targets = _reduction_inputs(node, reductions[key[0]].func, Alias, _identity_cast)
                leaf_layer = _one_leaf_layer(targets, leaf_layers) if targets else None
                if targets and leaf_layer is not None:
                    candidates.setdefault(key[0], []).append((key, node, targets, leaf_layer))
                    continue
        else:
            deps = node.dependencies
        needed.update(deps)
    candidates = {n: c for n, c in candidates.items() if len(c) >= least}
    if not candidates:
        return dsk
    # A key among the inputs of two candidates has two dependents: not a leaf either.
    # (The sets below are the nodes' own sets of dependencies: set operations on them
    # reuse their keys' hashes, where looking each key up would hash it again.)
    seen: set[Key] = set()
    for groups in candidates.values():
        for _, node, _, _ in groups:
            deps = node._dependencies
            if not seen.isdisjoint(deps):
                needed.update(seen.intersection(deps))
            seen.update(deps)
    del seen
    needed.update(keys)  # keys asked for are results someone holds: kept
    build = _builder()
    fused: dict[Key, Any] = {}
    dropped: list[Key] = []
    for name, groups in candidates.items():
        made: dict[Key, Any] = {}
        gone: list[Key] = []
        leaf_name = groups[0][3]
        leaf_func = templates[leaf_name].func
        for key, node, targets, leaf_layer in groups:
            deps = node._dependencies
            # a key named twice in P's list would be computed twice, inlined
            if len(deps) != len(targets) or not needed.isdisjoint(deps):
                continue
            if leaf_layer != leaf_name:
                continue  # (one leaf layer per reduction layer: its one template)
            leaves = [dsk[t] for t in targets]
            # (a Task's block_fusion is GraphNode's: False)
            if all(
                type(leaf) is Task and not leaf._dependencies and leaf.func is leaf_func
                for leaf in leaves
            ):
                made[key] = build(key, node.func, leaves)
                gone.extend(targets)
        if len(made) < least:
            continue
        fused.update(made)
        dropped.extend(gone)
        leaf_template = templates[leaf_name]
        assert type(leaf_template) is LayerTemplate
        templates[name] = FusedReductionTemplate(reductions[name].func, leaf_template)
    # In place: a fused task keeps its key's place, its leaves leave the graph.
    dsk.update(fused)
    for t in dropped:
        del dsk[t]
    return dsk


def _reduction_inputs(node: Any, func: Any, alias: Any, identity_cast: Any) -> list[Any] | None:
    """The keys of ``node``'s list if it is ``Task(key, func, Task(None,
    _identity_cast, Alias(k1), ..., typ=list))``, else None."""
    if node.func is not func:
        return None
    args = node.args
    if len(args) != 1 or node.kwargs:
        return None
    inner = args[0]
    if (
        type(inner) is not type(node)
        or inner.func is not identity_cast
        or len(inner.kwargs) != 1
        or inner.kwargs.get("typ") is not list
    ):
        return None
    targets = []
    for a in inner.args:
        if type(a) is not alias:
            return None
        targets.append(a.target)
    return targets


def _one_leaf_layer(targets: list[Any], leaf_layers: set[str]) -> str | None:
    """The leaf layer all ``targets`` are keys of, or None."""
    first = targets[0]
    if type(first) is not tuple or not first or first[0] not in leaf_layers:
        return None
    name = first[0]
    if all(type(t) is tuple and t and t[0] == name for t in targets):
        return name
    return None


@functools.cache
def _builder() -> Callable[[Key, Any, list], Any]:
    """:func:`_direct` where it builds exactly what Dask's constructors build (every
    slot the same, checked once on a sample), else the constructors."""
    from dask._task_spec import DataNode, Task, _identity_cast

    from shoal.client.reduction_expand import _same_slots

    def constructed(key: Key, func: Any, leaves: list) -> Any:
        return Task(key, func, Task(None, _identity_cast, *leaves, typ=list))

    sample = [
        Task(("a", 0), _identity_cast, DataNode(None, 1), DataNode(None, (2,)), typ=tuple),
        Task(("a", 1), max, 5, DataNode(None, (3,)), _data_producer=True),
    ]
    built = _direct()
    want, got = constructed(("r", 0), sum, sample), built(("r", 0), sum, sample)
    return built if _same_slots(want, got) else constructed


def _direct() -> Callable[[Key, Any, list], Any]:
    """A function building ``Task(key, func, Task(None, _identity_cast, *leaves,
    typ=list))`` with the two nodes' slots set directly: the leaves are roots, so
    neither node has a dependency, and Dask's constructors would only walk the
    arguments to find none."""
    from dask._task_spec import _no_deps

    from shoal.client.reduction_expand import list_reduction_task

    def built(key: Key, func: Any, leaves: list) -> Any:
        return list_reduction_task(key, func, tuple(leaves), _no_deps)

    return built
