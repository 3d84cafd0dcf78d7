"""Dask array graphs materialised without Dask's per-task Blockwise path.

A ``dask.array`` computation reaches the client as Dask's ``_HLGExprSequence``: a
``HighLevelGraph`` per collection, optimised by ``dask.array.optimization.optimize``
(``optimize_blockwise``, ``fuse_roots``, culling, then the layers materialised,
converted to Dask's task spec, linearly fused and their slices fused). Nearly all of
that time goes into materialising the ``Blockwise`` layers: for every output block,
Dask's ``_make_blockwise_graph`` substitutes the layer's template task once per
argument, each substitution building a new ``Task`` (and a ``DataNode`` per literal),
then renames the result once more.

:func:`materialize` runs the same optimisation, step by step with Dask's own functions,
except that a ``Blockwise`` layer it can reproduce exactly is expanded here: the same
coordinate mapping (Dask's ``_get_coord_mapping``), the same substitution values, but
each block's task built in one ``Task(...)`` from the template's arguments with its
placeholders replaced (or one ``Task.substitute`` of all of them, where a placeholder
is nested), values shared by all blocks made once. ``fuse_roots`` and the culling
(Dask's code, copied) take the same shortcut for the Blockwise layers they touch. The
result is the graph Dask would have made: the same keys in the same order, the same
task values and dependencies (``tests/client/test_blockwise_expand.py`` compares them
on many collections and on random ones).

Each block's ``Task`` is built with its slots set directly, its dependencies from the
layer's once and the block's own (the first block is checked against Dask's
constructor). The legacy reduction layers are converted and culled by
:mod:`shoal.client.graph.reduction_expand` (Dask's code with exact fast paths). A large layer
leaves its template for the encoder (:mod:`shoal.client.graph.layer_encode`). Last, the tiny
leaves of a large reduction are fused into their reduction tasks
(:mod:`shoal.client.graph.tree_fuse`: the one step that makes a graph other than Dask's, the
same results from fewer tasks).

Anything else takes Dask's path unchanged: another kind of expression or optimiser,
low-level fusion switched off, a graph already materialised, and, per layer, layers
that are not ``Blockwise``, ``concatenate=True`` contractions, and substitutions that
could interact (a substituted value that depends on one of the layer's own argument
placeholders).
"""

from __future__ import annotations

import functools
import itertools
import sys
from typing import Any

from shoal.client.graph import dask_graph, reduction_expand, tree_fuse
from shoal.client.graph.gc_pause import gc_paused
from shoal.client.graph.layer_encode import MIN_BLOCKS, LayerTemplate, Template
from shoal.client.graph.linear_fuse import fuse_linear_task_spec  # Dask's, on positions
from shoal.protocol.messages import Key


def materialize(
    graph: Any, templates: dict[str, Template] | None = None
) -> tuple[dict[Key, Any], dict[str, dict[Key, Any]]]:
    """:func:`shoal.client.graph.dask_graph.materialize`, with the Blockwise layers of a
    Dask array expression expanded here (see the module's docstring). ``templates``
    (a dict) receives the :class:`~shoal.client.graph.layer_encode.LayerTemplate` of each
    large layer expanded, by its output name, for the encoder."""
    with gc_paused():
        optimized = optimized_hlg(graph, templates)
        if optimized is not None:
            # Dask's own expression finishes the job from the optimised graph it would
            # have made itself (its cached property): merging, annotations, the dict.
            graph.__dict__["_optimized_dsk"] = optimized
        return dask_graph.materialize(graph)


def optimized_hlg(graph: Any, templates: dict[str, Template] | None = None) -> Any | None:
    """The ``HighLevelGraph`` that Dask's ``_HLGExprSequence._optimized_dsk`` gives for
    ``graph``, made with :func:`expand_layers`; None where this module does not apply."""
    # Dask's array optimiser exists only once dask.array is loaded: before, no graph is
    # an array graph (a Delayed compute need not import dask.array). The cheap checks go
    # first: most small computes are not array graphs (~15 µs saved per such compute).
    array_optimize = getattr(sys.modules.get("dask.array.optimization"), "optimize", None)
    if array_optimize is None or not _dask_internals_present():
        return None
    from dask._expr import HLGExpr, _HLGExprSequence

    if type(graph) is not _HLGExprSequence or "_optimized_dsk" in graph.__dict__:
        return None
    operands = graph.operands
    if not operands or not all(
        isinstance(op, HLGExpr) and op.low_level_optimizer is array_optimize for op in operands
    ):
        return None
    from dask import config
    from dask.highlevelgraph import HighLevelGraph

    if config.get("optimization.fuse.active") is False:
        return None  # Dask's optimiser then keeps the layers: nothing is materialised
    graphs: list[Any] = [_array_optimize(op.hlg, op.__dask_keys__(), templates) for op in operands]
    return HighLevelGraph.merge(*graphs)


