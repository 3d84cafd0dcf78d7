"""The rule for running a task on the worker's loop (shoal/server/loop_tasks.py): only an
allow-listed C function, already loaded, on small plain msgpack arguments whose
dependencies are in memory. Everything else goes to a thread."""

from __future__ import annotations

import operator
import time
from typing import Any

import pytest

from shoal.protocol import messages as m
from shoal.protocol.serialize import MSGPACK, PICKLE
from shoal.server.loop_tasks import (
    LOOP_SAFE_FUNCTIONS,
    MAX_INT_BITS,
    MAX_ITEMS,
    MAX_PAYLOAD_BYTES,
    MAX_TEXT,
    loop_safe_function,
    runs_on_loop,
    small_plain_arguments,
)

SMALL = m.Payload(MSGPACK, b"\x92\x91\x93\x01\x02\x03\x80")


class MyInt(int):
    def __add__(self, other: Any) -> Any:  # user code: could do anything
        time.sleep(10)
        return 0


def my_sum(values: list[int]) -> int:
    return sum(values)


def test_only_the_listed_functions_themselves_are_safe() -> None:
    assert all(loop_safe_function(f) for f in LOOP_SAFE_FUNCTIONS)
    for unsafe in (my_sum, time.sleep, print, pow, round, operator.mul, operator.mod, None):
        assert not loop_safe_function(unsafe)
    assert not loop_safe_function(lambda *a: sum(*a))


@pytest.mark.parametrize(
    "args",
    [
        (),
        ([1, 2, 3],),
        (1, 2.5),
        ((None, True, 1j, "a" * MAX_TEXT, b"b"),),
        ([[1, 2], [3, (4, 5)]],),
        (2**MAX_INT_BITS - 1, -(2**MAX_INT_BITS - 1)),
        (list(range(MAX_ITEMS - 2)),),  # the args tuple and the list count too
    ],
)
def test_small_plain_arguments_are_accepted(args: tuple) -> None:
    assert small_plain_arguments(args, {})


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((2**MAX_INT_BITS,), {}),  # big ints: arithmetic on them is not bounded
        (("a" * (MAX_TEXT + 1),), {}),
        ((b"b" * (MAX_TEXT + 1),), {}),
        ((list(range(MAX_ITEMS)),), {}),
        (([[0] * 100] * 3,), {}),  # too many values in all, nested
        ((MyInt(1),), {}),  # a subclass runs user code
        (({"a": 1},), {}),
        (({1, 2},), {}),
        ((object(),), {}),
        (([1, 2],), {"start": 0}),  # keyword arguments (e.g. key=) are never allowed
    ],
)
def test_anything_else_is_refused(args: tuple, kwargs: dict) -> None:
    assert not small_plain_arguments(args, kwargs)


def test_runs_on_loop_checks_function_payload_dependencies_then_arguments() -> None:
    loaded: list[str] = []

    def load() -> tuple[tuple, dict]:
        loaded.append("loaded")
        return ([1, 2, 3],), {}

    def nothing_spilled(dep: Any) -> bool:
        return True

    assert runs_on_loop(sum, SMALL, [], nothing_spilled, load)
    # not loaded by this worker yet, or not listed: a thread (arguments never decoded)
    loaded.clear()
    assert not runs_on_loop(None, SMALL, [], nothing_spilled, load)
    assert not runs_on_loop(my_sum, SMALL, [], nothing_spilled, load)
    # pickled or large arguments: never decoded on the loop
    assert not runs_on_loop(sum, m.Payload(PICKLE, b"x"), [], nothing_spilled, load)
    big = m.Payload(MSGPACK, b"\x90" * (MAX_PAYLOAD_BYTES + 1))
    assert not runs_on_loop(sum, big, [], nothing_spilled, load)
    # a spilled dependency: reading it would touch the disk
    assert not runs_on_loop(sum, SMALL, ["dep"], lambda dep: False, load)
    assert loaded == []
    # arguments that fail to decode: the thread raises the error as the task's
    assert not runs_on_loop(sum, SMALL, [], nothing_spilled, lambda: {}["missing"])
    assert not runs_on_loop(sum, SMALL, [], nothing_spilled, lambda: (([2**80],), {}))
