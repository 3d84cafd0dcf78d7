"""Tiny tasks run on the worker's event loop, with no hand-off to a task thread.

A task handed to a thread costs two thread switches (loop -> thread -> loop), tens of
microseconds each, and on a busy machine each woken thread waits for a CPU: for a task
that runs in a microsecond (``dask.delayed(sum)([1, 2, 3])``) that is most of the
worker's share of a compute. Such a task runs on the loop instead, in the same
``TaskThreadMixin._run_one`` the threads use, so that its result, its error and its
traceback, its ``start``/``stop`` and its events into the state machine are the same.

The rule (``runs_on_loop``) must be safe for any task, so it is an allow-list, not a
guess from measured durations (a function that was fast a thousand times may wait on a
lock, a future or the scheduler the next time, and on the loop that wait could never end:
the loop is what would deliver the answer). A task runs on the loop only when all of
these hold, checked before it runs:

- its function, already loaded by this worker, *is* one of ``LOOP_SAFE_FUNCTIONS``: a
  few builtins and ``operator`` functions implemented in C that call no user code on
  the argument types below, take no locks, do no I/O and never block. Functions whose
  cost is not bounded by their arguments' size are left out (``operator.mul``:
  ``[0] * 10**9``; ``pow``, ``round``, shifts, ``%`` formatting), as is anything that
  could look at the thread it runs on (``get_client``, ``secede``, ``worker_client``
  and every other Python function: none is on the list);
- its arguments are msgpack-encoded (plain values, no pickle: nothing is imported or
  unpickled on the loop) in at most ``MAX_PAYLOAD_BYTES``, and every dependency they
  name is in this worker's memory, not spilled (no disk read on the loop);
- once decoded, with dependencies filled in, they are exactly (``type(x) is ...``, so
  no subclass with its own ``__add__`` or ``__eq__``) ``None``, ``bool``, ``int`` of at
  most 64 bits, ``float``, ``complex``, ``str``/``bytes`` of at most ``MAX_TEXT``
  characters, and lists/tuples of those, at most ``MAX_ITEMS`` values in all, with no
  keyword arguments. Every allowed function then runs in time bounded by a small
  polynomial of ``MAX_ITEMS`` (``sum`` of lists is the worst: quadratic), microseconds.

Anything else, including the first run of a function this worker has not loaded yet,
goes to a task thread as before. Nothing the state machine sees changes: it issued the
``Execute`` (counting the thread slot, resources and the ready queue as always) and
gets the ``ExecuteSuccess``/``ExecuteFailure`` after the current batch of instructions,
as if a thread had answered at once. ``shoal.worker.tiny-tasks-on-loop: false`` turns
this off.
"""

from __future__ import annotations

import operator
from typing import Any

from shoal import config
from shoal.protocol.serialize import MSGPACK

# Builtins and operator functions that never call back into Python code for the argument
# types allowed below, never block, and cost at most polynomially in their arguments' size.
LOOP_SAFE_FUNCTIONS = (
    sum,
    len,
    min,
    max,
    abs,
    any,
    all,
    sorted,
    bool,
    float,
    tuple,
    list,
    operator.add,
    operator.sub,
    operator.truediv,
    operator.floordiv,
    operator.neg,
    operator.pos,
    operator.abs,
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.not_,
    operator.truth,
    operator.getitem,
    operator.contains,
)
_SAFE_BY_ID = {id(f): f for f in LOOP_SAFE_FUNCTIONS}

MAX_PAYLOAD_BYTES = 4096  # the encoded arguments (which bounds the decoding)
MAX_ITEMS = 256  # scalars and containers in all the arguments, dependencies included
MAX_TEXT = 256  # characters of a str, bytes of a bytes
MAX_INT_BITS = 64

_SCALARS = frozenset({type(None), bool, float, complex})
_TEXTS = frozenset({str, bytes})
_CONTAINERS = frozenset({list, tuple})


def loop_safe_function(func: Any) -> bool:
    """Whether ``func`` is one of ``LOOP_SAFE_FUNCTIONS`` (identity, not equality)."""
    return func is not None and _SAFE_BY_ID.get(id(func)) is func


def small_plain_arguments(args: tuple, kwargs: dict) -> bool:
    """Whether ``args`` are small plain values (see the module docstring), ``kwargs`` none."""
    if kwargs:
        return False
    budget = MAX_ITEMS
    stack: list[Any] = [args]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            return False
        kind = type(value)
        if kind in _SCALARS:
            continue
        if kind is int:
            if value.bit_length() > MAX_INT_BITS:
                return False
        elif kind in _TEXTS:
            if len(value) > MAX_TEXT:
                return False
        elif kind in _CONTAINERS:
            if len(value) > budget:
                return False
            stack.extend(value)
        else:
            return False
    return True


def tiny_tasks_on_loop_enabled() -> bool:
    """``shoal.worker.tiny-tasks-on-loop``, checked once per worker."""
    value = config.get("worker.tiny-tasks-on-loop")
    if type(value) is not bool:
        raise ValueError(f"shoal.worker.tiny-tasks-on-loop must be true or false, not {value!r}")
    return value


def runs_on_loop(
    func: Any,
    payload: Any,
    dependencies: Any,
    in_memory: Any,
    load_arguments: Any,
) -> bool:
    """Whether a task may run on the loop: ``func`` is its loaded function (None: not
    loaded yet), ``payload`` its encoded arguments, ``dependencies`` its dependencies,
    ``in_memory(dependency)`` whether its value is in memory (not spilled), ``load_arguments()``
    decodes its arguments (raising if it cannot: the task then goes to a thread, which
    raises the same error as its result)."""
    if func is None or not loop_safe_function(func):
        return False
    if payload.kind != MSGPACK or len(payload.data) > MAX_PAYLOAD_BYTES:
        return False
    for dependency in dependencies:
        if not in_memory(dependency):
            return False
    try:
        args, kwargs = load_arguments()
    except Exception:
        return False
    return small_plain_arguments(args, kwargs)
