"""A reduction's tiny leaves fused into their reduction task.

``(da.ones((c,), chunks=1) + k).sum()`` becomes, after Dask's optimisation, one leaf
task per chunk (``ones``, ``+ k`` and the chunk's partial sum, one Blockwise task with
no dependency) and a reduction tree over them (``partial_reduce``, 4 inputs per task
by default): three quarters of the tasks are leaves doing microseconds of work, each
costing the scheduler and a worker far more than that. Dask's legacy optimiser fused
such leaves into their reduction (``dask.optimization.fuse`` with ``ave_width``); this
module does the same on Dask's task spec: a reduction task ``P = func([L1, ..., Lk])``
becomes ``func([leaf1(...), ..., leafk(...)])``, the leaves inlined as inner tasks of
``P`` (the very nodes, keys and all, as Dask's ``Task.fuse`` keeps them in a fused
subgraph), and the ``Li`` keys leave the graph. ``P`` keeps its key, its function and
its result; each leaf does the same work as before, inside ``P``'s task, one after
another.

A reduction over several axes lists its inputs as lists of lists (``partial_reduce``:
``func([[L1, L2], [L3, L4]])`` over two axes): its leaves are inlined in the same
places of the same lists.

Then level by level: a fused ``P`` is a root with one dependent, a leaf like any
other, so the level above fuses its ``P``s in the same way (``Q = func2([P1(...), ...])``,
each ``Pi`` with its leaves inlined), under the same rules, while the level still gets
``min-groups`` tasks and each task holds at most ``MAX_LEAVES`` leaves. On the
million-task graph_scale graph that is three levels: 15,628 tasks of up to 64 leaves
instead of 250,003 of 4, and with it a quarter of the workers' CPU and nearly all of the
scheduler's (every task costs both a message, a state change and a report).

A group (``P`` with its leaves) is fused only when all of these hold:

* every ``Li`` is a task of one large expanded Blockwise layer (it has a
  ``LayerTemplate``: the encoder then sends the fused task as one template, see
  ``layer_encode.FusedReductionTemplate``), or a task fused at the level below, and
  ``P`` a task of a reduction layer (a ``ReductionTemplate``: exactly
  ``func([Alias(L1), ..., Alias(Lk)])``, or that list a list of such lists);
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

from shoal.client.graph.layer_encode import (
    NESTED,
    FusedReductionTemplate,
    LayerTemplate,
    ReductionTemplate,
    Template,
)
from shoal.protocol.messages import Key

MIN_GROUPS = 10_000  # the default of shoal.client.fuse-reductions.min-groups
CONFIG_KEY = "client.fuse-reductions.min-groups"
# The most leaves a task fused over several levels may hold: its template (one call
# per leaf) stays a few KiB, and the task milliseconds long.
MAX_LEAVES = 64


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
    # its inputs' keys, their layer), P of the exact shape the reduction conversion
    # makes, its inputs all of one leaf layer or one reduction layer (a level below,
    # fused first); and every key another task depends on.
    sources = leaf_layers | reductions.keys()
    candidates: dict[str, list[tuple[Key, Any, list[Any], str, Any]]] = {}
    needed: set[Key] = set()
    for key, node in dsk.items():
        if type(node) is Task:
            deps = node._dependencies
            if not deps:
                continue  # a root (a possible leaf): depends on nothing
            if type(key) is tuple and key and key[0] in reductions:
                inputs = _reduction_inputs(node, reductions[key[0]].func, Alias, _identity_cast)
                source = _one_layer(inputs[0], sources) if inputs else None
                if inputs and source is not None:
                    targets, form = inputs
                    candidates.setdefault(key[0], []).append((key, node, targets, source, form))
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
        for _, node, *_ in groups:
            deps = node._dependencies
            if not seen.isdisjoint(deps):
                needed.update(seen.intersection(deps))
            seen.update(deps)
    del seen
    needed.update(keys)  # keys asked for are results someone holds: kept
    # Level by level: a reduction layer is fused once the layer below it is (its
    # inputs are leaves, or tasks fused at the level below, now roots themselves).
    build = _builder()
    fused: dict[str, dict[Key, int]] = {}  # layer -> its fused tasks' leaf counts
    pending = dict(candidates)
    while True:
        ready = [n for n, groups in pending.items() if _ready(groups[0][3], leaf_layers, fused)]
        if not ready:
            break
        for name in ready:
            groups = pending.pop(name)
            source = groups[0][3]
            counts = _fuse_layer(dsk, groups, source, templates, fused, needed, least, build)
            if counts:
                fused[name] = counts
                below = templates[source]
                assert type(below) is LayerTemplate or type(below) is FusedReductionTemplate
                templates[name] = FusedReductionTemplate(reductions[name].func, below)
    return dsk


def _ready(source: str, leaf_layers: set[str], fused: dict[str, dict[Key, int]]) -> bool:
    """Whether a reduction layer over ``source`` can be fused now: its inputs are
    leaves, or tasks of a layer already fused."""
    return source in leaf_layers or source in fused


def _fuse_layer(
    dsk: dict[Key, Any],
    groups: list[tuple[Key, Any, list[Any], str, Any]],
    source: str,
    templates: dict[str, Template],
    fused: dict[str, dict[Key, int]],
    needed: set[Key],
    least: int,
    build: Callable[[Key, Any, Any, list], Any],
) -> dict[Key, int]:
    """Fuses ``groups`` (one reduction layer's) into ``dsk`` in place, if at least
    ``least`` of them may be; returns each fused task's count of leaves (empty: none
    fused)."""
    from dask._task_spec import Task

    below = fused.get(source)  # the fused tasks of the level below, or None: leaves
    leaf_func = templates[source].func
    made: dict[Key, Any] = {}
    counts: dict[Key, int] = {}
    gone: list[Key] = []
    for key, node, targets, layer, form in groups:
        deps = node._dependencies
        # a key named twice in P's list would be computed twice, inlined
        if len(deps) != len(targets) or not needed.isdisjoint(deps):
            continue
        if layer != source:
            continue  # (one source layer per reduction layer: its one template)
        items = [dsk[t] for t in targets]
        if below is None:
            # (a Task's block_fusion is GraphNode's: False)
            if not all(
                type(leaf) is Task and not leaf._dependencies and leaf.func is leaf_func
                for leaf in items
            ):
                continue
            count = len(items)
        else:
            if not all(t in below for t in targets):
                continue  # an input left unfused: not a root
            count = sum([below[t] for t in targets])
            if count > MAX_LEAVES:
                continue
        made[key] = build(key, node.func, form, items)
        counts[key] = count
        gone.extend(targets)
    if len(made) < least:
        return {}
    # In place: a fused task keeps its key's place, its inputs leave the graph.
    dsk.update(made)
    for t in gone:
        del dsk[t]
    return counts


def _reduction_inputs(
    node: Any, func: Any, alias: Any, identity_cast: Any
) -> tuple[list[Any], Any] | None:
    """The keys ``node``'s list names, in order, and the list's form, if ``node`` is
    ``Task(key, func, L)`` with ``L`` either ``Task(None, _identity_cast, Alias(k1),
    ..., typ=list)`` (form: its length) or such a task of lists of the same kind
    (``partial_reduce`` over several axes; form: ``(NESTED, (the lists' forms))``);
    else None."""
    if node.func is not func:
        return None
    args = node.args
    if len(args) != 1 or node.kwargs:
        return None
    targets: list[Any] = []
    form = _list_form(args[0], type(node), alias, identity_cast, targets)
    return None if form is None else (targets, form)


def _list_form(inner: Any, task: Any, alias: Any, identity_cast: Any, targets: list) -> Any:
    """The form of a reduction's (nested) list ``inner`` (see ``_reduction_inputs``),
    its keys appended to ``targets`` in order; None if it is not of that shape."""
    if (
        type(inner) is not task
        or inner.func is not identity_cast
        or len(inner.kwargs) != 1
        or inner.kwargs.get("typ") is not list
    ):
        return None
    items = inner.args
    if not items:
        return None
    if type(items[0]) is alias:
        for a in items:
            if type(a) is not alias:
                return None
            targets.append(a.target)
        return len(items)
    forms = []
    for sub in items:
        form = _list_form(sub, task, alias, identity_cast, targets)
        if form is None:
            return None
        forms.append(form)
    return (NESTED, tuple(forms))


def _one_layer(targets: list[Any], layers: set[str]) -> str | None:
    """The one layer of ``layers`` all ``targets`` are keys of, or None."""
    first = targets[0]
    if type(first) is not tuple or not first or first[0] not in layers:
        return None
    name = first[0]
    if all(type(t) is tuple and t and t[0] == name for t in targets):
        return name
    return None


@functools.cache
def _builder() -> Callable[[Key, Any, Any, list], Any]:
    """A function building ``Task(key, func, L)``, ``L`` the list of ``form`` over the
    leaves in order (a flat ``Task(None, _identity_cast, *leaves, typ=list)`` for an int
    form, lists of such lists for ``(NESTED, ...)``): every node's slots set directly
    where that builds exactly what Dask's constructors build (checked once on a flat
    and a nested sample), else the constructors. The leaves are roots, so no node has
    a dependency, and the constructors would only walk the arguments to find none."""
    from dask._task_spec import DataNode, Task, _identity_cast, _no_deps

    from shoal.client.graph.reduction_expand import _same_slots, list_node, reduction_node

    def constructed(key: Key, func: Any, form: Any, items: list) -> Any:
        leaves = iter(items)

        def nested(f: Any) -> Any:
            if type(f) is int:
                return Task(None, _identity_cast, *[next(leaves) for _ in range(f)], typ=list)
            return Task(None, _identity_cast, *[nested(g) for g in f[1]], typ=list)

        return Task(key, func, nested(form))

    def direct(key: Key, func: Any, form: Any, items: list) -> Any:
        if type(form) is int:  # (most tasks: a flat list, the leaves as they are)
            return reduction_node(key, func, list_node(tuple(items), _no_deps), _no_deps)
        leaves = iter(items)

        def nested(f: Any) -> Any:
            if type(f) is int:
                return list_node(tuple([next(leaves) for _ in range(f)]), _no_deps)
            return list_node(tuple([nested(g) for g in f[1]]), _no_deps)

        return reduction_node(key, func, nested(form), _no_deps)

    sample = [
        Task(("a", 0), _identity_cast, DataNode(None, 1), DataNode(None, (2,)), typ=tuple),
        Task(("a", 1), max, 5, DataNode(None, (3,)), _data_producer=True),
        Task(("a", 2), _identity_cast, DataNode(None, 2), typ=tuple),
    ]
    for form in (3, (NESTED, (2, (NESTED, (1,))))):
        want = constructed(("r", 0), sum, form, sample)
        if not _same_slots(want, direct(("r", 0), sum, form, sample)):
            return constructed
    return direct
