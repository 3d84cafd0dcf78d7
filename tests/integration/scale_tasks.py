"""Task functions for the scale and adapt tests (workers import them by name)."""

from __future__ import annotations

import os
import time


def record(
    x: int,
    path: str,
    seconds: float = 0.0,
    size: int = 1000,
    gate: str | None = None,
    gate_deadline: float = 0.0,
) -> list[int]:
    """Note that this task ran (a line in ``path``), take ``seconds``, and return
    ``size`` numbers (data for retirement to copy).

    With ``gate``, then also wait until the file ``gate`` exists or the wall clock
    passes ``gate_deadline`` (``time.time()``), so that the load lasts until the test
    has seen what it waits for, however slowly new workers start."""
    with open(path, "a") as f:
        f.write(f"{x}\n")
    time.sleep(seconds)
    while gate is not None and not os.path.exists(gate) and time.time() < gate_deadline:
        time.sleep(0.05)
    return [x] * size


def runs(path: str) -> list[int]:
    """The tasks ``record`` ran, in the order they ran, from this process."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f if line.strip()]