@functools.cache
def _dask_internals_present() -> bool:
    """Whether the installed Dask has the internals this module builds on; without
    them, Dask's own path (a Dask whose internals changed their meaning instead is
    what the tests comparing with Dask's graphs catch)."""
    try:
        from dask._expr import HLGExpr, _HLGExprSequence  # noqa: F401
        from dask._task_spec import (  # noqa: F401
            DataNode,
            Task,
            TaskRef,
            _execute_subgraph,  # noqa: F401
            parse_input,
        )
        from dask.array.optimization import _is_getter_task, _optimize_slices  # noqa: F401
        from dask.blockwise import (  # noqa: F401
            Blockwise,
            _get_coord_mapping,
            _lol_product,
            blockwise_token,
        )
        from dask.highlevelgraph import HighLevelGraph
        from dask.layers import ArrayChunkShapeDep  # noqa: F401
    except ImportError:
        return False
    return all(hasattr(Blockwise, name) for name in ("_cull", "is_materialized", "dims")) and (
        hasattr(HighLevelGraph, "_toposort_layers")
    )


def _array_optimize(
    dsk: Any, keys: Any, templates: dict[str, Template] | None = None
) -> dict[Key, Any]:
    """``dask.array.optimization.optimize`` with :func:`expand_layers` in place of
    ``ensure_dict`` (the caller has checked that low-level fusion is on)."""
    from dask.blockwise import optimize_blockwise
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph

    if not isinstance(keys, list | set):
        keys = [keys]
    keys = list(flatten(keys))
    if not isinstance(dsk, HighLevelGraph):
        name: Any = id(dsk)  # as Dask's optimize names it
        dsk = HighLevelGraph.from_collections(name, dsk, dependencies=())
    dsk = optimize_blockwise(dsk, keys=keys)
    dsk = _fuse_roots(dsk, keys=keys)
    dsk = _cull(dsk, set(keys))
    annotated = any(layer.annotations for layer in dsk.layers.values())
    flat = expand_layers(dsk, templates)
    flat = reduction_expand.convert_legacy_graph(flat, None, templates, MIN_BLOCKS)
    flat = fuse_linear_task_spec(flat, keys=keys)
    flat = _optimize_slices(flat)
    if templates and not annotated:  # (annotations are per key: see tree_fuse)
        flat = tree_fuse.fuse_reduction_leaves(flat, keys, templates)
    return flat


def _optimize_slices(dsk: dict[Key, Any]) -> dict[Key, Any]:
    """``dask.array.optimization._optimize_slices(dsk)``: Dask's, unless no task's
    inner graph holds a getter. Dask's walks the inner graph of every fused task
    (``_execute_subgraph``), in place, to fuse its getters: one that holds none is only
    read, and the result is a copy of ``dsk``. A large layer's blocks share their
    template's inner graph (one object): it is looked at once, not once per block."""
    from dask._task_spec import Task, _execute_subgraph
    from dask.array.optimization import _is_getter_task
    from dask.array.optimization import _optimize_slices as dasks

    has_getter: dict[int, bool] = {}  # by id: every inner graph stays alive in dsk
    for v in dsk.values():
        if isinstance(v, Task) and v.func is _execute_subgraph:
            inner = v.args[0]
            found = has_getter.get(id(inner))
            if found is None:
                found = has_getter[id(inner)] = any(map(_is_getter_task, inner.values()))
            if found:
                return dasks(dsk)
    return dsk.copy()


