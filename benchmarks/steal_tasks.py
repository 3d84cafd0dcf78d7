"""Task functions of ``benchmarks/stealing.py`` (workers import them by name)."""

from __future__ import annotations

import os
import time


def chunk(nbytes: int) -> bytes:
    return b"x" * nbytes


def consume(data: bytes, seconds: float) -> tuple[int, float]:
    """Sleep ``seconds`` (the task's work; it needs ``data``, so locality places it);
    the worker's pid and the seconds it was busy."""
    start = time.perf_counter()
    time.sleep(seconds)
    return os.getpid(), time.perf_counter() - start
