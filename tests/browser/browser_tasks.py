"""Task functions for the browser tests (workers import them by name)."""

from __future__ import annotations

import time


def slow_inc(x: int, delay: float = 0.05) -> int:
    time.sleep(delay)
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


def fail(x: int) -> int:
    raise ValueError(f"bad input {x}")