def _fuse_roots(graph: Any, keys: list) -> Any:
    """``dask.blockwise.fuse_roots`` (this is its code), which materialises a Blockwise
    layer whose inputs are all root layers (``x + y`` of two ``from_array``) to fuse
    them: that layer's tasks come from :func:`expand_blockwise` where it can."""
    import tlz as toolz
    from dask.blockwise import Blockwise
    from dask.core import reverse_dict
    from dask.highlevelgraph import HighLevelGraph
    from dask.optimization import fuse
    from dask.utils import ensure_dict

    layers = ensure_dict(graph.layers, copy=True)
    dependencies = ensure_dict(graph.dependencies, copy=True)
    dependents = reverse_dict(dependencies)

    for name, layer in graph.layers.items():
        deps = graph.dependencies[name]
        if (
            isinstance(layer, Blockwise)
            and len(deps) > 1
            and not any(dependencies[dep] for dep in deps)  # no need to fuse if 0 or 1
            and all(len(dependents[dep]) == 1 for dep in deps)
            and all(layer.annotations == graph.layers[dep].annotations for dep in deps)
        ):
            expanded = expand_blockwise(layer)
            tasks = layer if expanded is None else expanded
            new = toolz.merge(tasks, *[layers[dep] for dep in deps])
            new, _ = fuse(new, keys, ave_width=len(deps))

            for dep in deps:
                del layers[dep]
                del dependencies[dep]

            layers[name] = new
            dependencies[name] = set()

    return HighLevelGraph(layers, dependencies)


def _cull(hlg: Any, keys: Any) -> Any:
    """``HighLevelGraph.cull`` (this is its code), except for a Blockwise layer that
    reads no other layer's blocks (its indexed inputs are all ``io_deps``: ``ones``,
    ``random``, ``from_array``'s slices): Dask's ``Blockwise.cull`` computes a set of
    dependencies for every block of it, from which only the layer's constant
    dependencies come out. :func:`_cull_reading_no_blocks` gives the same layer and
    the same keys to look for further."""
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph
    from dask.tokenize import tokenize

    keys_set = set(flatten(keys))
    if not any(layer.has_legacy_tasks for layer in hlg.layers.values()):
        all_ext_keys: set = set()
    else:
        all_ext_keys = hlg.get_all_external_keys()
    ret_layers: dict = {}
    layer_dependencies = {}
    tok = tokenize(keys_set)
    for layer_name in reversed(hlg._toposort_layers()):
        new_layer_name = f"{layer_name}-{tok}"
        layer = hlg.layers[layer_name]
        if keys_set:
            shortcut = _cull_reading_no_blocks(layer, keys_set)
            if shortcut is not None:
                culled_layer, outputs, deps = shortcut
                if not outputs:
                    continue
                keys_set |= deps
                keys_set -= outputs
            else:
                culled = reduction_expand.cull_materialized(layer, keys_set, all_ext_keys)
                if culled is None:
                    culled = layer.cull(keys_set, all_ext_keys)
                culled_layer, culled_deps = culled
                if not culled_deps:
                    continue
                for k, d in culled_deps.items():
                    keys_set |= d
                    keys_set.discard(k)
            layer = culled_layer
        ret_layers[new_layer_name] = layer
        layer_dependencies[new_layer_name] = hlg.dependencies[layer_name]
    ret_layers_keys = set(ret_layers.keys())
    ret_dependencies = {
        layer_name: layer_dependencies[layer_name] & ret_layers_keys for layer_name in ret_layers
    }
    return HighLevelGraph(ret_layers, ret_dependencies)


def _cull_reading_no_blocks(layer: Any, keys: set) -> tuple[Any, set, set] | None:
    """``(culled layer, its output keys kept, their dependencies)`` as
    ``Blockwise.cull`` gives them, for a Blockwise layer that reads no blocks of
    another layer (its every block depends on the same keys); None for another layer.
    (Dask adds each block's dependencies and then removes the block's own key, one
    block after another: the same as all at once, since a block never depends on its
    own layer's keys; where one would, Dask's way is taken.)"""
    from dask._task_spec import TaskRef
    from dask.blockwise import Blockwise

    if type(layer) is not Blockwise:
        return None
    io_deps = layer.io_deps
    const_deps = set()
    for arg, ind in layer.indices:
        if ind is None:
            if isinstance(arg, TaskRef):
                const_deps.add(arg.key)
        elif arg not in io_deps:
            return None  # reads another layer's blocks: Dask's way
    if any(dep.produces_keys for dep in io_deps.values()):
        return None
    output = layer.output
    # Dask's output keys, ``{(output, *block) for block in blocks}`` (``blocks``: the
    # set of ``key[1:]`` of the keys in the layer): a tuple key is such a key itself;
    # the blocks are only made where the layer is culled (their order is the layer's).
    outputs: set = set()
    for key in keys:
        if key[0] == output:
            outputs.add(key if type(key) is tuple else (output, *key[1:]))
    if const_deps & outputs:
        return None
    full = 1
    for i in layer.output_indices:
        full *= layer.dims[i]
    if full == len(outputs):
        culled = layer
    else:
        output_blocks: set[tuple[int, ...]] = set()
        for key in keys:
            if key[0] == output:
                output_blocks.add(key[1:])
        culled = layer._cull(output_blocks)
    return culled, outputs, const_deps if outputs else set()


