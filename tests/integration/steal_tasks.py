"""Task functions of the work-stealing tests (workers import them by name)."""

from __future__ import annotations

import os
import time


def work(data: bytes, seconds: float) -> int:
    """Sleep ``seconds`` (needing ``data``, so placed where it is); the worker's pid."""
    time.sleep(seconds)
    return os.getpid()


def getpid() -> int:
    return os.getpid()
