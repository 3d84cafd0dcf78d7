"""Dask's legacy tasks converted to its task spec, reduction tasks without recursion.

An array reduction's tree (``partial_reduce``: ``sum``, ``mean``, ``argmax``, ...) is
a ``MaterializedLayer`` of legacy tuples ``(func, [key, key, ...])``: each block's
function applied to the list of its input blocks. Dask's ``convert_legacy_graph``
converts each through ``convert_legacy_task``, one recursive call per list item, into
``Task(key, func, Task(None, _identity_cast, Alias(k1), Alias(k2), ..., typ=list))``.

:func:`convert_legacy_graph` is Dask's function (this is its code), except that such a
task, where every list item is a key of the graph (what Dask makes an ``Alias`` of),
is built in one step, giving the same nodes. Anything else takes Dask's
``convert_legacy_task``. A name with at least ``layer_encode.MIN_BLOCKS`` such tasks
leaves a :class:`~shoal.client.graph.layer_encode.ReductionTemplate` for the encoder
(``templates``), which encodes each as the template plus its list of keys. A reduction
over several axes lists its inputs as lists of lists of keys: those tasks (converted by
Dask's code) count towards the template too, for the fusion of their leaves
(``tree_fuse``); unfused, the encoder takes them the generic way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Mapping
from typing import Any

from shoal.client.graph.layer_encode import ReductionTemplate
from shoal.protocol.messages import Key

_KEY_TYPES = (tuple, str, int, float)  # what convert_legacy_task looks up in the keys


def convert_legacy_graph(
    dsk: Mapping[Key, Any],
    all_keys: Container | None = None,
    templates: dict[str, Any] | None = None,
    min_blocks: int = 1,
) -> dict[Key, Any]:
    """``dask._task_spec.convert_legacy_graph(dsk, all_keys)`` (see the module's
    docstring); ``templates`` receives the reduction templates of names with at least
    ``min_blocks`` reduction tasks."""
    from dask._task_spec import (
        Alias,
        DataNode,
        GraphNode,
        Task,
        convert_legacy_task,
    )

    if all_keys is None:
        # a dict answers ``in`` as the set of its keys would: not built again
        all_keys = dsk if type(dsk) is dict else set(dsk)
    new_dsk: dict[Key, Any]
    todo: Any
    if type(dsk) is dict:
        # Most values are Tasks already (Blockwise blocks), kept as they are: the dict
        # is copied at once and only the others are converted, in place (a replaced
        # value keeps its place, a dropped one goes: the order the loop would give).
        new_dsk = dict(dsk)
        todo = [(k, arg) for k, arg in dsk.items() if type(arg) is not Task]
    else:
        new_dsk, todo = {}, dsk.items()
    counts: dict[str, list[Any]] = {}  # name -> [count, function]
    for k, arg in todo:
        t: Any = None
        if type(arg) is Task:  # already converted (a Blockwise block): kept as it is
            new_dsk[k] = arg
            continue
        if type(arg) is tuple and len(arg) == 2 and type(arg[1]) is list and callable(arg[0]):
            items = arg[1]
            flat = bool(items) and _all_keys_in(items, all_keys)
            if flat or _nested_keys_in(items, all_keys):
                func = arg[0]
                if flat:
                    t = _reduction_task(k, func, items)
                else:  # lists of lists of keys (a reduction over several axes): Dask's
                    t = convert_legacy_task(k, arg, all_keys)
                if templates is not None and type(k) is tuple and k and type(k[0]) is str:
                    seen = counts.get(k[0])
                    if seen is None:
                        counts[k[0]] = [1, func]
                    elif seen[1] is func:
                        seen[0] += 1
        if t is None:
            t = convert_legacy_task(k, arg, all_keys)
            if isinstance(t, Alias) and t.target == k:
                new_dsk.pop(k, None)
                continue
            if not isinstance(t, GraphNode):
                t = DataNode(k, t)
        new_dsk[k] = t
    if templates is not None:
        for name, (count, func) in counts.items():
            if count >= min_blocks and name not in templates:
                templates[name] = ReductionTemplate(func)
    return new_dsk


def cull_materialized(layer: Any, keys: set, all_hlg_keys: Any) -> tuple[Any, dict] | None:
    """``layer.cull(keys, all_hlg_keys)`` for a ``MaterializedLayer`` of legacy tasks
    (this is Dask's code), a reduction task's dependencies found without Dask's
    generic walk of the task (:func:`_dependencies`); None for another layer."""
    from dask.highlevelgraph import MaterializedLayer

    if type(layer) is not MaterializedLayer or not layer.has_legacy_tasks:
        return None
    mapping = layer.mapping
    if len(keys) == len(layer):
        return layer, {k: _dependencies(mapping[k], all_hlg_keys) for k in mapping}
    ret_deps = {}
    seen = set()
    out = {}
    work = keys.copy()
    while work:
        k = work.pop()
        if k not in layer:
            continue
        out[k] = layer[k]
        ret_deps[k] = _dependencies(out[k], all_hlg_keys)
        for d in ret_deps[k]:
            if d not in seen and d in layer:
                seen.add(d)
                work.add(d)
    return MaterializedLayer(out, annotations=layer.annotations), ret_deps


def _dependencies(task: Any, keys: Any) -> set:
    """``dask.core.keys_in_tasks(keys, [task])``: for a reduction task ``(func,
    [key, ...])`` its items that are keys, in the same order (the same set)."""
    if type(task) is tuple and len(task) == 2 and type(task[1]) is list and callable(task[0]):
        items = task[1]
        while items and type(items[0]) is list and all(type(i) is list for i in items):
            items = [i for sub in items for i in sub]  # lists of lists: over several axes
        if all(
            type(i) in _KEY_TYPES and not (type(i) is tuple and i and callable(i[0])) for i in items
        ):
            return set(_members(items, keys))
    from dask.core import keys_in_tasks

    return keys_in_tasks(keys, [task])


def _reduction_task(key: Key, func: Any, items: list) -> Any:
    """What ``convert_legacy_task`` makes of ``(func, items)``, every item a key."""
    return _builder()(key, func, items)


@functools.cache
def _builder() -> Callable[[Key, Any, list], Any]:
    """:func:`_built` where it builds exactly what Dask's constructors build (every
    slot the same, checked once on a sample), else the constructors."""
    from dask._task_spec import Alias, Task, _identity_cast

    def constructed(key: Key, func: Any, items: list) -> Any:
        return Task(key, func, Task(None, _identity_cast, *map(Alias, items), typ=list))

    sample: list = [("a", 0), ("b", 1), ("a", 0)]
    want, got = constructed(("r", 0), sum, sample), _built(("r", 0), sum, sample)
    return _built if _same_slots(want, got) else constructed


def _built(key: Key, func: Any, items: list) -> Any:
    """The nodes of :func:`_reduction_task`, their slots set directly: Dask's
    ``__init__`` work out each node's dependencies one argument at a time, here all
    of them are the items (a reduction task costs a third)."""
    from dask._task_spec import Alias

    new: Any = object.__new__  # (nodes typed Any: Dask types its keys its own way)
    aliases = []
    for item in items:
        alias = new(Alias)
        alias.key = alias.target = item
        alias._dependencies = frozenset((item,))
        aliases.append(alias)
    return list_reduction_task(key, func, tuple(aliases), frozenset(items))


def list_reduction_task(key: Key, func: Any, items: tuple, deps: Any) -> Any:
    """``Task(key, func, Task(None, _identity_cast, *items, typ=list))`` with both nodes'
    slots set directly, ``deps`` (a frozenset) being both nodes' dependencies, as Dask's
    constructors would find them in ``items`` (the caller's check on a sample,
    ``_same_slots``, guards that this is what they build)."""
    return reduction_node(key, func, list_node(items, deps), deps)


def list_node(items: tuple, deps: Any) -> Any:
    """``Task(None, _identity_cast, *items, typ=list)`` with its slots set directly,
    ``deps`` its dependencies (see :func:`list_reduction_task`)."""
    from dask._task_spec import Task, _identity_cast

    node: Any = object.__new__(Task)
    node.key, node.func, node.args, node.kwargs = None, _identity_cast, items, {"typ": list}
    return _filled(node, deps)


def reduction_node(key: Key, func: Any, inner: Any, deps: Any) -> Any:
    """``Task(key, func, inner)`` with its slots set directly (see
    :func:`list_reduction_task`)."""
    from dask._task_spec import Task

    node: Any = object.__new__(Task)
    node.key, node.func, node.args, node.kwargs = key, func, (inner,), {}
    return _filled(node, deps)


def _filled(node: Any, deps: Any) -> Any:
    node._dependencies = deps
    node._is_coro = node._token = node._repr = None
    node._data_producer = False
    return node


def _same_slots(a: Any, b: Any) -> bool:
    """Whether two Dask nodes (and the nodes among their arguments) have the same type
    and every slot the same value (a set of dependencies also in the same order)."""
    if type(a) is not type(b):
        return False
    from dask._task_spec import GraphNode

    for cls in type(a).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            x: Any = getattr(a, slot, _UNSET)
            y: Any = getattr(b, slot, _UNSET)
            if slot == "args":
                if len(x) != len(y) or not all(
                    i is j or (_same_slots(i, j) if isinstance(i, GraphNode) else i == j)
                    for i, j in zip(x, y, strict=True)
                ):
                    return False
            elif x is not y and (type(x) is not type(y) or x != y):
                return False
            elif type(x) is frozenset and list(x) != list(y):
                return False  # the same items in another order: Dask's fusion walks them
    return True


_UNSET = object()


def _all_keys_in(items: list, keys: Container) -> bool:
    """``all(type(i) in _KEY_TYPES and _member(i, keys) for i in items)``, without a
    call per item (an unhashable item, rare, raises: then the items one by one)."""
    try:
        return all(type(i) in _KEY_TYPES and i in keys for i in items)
    except TypeError:
        return all(type(i) in _KEY_TYPES and _member(i, keys) for i in items)


def _nested_keys_in(items: list, keys: Container) -> bool:
    """Whether ``items`` is a non-empty list of non-empty lists, each of keys of the
    graph or of such lists in turn (how ``partial_reduce`` lists its inputs when it
    reduces over several axes)."""
    if not items or type(items[0]) is not list:
        return False
    for sub in items:
        if type(sub) is not list or not sub:
            return False
        if not (_all_keys_in(sub, keys) or _nested_keys_in(sub, keys)):
            return False
    return True


def _members(items: list, keys: Container) -> list:
    """``[i for i in items if _member(i, keys)]``, without a call per item."""
    try:
        return [i for i in items if i in keys]
    except TypeError:
        return [i for i in items if _member(i, keys)]


def _member(item: Any, keys: Container) -> bool:
    """``item in keys`` as ``convert_legacy_task`` asks it (an unhashable item is not)."""
    try:
        return item in keys
    except TypeError:
        return False