def expand_layers(hlg: Any, templates: dict[str, Template] | None = None) -> dict[Key, Any]:
    """``dask.utils.ensure_dict(hlg)``: every layer's tasks in one dict, in layer order
    (a later layer's task replaces an earlier one of the same key), Blockwise layers
    through :func:`expand_blockwise` where it can (``templates``: as for
    :func:`materialize`)."""
    out: dict[Key, Any] = {}
    seen: set[int] = set()
    for layer in hlg.layers.values():
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        expanded = expand_blockwise(layer, templates)
        out.update(layer if expanded is None else expanded)
    return out


def expand_blockwise(
    layer: Any, templates: dict[str, Template] | None = None
) -> dict[Key, Any] | None:
    """The tasks of a ``Blockwise`` layer, exactly as Dask's ``_make_blockwise_graph``
    makes them; None for a layer it does not reproduce (the caller uses Dask's). A
    layer of at least ``layer_encode.MIN_BLOCKS`` blocks whose tasks are its template
    with their own values in place leaves its :class:`LayerTemplate` in ``templates``."""
    from dask._task_spec import DataNode, GraphNode, Task, TaskRef, parse_input
    from dask.blockwise import (
        Blockwise,
        _get_coord_mapping,
        _lol_product,
        blockwise_token,
    )
    from dask.layers import ArrayChunkShapeDep

    if type(layer) is not Blockwise or layer.is_materialized():
        return None
    task = layer.task
    if type(task) is not Task or layer.concatenate is True:
        return None
    indices = layer.indices
    tokens = [blockwise_token(i) for i in range(len(indices))]
    token_set = set(tokens)
    dims = layer.dims
    out_indices = layer.output_indices
    coord_maps, concat_axes, dummies = _get_coord_mapping(
        dims, out_indices, layer.numblocks, indices, None
    )
    io_deps: Any = layer.io_deps
    wanted = task.dependencies
    # A placeholder's final node in the task (what ``TaskRef.substitute`` makes of the
    # value Dask substitutes): the same for every block (literals, broadcast keys) ...
    constants: dict[str, Any] = {}
    # ... or per block, in Dask's order: (token, coordinate map, argument, how), how
    # being "io" (a BlockwiseDep's value), "shape" (an ArrayChunkShapeDep's: the
    # argument is its chunks), "key" (a block's key) or "lol" (a contraction: a List
    # of the blocks' keys).
    per_block: list[tuple[str, list[int], Any, str]] = []
    for cmap, axes, (arg, ind), token in zip(coord_maps, concat_axes, indices, tokens, strict=True):
        if token not in wanted:
            continue  # Dask skips these too
        if ind is None:
            value = arg if isinstance(arg, GraphNode | TaskRef) else DataNode(None, arg)
            if _touches(value, token_set):
                return None
            constants[token] = _placed(token, value)
        elif arg in io_deps:
            dep = io_deps[arg]
            if type(dep) is ArrayChunkShapeDep:  # ``ones``, ``zeros``, ``full``: see below
                per_block.append((token, cmap, dep.chunks, "shape"))
            else:
                per_block.append((token, cmap, dep, "io"))
        elif axes:
            per_block.append((token, cmap, arg, "lol"))
        else:
            per_block.append((token, cmap, arg, "key"))
    slots = _direct_slots(task, token_set)
    func, producer = task.func, task.data_producer
    output = layer.output
    output_blocks = layer.output_blocks or list(
        itertools.product(*[range(dims[i]) for i in out_indices])
    )
    if templates is not None and slots is not None and len(output_blocks) >= MIN_BLOCKS:
        templates[output] = _layer_template(task, slots, constants)
    per_block_tokens = [token for token, _, _, _ in per_block]
    build = None  # how a block's Task is built (after the first, see _direct_builder)
    out: dict[Any, Any] = {}
    for out_coords in output_blocks:
        coords = out_coords + dummies
        nodes = dict(constants)
        for token, cmap, arg, how in per_block:
            arg_coords = _input_coords(coords, cmap)
            if how == "key":
                nodes[token] = TaskRef((arg, *arg_coords))
            elif how == "io" or how == "shape":
                if how == "shape":
                    # ArrayChunkShapeDep.get(arg_coords, arg_coords) (Dask's code, its
                    # generator a list, without two calls per block); ``arg``: its chunks
                    try:
                        raw = tuple([chunk[i] for i, chunk in zip(arg_coords, arg)])
                    except KeyError:
                        raw = arg_coords
                else:
                    raw = arg.get(arg_coords, arg_coords)
                t = type(raw)
                if t in _PLAIN or (t is tuple and all(type(v) in _PLAIN for v in raw)):
                    nodes[token] = DataNode(token, raw)  # what parse_input leaves as it is
                    continue
                val = parse_input(raw)
                if not isinstance(val, GraphNode):
                    nodes[token] = DataNode(token, val)
                elif _touches(val, token_set):
                    return None
                else:
                    nodes[token] = val.substitute({}, key=token)
            else:
                nodes[token] = _lol_product((arg,), arg_coords, as_taskref=True)
        new_key = (output, *out_coords)
        if slots is None:
            # A placeholder inside a nested node: Dask's own substitution, all at once.
            out[new_key] = task.substitute(nodes, key=new_key)  # type: ignore[arg-type]
            continue
        arg_slots, kwarg_slots = slots
        args = list(task.args)
        for i, token in arg_slots:
            args[i] = nodes[token]
        kwargs = task.kwargs
        if kwarg_slots:
            kwargs = dict(kwargs)
            for name, token in kwarg_slots:
                kwargs[name] = nodes[token]
        if build is None:
            made = Task(new_key, func, *args, _data_producer=producer, **kwargs)
            # the first block: Dask's constructor, and the direct build where it gives
            # the same node (see _direct_builder)
            build = _direct_builder(made, args, kwargs, nodes, per_block_tokens, slots)
        else:
            made = build(new_key, args, kwargs, nodes)
        out[new_key] = made
    return out


