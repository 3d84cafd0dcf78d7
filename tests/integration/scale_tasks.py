"""Task functions for the scale and adapt tests (workers import them by name)."""

from __future__ import annotations

import os
import time


def record(x: int, path: str, seconds: float = 0.0, size: int = 1000) -> list[int]:
    """Note that this task ran (a line in ``path``), take ``seconds``, and return
    ``size`` numbers (data for retirement to copy)."""
    with open(path, "a") as f:
        f.write(f"{x}\n")
    time.sleep(seconds)
    return [x] * size


def runs(path: str) -> list[int]:
    """The tasks ``record`` ran, in the order they ran, from this process."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f if line.strip()]
