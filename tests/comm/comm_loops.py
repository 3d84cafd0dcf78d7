"""Running a connection test's coroutine on the event loop it names (shared by the
tests/comm modules that run each case on asyncio and on uvloop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest


def run_on_loop(loop_kind: str, coro_fn: Callable[[], Any], timeout: float = 60) -> Any:
    """``coro_fn()`` run to its end on a new ``loop_kind`` loop ("asyncio" or "uvloop",
    skipped if uvloop is missing), bounded by ``timeout`` seconds."""
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()
    with runner:
        return runner.run(asyncio.wait_for(coro_fn(), timeout))