def _direct_builder(
    made: Any,
    args: list,
    kwargs: dict,
    nodes: dict,
    per_block: list[str],
    slots: tuple[list[tuple[int, str]], list[tuple[str, str]]],
) -> Any:
    """A function building a block's ``Task`` of the layer with its slots set directly
    (``Task.__init__`` looks at every argument; here only those that can bring a
    dependency, in the same order), if it builds ``made`` (a block built by Dask's
    constructor) slot for slot; else Dask's constructor."""
    from dask._task_spec import DataNode, GraphNode, Task, TaskRef, _no_deps

    from shoal.client.graph.reduction_expand import _same_slots

    func, producer = made.func, made.data_producer
    varying = set(per_block)
    arg_slots, kwarg_slots = slots
    varying_args = {i for i, token in arg_slots if token in varying}
    varying_kwargs = {name for name, token in kwarg_slots if token in varying}

    def may_depend(a: Any) -> bool:
        return isinstance(a, TaskRef) or (isinstance(a, GraphNode) and bool(a.dependencies))

    # The arguments that can bring dependencies, in Dask's order: a set's iteration
    # order hangs on the order its items went in, and Dask's fusion walks it.
    arg_places = [i for i, a in enumerate(args) if i in varying_args or may_depend(a)]
    kwarg_places = [k for k, a in kwargs.items() if k in varying_kwargs or may_depend(a)]
    new: Any = object.__new__

    def direct(key: Any, args: list, kwargs: dict, nodes: dict) -> Any:
        # Task.__init__'s walk over the arguments (the same set operations in the same
        # order), over only those that can bring dependencies.
        deps: set | None = None
        for a in [*[args[i] for i in arg_places], *[kwargs[k] for k in kwarg_places]]:
            if type(a) is DataNode and not a._dependencies:
                continue  # (an io value, the usual per-block argument: nothing to add)
            if isinstance(a, TaskRef):
                if deps is None:
                    deps = {a.key}
                else:
                    deps.add(a.key)
            elif isinstance(a, GraphNode) and a.dependencies:
                if deps is None:
                    deps = set(a.dependencies)
                else:
                    deps.update(a.dependencies)
        node = new(Task)
        node.key, node.func, node.args, node.kwargs = key, func, tuple(args), dict(kwargs)
        node._dependencies = frozenset(deps) if deps else _no_deps
        node._is_coro = node._token = node._repr = None
        node._data_producer = producer
        return node

    def constructed(key: Any, args: list, kwargs: dict, nodes: dict) -> Any:
        return Task(key, func, *args, _data_producer=producer, **kwargs)

    if _same_slots(direct(made.key, args, kwargs, nodes), made):
        return direct
    return constructed


