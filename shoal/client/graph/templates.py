"""Task payloads encoded once per layer: a pickled template plus per-task msgpack slots.

The tasks of one Dask layer share their function and the structure of their arguments
(a fused subgraph's inner tasks are the very same objects in every block); what
differs are the keys, dependencies and small values. So a task's arguments are taken
apart into

* a *shape*: containers (tuple, list, dict, nested calls), ``str`` dict keys by value,
  and every other object (functions, Dask tasks, arrays, dtypes, ...) by identity, and
* its *slots*: the plain values in it (str, int, float, bool, None, bytes, numpy
  scalars) and its references (dependencies, futures), in order.

The second task of a shape (the first is encoded as it is: a shape met once is no
layer) pickles its arguments once with each slot as a placeholder: the template, an
entry of the function table (sent to the scheduler once, loaded by a worker once). Every task of that shape is then the template's id and its own slots
(msgpack, :mod:`shoal.protocol.plain_codec`): no pickling per task, and a payload of a
few dozen bytes. The worker decodes the slots and unpickles the template with them in
place (``serialize.TEMPLATE``): what the task's own pickle would have given.

A cache lives for one graph only: its objects cannot change while the graph is encoded,
but may between two graphs (an array mutated in place), whose identity would then
wrongly select the old template. A graph whose tasks do not share shapes (few hits
after many misses) turns it off; templates larger than ``MAX_TEMPLATE_BYTES`` (big
objects in the arguments) are not made, as the function table is never pruned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from shoal.protocol import plain_codec
from shoal.protocol.calls import Build, Call
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

MAX_TEMPLATES = 4_096  # templates per graph (each holds its objects alive)
MAX_TEMPLATE_BYTES = 64 * 1024
GIVE_UP_MISSES = 256  # after this many misses with fewer hits, stop trying for the graph

_SLOT = 0
_KEY = object()  # in a flat shape: a dict key that is not a str, its shape follows
_PLAIN_SLOT_TYPES = frozenset({str, bytes, bool, int, float, type(None)})


class _Unshapeable(Exception):
    """Arguments a template cannot reproduce exactly (a container met twice)."""


class _Template(NamedTuple):
    template_id: str  # its function-table id; "" when too large to be one
    deps: tuple[Key, ...]  # references inside the template's own objects
    funcs: list[str]  # the template's id and the function ids it holds
    pinned: list[Any]  # the objects the shape names by identity, kept alive


class LayerTemplates:
    """Template encoding for the tasks of one graph."""

    def __init__(
        self,
        functions: FunctionTable,
        ref_types: dict[type, Callable[[Any], Key]],
        reducers: Reducers | None = None,
    ):
        self.functions = functions
        self.ref_types = ref_types
        self.reducers = reducers
        self._templates: dict[Any, _Template] = {}
        self._seen_once: dict[Any, list[Any]] = {}  # shapes met once: pinned objects
        self.hits = 0
        self.misses = 0
        self.enabled = True

    def encode(self, func_id: str, args: tuple, kwargs: dict) -> TaskArgs | None:
        """The task's arguments as a template payload, or None (encode them otherwise)."""
        if not self.enabled:
            return None
        slots: list[Any] = []
        pinned: list[Any] = []
        seen: set[int] = set()
        flat: list[Any] = [func_id]
        try:
            self._walk(args, flat, slots, pinned, seen)
            self._walk(kwargs, flat, slots, pinned, seen)
        except _Unshapeable:
            return None
        shape = tuple(flat)
        if not pinned:  # only plain values: plain msgpack carries them (or pickle)
            return None
        template = self._templates.get(shape)
        if template is None:
            self.misses += 1
            if self.misses >= GIVE_UP_MISSES and self.hits < self.misses:
                self.enabled = False
            if self._seen_once.pop(shape, None) is None:
                # A shape met once is encoded as it is: only one that recurs (a layer)
                # becomes a template, so that tasks of their own (each a different
                # object in its arguments) leave no entries in the function table, which
                # is never pruned. The pinned objects keep the shape's ids valid.
                self._seen_once[shape] = pinned
                return None
            if len(self._templates) >= MAX_TEMPLATES:
                return None
            template = self._make(args, kwargs, pinned)
            self._templates[shape] = template
        else:
            self.hits += 1
        if not template.template_id:
            return None
        deps = list(template.deps)
        try:
            slot_bytes = plain_codec.dumps(slots, self.ref_types, deps)
        except plain_codec.NotPlain:  # e.g. an int past 64 bits
            return None
        data = template_payload(template.template_id, slot_bytes)
        return TaskArgs(Payload(TEMPLATE, data), deps, template.funcs)

    def _walk(
        self, obj: Any, shape: list[Any], slots: list[Any], pinned: list[Any], seen: set[int]
    ) -> None:
        """Append ``obj``'s shape to ``shape``, flat: its tree in pre-order, each node a
        label (``_SLOT``, a container type, ``Call``, ``Build``, ``"o"``/``"f"``: an
        object/function by identity) followed by its size or id, so that equal flat
        shapes are equal trees. One flat tuple hashes and compares much faster than
        nested ones (a dict lookup per task)."""
        t = type(obj)
        if t in _PLAIN_SLOT_TYPES or t in self.ref_types:
            slots.append(obj)
            shape.append(_SLOT)
        elif t is tuple or t is list:
            if t is list:
                if id(obj) in seen:  # pickle would keep the two places one object
                    raise _Unshapeable
                seen.add(id(obj))
            shape.append(t)
            shape.append(len(obj))
            ref_types = self.ref_types
            for x in obj:
                tx = type(x)
                if tx in _PLAIN_SLOT_TYPES or tx in ref_types:  # most items: no call
                    slots.append(x)
                    shape.append(_SLOT)
                else:
                    self._walk(x, shape, slots, pinned, seen)
        elif t is dict:
            if id(obj) in seen:
                raise _Unshapeable
            seen.add(id(obj))
            shape.append(dict)
            shape.append(len(obj))
            for k, v in obj.items():
                # str keys (names in a fused subgraph) are the shape's own: by value;
                # any other key is a shape of its own, after a label no str equals
                if type(k) is str:
                    shape.append(k)
                else:
                    shape.append(_KEY)
                    self._walk(k, shape, slots, pinned, seen)
                self._walk(v, shape, slots, pinned, seen)
        elif t is Call:
            shape.append(Call)
            self._walk(obj.func, shape, slots, pinned, seen)
            self._walk(obj.args, shape, slots, pinned, seen)
            self._walk(obj.kwargs, shape, slots, pinned, seen)
        elif t is Build:
            shape.append(Build)
            shape.append(obj.kind)
            self._walk(obj.items, shape, slots, pinned, seen)
        elif t is TableFunction:
            pinned.append(obj.func)
            shape.append("f")
            shape.append(id(obj.func))
        elif plain_codec.is_numpy_scalar(t):
            slots.append(obj)
            shape.append(_SLOT)
        else:
            pinned.append(obj)
            shape.append("o")
            shape.append(id(obj))

    def _make(self, args: tuple, kwargs: dict, pinned: list[Any]) -> _Template:
        counter = [0]
        body = (self._placeholders(args, counter), self._placeholders(kwargs, counter))
        made = template_body(body, self.ref_types, self.functions, self.reducers)
        pickled = made.payload.data
        if len(pickled) > MAX_TEMPLATE_BYTES:
            return _Template("", (), [], pinned)
        template_id = self.functions.register_template(pickled)
        funcs = list(dict.fromkeys([template_id, *made.funcs]))
        return _Template(template_id, tuple(made.deps), funcs, pinned)

    def _placeholders(self, obj: Any, counter: list[int]) -> Any:
        """``obj`` with every slot replaced by a :class:`Slot`, in :meth:`_shape`'s order."""
        t = type(obj)
        if t in _PLAIN_SLOT_TYPES or t in self.ref_types or plain_codec.is_numpy_scalar(t):
            counter[0] += 1
            return Slot(counter[0] - 1)
        if t is tuple:
            return tuple(self._placeholders(x, counter) for x in obj)
        if t is list:
            return [self._placeholders(x, counter) for x in obj]
        if t is dict:
            out = {}
            for k, v in obj.items():
                pk = k if type(k) is str else self._placeholders(k, counter)
                out[pk] = self._placeholders(v, counter)
            return out
        if t is Call:
            return Call(
                self._placeholders(obj.func, counter),
                self._placeholders(obj.args, counter),
                self._placeholders(obj.kwargs, counter),
            )
        if t is Build:
            return Build(obj.kind, self._placeholders(obj.items, counter))
        return obj
