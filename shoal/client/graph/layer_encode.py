"""Tasks of an expanded layer encoded straight from the layer's template.

:mod:`shoal.client.graph.blockwise_expand` builds every block of a large Blockwise layer as
the layer's template task with its per-block arguments put in place (a dependency's
``TaskRef``, an io value's ``DataNode``); every other argument is the very same object
in all blocks. The generic encoder (:mod:`shoal.client.graph.templates`) rediscovers that
structure per task by walking each task's arguments. A :class:`LayerTemplate` records
it instead, and :class:`LayerEncoder` encodes a task of the layer as the template's
pickle (made once per layer, a function-table entry, as for the generic templates) plus
the msgpack of the task's per-block values only.

A reduction tree's layer (``reduction_expand``) has a :class:`ReductionTemplate`: each
task applies the layer's function to a list of its input keys, which is its one value.
One whose leaves were fused in (``tree_fuse``) has a :class:`FusedReductionTemplate`:
a task of ``k`` leaves is encoded as the template for ``k`` (the reduction's call on
the leaf layer's call ``k`` times, each with its own slots), registered once per
``k``, and the ``k`` leaves' per-block values one after another. A level fused over a
fused level nests the same way: its template is per shape (the tuple of its inputs'
shapes). A reduction over several axes lists its inputs as lists of lists
(``partial_reduce``): such a task's shape is ``(NESTED, (its lists' shapes))``, and
its template has the same lists of lists of calls.

No identity of task objects is trusted: a task is encoded this way only when it *is*
the template with other values at the per-block places (the same function, the same
number of arguments and keyword names, every other argument the template's own object,
by identity), so a task that a later step replaced (linear fusion, slice fusion, an
alias skipped) or one the expansion never made is encoded the generic way; so is a
task whose per-block values are not plain (msgpack cannot carry them exactly).
Layers of fewer than ``MIN_BLOCKS`` blocks are left to the generic encoder: their
template holds the layer's names and constants, and the function table is never
pruned.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from copy import deepcopy
from typing import Any

from shoal.protocol import plain_codec
from shoal.protocol.calls import Call, run_nested
from shoal.protocol.messages import Key, Payload
from shoal.protocol.serialize import (
    TEMPLATE,
    FunctionTable,
    Reducers,
    Slot,
    TableFunction,
    TaskArgs,
    template_body,
    template_payload,
)

MIN_BLOCKS = 256  # a smaller layer takes the generic encoder
# The tag of a reduction's list of lists in a fused task's shape: ``(NESTED, (the
# lists' shapes))`` (a reduction over several axes lists its inputs so).
NESTED = "nested"
MAX_TEMPLATE_BYTES = 64 * 1024  # as templates.py: larger templates are not made
MAX_CACHED_VALUES = 4096  # distinct per-block values whose encoding a graph keeps


class LayerTemplate:
    """What the expansion knows of a layer's tasks: every task is ``task`` with its
    own values at ``arg_slots`` (positions) and ``kwarg_slots`` (names); ``args`` and
    ``kwargs`` are the objects at every other place (the same in every task)."""

    __slots__ = ("func", "args", "kwargs", "arg_slots", "kwarg_slots", "arg_constants")

    def __init__(
        self,
        func: Any,
        args: list[Any],
        kwargs: dict[str, Any],
        arg_slots: list[int],
        kwarg_slots: list[str],
    ):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.arg_slots = arg_slots
        self.kwarg_slots = kwarg_slots
        slotted = set(arg_slots)
        self.arg_constants = [i for i in range(len(args)) if i not in slotted]


class ReductionTemplate:
    """What the conversion of a reduction's legacy tasks knows of a layer's tasks
    (``reduction_expand``): each is ``Task(key, func, Task(None, _identity_cast,
    Alias(k1), ..., typ=list))``, the keys its own."""

    __slots__ = ("func",)

    def __init__(self, func: Any):
        self.func = func


class FusedReductionTemplate:
    """A reduction layer whose tasks had their leaves fused in (``tree_fuse``): each is
    ``Task(key, func, Task(None, _identity_cast, leaf1, ..., leafk, typ=list))`` (or
    that list a list of such lists, over several axes), each
    ``leafi`` a task of the ``leaf`` layer's template with its own values in place
    (its key, no longer one of the graph's, is not sent). Its tasks left unfused keep
    the :class:`ReductionTemplate` shape."""

    __slots__ = ("func", "leaf")

    def __init__(self, func: Any, leaf: LayerTemplate | FusedReductionTemplate):
        self.func = func
        self.leaf = leaf


Template = LayerTemplate | ReductionTemplate | FusedReductionTemplate


class _Encoded:
    """A layer's template as sent: its function id, template id, and what it holds."""

    __slots__ = ("fid", "template_id", "deps", "funcs")

    def __init__(self, fid: str, template_id: str, deps: list[Key], funcs: list[str]):
        self.fid = fid
        self.template_id = template_id
        self.deps = deps
        self.funcs = funcs


class LayerEncoder:
    """Encodes the tasks of the layers in ``layers`` (by output name) for one graph."""

    def __init__(
        self,
        layers: dict[str, Template],
        functions: FunctionTable,
        ref_types: dict[type, Callable[[Any], Key]],
        reducers: Reducers,
        generic: Any,
        dep_type: Callable[[Key], Any],
    ):
        from dask._task_spec import Alias, DataNode, Task, TaskRef, _identity_cast

        self.layers = layers
        self.functions = functions
        self.ref_types = ref_types
        self.reducers = reducers
        # the GraphEncoder: its conversion of an argument (``_arg``), which sets its
        # ``_nested`` flag where an argument is an inline task
        self._generic = generic
        self._dep = dep_type
        self._made: dict[Hashable, _Encoded | None] = {}
        self._task_type: Any = Task
        self._taskref: Any = TaskRef
        self._datanode: Any = DataNode
        self._alias: Any = Alias
        self._identity_cast: Any = _identity_cast
        self.encoded = 0  # tasks encoded here (tests and benchmarks read it)
        # (layer, values) -> the task's encoding, for values of ints and strings
        # (_exact_key)
        self._data: dict[tuple[Hashable, tuple], tuple[str, TaskArgs]] = {}

    def encode(self, name: str, node: Any) -> tuple[str, TaskArgs] | None:
        """``(function id, arguments)`` of ``node`` (a task of layer ``name``), or None:
        encode it the generic way."""
        layer = self.layers.get(name)
        if layer is None or type(node) is not self._task_type or node.func is not layer.func:
            return None
        if isinstance(layer, ReductionTemplate):
            return self._encode_reduction(name, layer, node)
        if isinstance(layer, FusedReductionTemplate):
            return self._encode_fused(name, layer, node)
        values = self._values(layer, node)
        if values is None:
            return None
        return self._payload(name, layer, values)

    def _values(self, layer: LayerTemplate, node: Any) -> list[Any] | None:
        """The per-block values of ``node`` if it is ``layer``'s template with its own
        values in place (see the module's docstring), else None."""
        args = node.args
        template_args = layer.args
        if len(args) != len(template_args):
            return None
        for i in layer.arg_constants:
            if args[i] is not template_args[i]:
                return None
        kwargs = node.kwargs
        if kwargs or layer.kwargs:
            if kwargs.keys() != layer.kwargs.keys():
                return None
            slotted = layer.kwarg_slots
            for k, v in layer.kwargs.items():
                if k not in slotted and kwargs[k] is not v:
                    return None
        values = [self._value(args[i]) for i in layer.arg_slots]
        values.extend([self._value(kwargs[k]) for k in layer.kwarg_slots])
        for v in values:
            if v is _NOT_PLAIN:
                return None
        return values

    def _encode_fused(
        self, name: str, layer: FusedReductionTemplate, node: Any
    ) -> tuple[str, TaskArgs] | None:
        """A reduction task with its leaves inlined: the template of its shape, and
        its leaves' per-block values one after another."""
        inner = self._reduction_inner(node)
        if inner is None:
            return None
        items = inner.args
        if items and type(items[0]) is self._alias:  # a task left unfused
            return self._encode_reduction(name, ReductionTemplate(layer.func), node)
        values: list[Any] = []
        shape = self._list_values(layer, items, values)
        if shape is None:
            return None
        return self._payload((name, shape), layer, values)

    def _list_values(
        self, layer: FusedReductionTemplate, items: tuple, values: list[Any]
    ) -> int | tuple | None:
        """:meth:`_fused_values` of a reduction's list ``items``, or, if ``items`` are
        lists themselves (inner keyless ``_identity_cast(..., typ=list)`` tasks: a
        reduction over several axes), of each of them: ``(NESTED, their shapes)``."""
        first: Any = items[0] if items else None
        if (
            type(first) is not self._task_type
            or first.key is not None
            or first.func is not self._identity_cast
        ):
            return self._fused_values(layer, items, values)
        shapes = []
        for sub in items:
            inner = self._list_inner(sub)
            if inner is None or inner.key is not None:
                return None
            shape = self._list_values(layer, inner.args, values)
            if shape is None:
                return None
            shapes.append(shape)
        return (NESTED, tuple(shapes))

    def _fused_values(
        self, layer: FusedReductionTemplate, items: tuple, values: list[Any]
    ) -> int | tuple | None:
        """Appends to ``values`` the per-block values of the leaves under ``items``
        (the inlined inputs of one of ``layer``'s tasks); returns their shape: the
        count of leaves over a leaf layer, the tuple of the inputs' shapes over a
        fused layer; None if a node is not of its template."""
        below = layer.leaf
        func = below.func
        task = self._task_type
        if type(below) is LayerTemplate:
            for t in items:
                if type(t) is not task or t.func is not func:
                    return None
                got = self._values(below, t)
                if got is None:
                    return None
                values.extend(got)
            return len(items)
        assert type(below) is FusedReductionTemplate
        shapes = []
        for t in items:
            inner = self._reduction_inner(t) if type(t) is task and t.func is func else None
            if inner is None:
                return None
            shape = self._list_values(below, inner.args, values)
            if shape is None:
                return None
            shapes.append(shape)
        return tuple(shapes)

    def _reduction_inner(self, node: Any) -> Any:
        """The inner ``_identity_cast(..., typ=list)`` task of a reduction task, or None."""
        args = node.args
        if len(args) != 1 or node.kwargs:
            return None
        return self._list_inner(args[0])

    def _list_inner(self, inner: Any) -> Any:
        """``inner`` if it is an ``_identity_cast(..., typ=list)`` task, else None."""
        if type(inner) is not self._task_type or inner.func is not self._identity_cast:
            return None
        kwargs = inner.kwargs
        if len(kwargs) != 1 or kwargs.get("typ") is not list:
            return None
        return inner

    def _encode_reduction(
        self, name: str, layer: ReductionTemplate, node: Any
    ) -> tuple[str, TaskArgs] | None:
        """A reduction task: its list of input keys is the one value."""
        inner = self._reduction_inner(node)
        if inner is None:
            return None
        alias = self._alias
        keys = []
        for a in inner.args:
            if type(a) is not alias:
                return None
            keys.append(a.target)
        made = self._template(name, layer)
        if made is None:
            return None
        try:  # what _payload makes of [tuple(Dep(key) for key in keys)], at once
            slot_bytes = plain_codec.dumps_key_tuple(keys)
        except plain_codec.NotPlain:
            return None
        self.encoded += 1
        data = template_payload(made.template_id, slot_bytes)
        return made.fid, TaskArgs(Payload(TEMPLATE, data), [*made.deps, *keys], made.funcs)

    def _template(self, name: Hashable, layer: Template) -> _Encoded | None:
        """The template of ``name``: a layer's name, or ``(name, arity)`` for a fused
        reduction's tasks of that many leaves."""
        if name in self._made:
            return self._made[name]
        made = self._made[name] = self._make(name, layer)
        return made

    def _payload(
        self, name: Hashable, layer: Template, values: list[Any]
    ) -> tuple[str, TaskArgs] | None:
        made = self._template(name, layer)
        if made is None:
            return None
        # Blocks often share their values (every chunk of ``ones`` has the same shape):
        # values of ints and strings (exactly: no 1.0 or True for 1) are encoded once,
        # and the task's arguments made once: a frozen Payload, and lists of
        # dependencies (the template's: such values hold no reference) and functions
        # that the GraphEncoder copies into each TaskSpec.
        cache_key = _exact_key(values)
        if cache_key is not None:
            cached = self._data.get((name, cache_key))
            if cached is not None:
                self.encoded += 1
                return cached
        deps = list(made.deps)
        try:
            slot_bytes = plain_codec.dumps(values, self.ref_types, deps)
        except plain_codec.NotPlain:
            return None
        self.encoded += 1
        data = template_payload(made.template_id, slot_bytes)
        out = made.fid, TaskArgs(Payload(TEMPLATE, data), deps, made.funcs)
        if cache_key is not None and len(self._data) < MAX_CACHED_VALUES:
            self._data[(name, cache_key)] = out
        return out

    def _value(self, node: Any) -> Any:
        """A per-block argument as the task sees it (as the generic encoder converts
        it); ``_NOT_PLAIN`` for anything but a reference or a literal."""
        t = type(node)
        if t is self._taskref:
            return self._dep(node.key)
        if t is self._datanode:
            return node.value
        return _NOT_PLAIN

    def _make(self, name: Hashable, layer: Template) -> _Encoded | None:
        if isinstance(layer, FusedReductionTemplate):
            assert type(name) is tuple
            return self._make_fused(layer, name[1])
        if isinstance(layer, ReductionTemplate):
            # as the generic encoder converts it: the inner task is a nested call
            keys: Any = Slot(0)  # the task's keys: a tuple, as the generic encoder's
            inner = Call(TableFunction(self._identity_cast), keys, {"typ": list})
            call = Call(TableFunction(layer.func), (inner,), {})
            return self._register(run_nested, ((call,), {}))
        return self._make_layer(layer)

    def _register(self, func: Any, body: tuple[tuple, dict]) -> _Encoded | None:
        fid = self.functions.register(func)
        made = template_body(body, self.ref_types, self.functions, self.reducers)
        pickled = made.payload.data
        if len(pickled) > MAX_TEMPLATE_BYTES:
            return None
        template_id = self.functions.register_template(pickled)
        funcs = list(dict.fromkeys([template_id, *made.funcs]))
        return _Encoded(fid, template_id, list(made.deps), funcs)

    def _make_layer(self, layer: LayerTemplate) -> _Encoded | None:
        """The layer's template: its arguments as the generic encoder converts them,
        a :class:`Slot` at each per-block place, pickled once (as ``_task_call`` makes
        a task's call: nested tasks run through ``run_nested``, partials taken apart)."""
        generic = self._generic
        generic._nested = False
        args, kwargs = self._converted(layer)
        func = layer.func
        if generic._nested:
            func, args, kwargs = run_nested, (Call(TableFunction(func), args, kwargs),), {}
        else:
            while _is_partial(func):
                args = func.args + args
                kwargs = {**func.keywords, **kwargs}
                func = func.func
        return self._register(func, (args, kwargs))

    def _converted(self, layer: LayerTemplate) -> tuple[tuple, dict]:
        """The layer's arguments as the generic encoder converts them, ``Slot(i)`` at
        its ``i``-th per-block place (positions first, then names)."""
        places: list[Any] = [*layer.arg_slots, *layer.kwarg_slots]
        slots: dict[Any, Slot] = {place: Slot(i) for i, place in enumerate(places)}
        convert = self._generic._arg
        args = tuple([slots[i] if i in slots else convert(a) for i, a in enumerate(layer.args)])
        kwargs = {k: slots[k] if k in slots else convert(v) for k, v in layer.kwargs.items()}
        return args, kwargs

    def _make_fused(self, layer: FusedReductionTemplate, shape: Any) -> _Encoded | None:
        """The template of a fused reduction task of ``shape`` (``_fused_values``): the
        reduction's call on a list of its inputs' calls, down to the leaf layer's call,
        each leaf with its own slots (the leaf's per-block places, numbered on from
        the previous leaf's)."""
        converted: dict[int, tuple[list[Any], tuple, dict]] = {}
        slot_count = 0

        def leaf_call(leaf: LayerTemplate) -> Call:
            nonlocal slot_count
            places: list[Any]
            if id(leaf) not in converted:
                places = [*leaf.arg_slots, *leaf.kwarg_slots]
                args, kwargs = self._converted(leaf)  # (its slots: the first leaf's)
                converted[id(leaf)] = places, args, kwargs
            else:
                # Each leaf's constants are objects of their own: a template holding
                # one object in two places is not planned on the worker (template_plan).
                # Dask's graph nodes stay shared, as the plan shares them (immutable):
                # every leaf's fused chain is then the same nodes, which the worker's
                # chain runner works out once (server/fused_chains.py), not per leaf.
                places, args, kwargs = converted[id(leaf)]
                try:
                    args, kwargs = deepcopy((args, kwargs), _graph_nodes((args, kwargs)))
                except Exception as e:
                    raise _NotCopyable from e
            slots = {place: Slot(slot_count + i) for i, place in enumerate(places)}
            slot_count += len(places)
            leaf_args = tuple([slots.get(i, a) for i, a in enumerate(args)])
            leaf_kwargs = {k: slots.get(k, v) for k, v in kwargs.items()}
            return Call(TableFunction(leaf.func), leaf_args, leaf_kwargs)

        def list_call(layer: FusedReductionTemplate, shape: Any) -> Call:
            items: list[Call]
            if type(shape) is tuple and shape and shape[0] == NESTED:
                items = [list_call(layer, s) for s in shape[1]]  # a list of lists
            elif type(layer.leaf) is LayerTemplate:
                items = [leaf_call(layer.leaf) for _ in range(shape)]
            else:
                below = layer.leaf
                assert type(below) is FusedReductionTemplate
                items = [reduction_call(below, s) for s in shape]
            return Call(TableFunction(self._identity_cast), tuple(items), {"typ": list})

        def reduction_call(layer: FusedReductionTemplate, shape: Any) -> Call:
            return Call(TableFunction(layer.func), (list_call(layer, shape),), {})

        try:
            call = reduction_call(layer, shape)
        except _NotCopyable:  # a constant that cannot be copied: the generic encoder
            return None
        return self._register(run_nested, ((call,), {}))


def _is_partial(func: Any) -> bool:
    import functools

    return isinstance(func, functools.partial)


def _exact_key(values: list[Any]) -> tuple | None:
    """``values`` as a dict key whose equality is the values' identity as encoded:
    only ints, strings and tuples of them (``1 == 1.0 == True`` would otherwise share
    an entry); None for other values."""
    for v in values:
        t = type(v)
        if t is tuple:
            for x in v:
                tx = type(x)
                if tx is not int and tx is not str:
                    return None
        elif t is not int and t is not str:
            return None
    return tuple(values)


_NOT_PLAIN = object()  # a per-block value this module does not encode


def _graph_nodes(obj: Any) -> dict[int, Any]:
    """Dask's graph nodes in ``obj`` (through containers and nested calls, not into
    the nodes), by id: a ``deepcopy`` memo that keeps them shared."""
    from dask._task_spec import GraphNode

    found: dict[int, Any] = {}
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, GraphNode):
            found[id(x)] = x
        elif type(x) is tuple or type(x) is list or type(x) is set:
            stack.extend(x)
        elif type(x) is dict:
            stack.extend(x.values())
        elif type(x) is Call:
            stack.extend(x.args)
            stack.extend(x.kwargs.values())
    return found


class _NotCopyable(Exception):
    """A leaf's constants cannot be copied for the next leaf of a fused template."""