def _layer_template(
    task: Any,
    slots: tuple[list[tuple[int, str]], list[tuple[str, str]]],
    constants: dict[str, Any],
) -> LayerTemplate:
    """The layer's tasks as :func:`expand_blockwise` builds them on the direct path:
    the template's arguments, a placeholder taking the same node in every block
    (``constants``) already in place, the others per block."""
    arg_slots, kwarg_slots = slots
    args = list(task.args)
    kwargs = dict(task.kwargs)
    per_block = _fill_constants(args, arg_slots, constants)
    per_block_kw = _fill_constants(kwargs, kwarg_slots, constants)
    return LayerTemplate(task.func, args, kwargs, per_block, per_block_kw)


def _fill_constants(values: Any, slots: list[Any], constants: dict[str, Any]) -> list[Any]:
    """Put in ``values`` (a task's argument list or keyword dict) the nodes of the
    placeholders that are the same in every block; the places of the others."""
    per_block = []
    for where, token in slots:
        if token in constants:
            values[where] = constants[token]
        else:
            per_block.append(where)
    return per_block


# Values that Dask's ``parse_input`` returns unchanged, also as items of a plain tuple
# (a chunk's shape or slices, the usual values of an io_dep)
_PLAIN = frozenset({int, float, str, bytes, bool, type(None), slice})


def _input_coords(coords: tuple, cmap: list[int]) -> tuple:
    """An input's block coordinates for an output block (``coords``: the block's own,
    then Dask's dummies; ``cmap``: the input's positions in them)."""
    return tuple([coords[c] for c in cmap])


def _placed(token: str, value: Any) -> Any:
    """The node that ``TaskRef(token).substitute({token: value})`` gives."""
    from dask._task_spec import GraphNode, TaskRef

    if isinstance(value, GraphNode):
        return value.substitute({}, key=token)
    if isinstance(value, TaskRef):
        return value
    return TaskRef(value)


def _direct_slots(
    task: Any, tokens: set[str]
) -> tuple[list[tuple[int, str]], list[tuple[str, str]]] | None:
    """Where the template task's placeholders are, when each is an argument of its own
    (``TaskRef(token)`` as a positional or keyword argument): then a block's task is the
    template's arguments with those replaced, built in one ``Task(...)``. None when a
    placeholder sits inside a nested node."""
    from dask._task_spec import GraphNode, TaskRef

    arg_slots: list[tuple[int, str]] = []
    kwarg_slots: list[tuple[str, str]] = []
    places: list[tuple[Any, Any]] = [*enumerate(task.args), *task.kwargs.items()]
    for place, value in places:
        if type(value) is TaskRef and value.key in tokens:
            token: str = value.key
            if isinstance(place, int):
                arg_slots.append((place, token))
            else:
                kwarg_slots.append((place, token))
        elif isinstance(value, GraphNode | TaskRef) and _touches(value, tokens):
            return None
        elif isinstance(value, GraphNode) and value.key in tokens:
            return None  # e.g. an Alias named like a placeholder: Dask's substitution
    return arg_slots, kwarg_slots


def _touches(value: Any, tokens: set[str]) -> bool:
    """Whether a node depends on one of the layer's placeholders. (A substituted value
    that does cannot be placed all at once: Dask substitutes one argument after
    another, and a later substitution would reach into it.)"""
    deps = getattr(value, "dependencies", None)
    if deps is None:
        deps = {value.key} if hasattr(value, "key") else ()
    return any(d in tokens for d in deps)
