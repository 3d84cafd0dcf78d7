"""Task functions for test_dask_collections.py that leave a trace in files.

Workers are separate processes, so counting calls and recording execution order goes
through files: each call appends one line (small ``O_APPEND`` writes do not interleave).
Workers import this module by name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def append_line(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def read_lines(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.exists():
        return []
    return p.read_text().splitlines()


def wait_for_line(path: str | Path, line: str, timeout: float = 30.0) -> None:
    """Block (in the test process) until ``path`` holds ``line``."""
    deadline = time.monotonic() + timeout
    while line not in read_lines(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{line!r} never appeared in {path}: {read_lines(path)!r}")
        time.sleep(0.02)


def record(path: str, tag: str) -> str:
    """Append ``tag`` to the log at ``path``; return it."""
    append_line(path, tag)
    return tag


def counted_double(block, path: str):
    """``map_blocks`` function: one line per call (with the block's first value)."""
    append_line(path, f"{os.getpid()} {block.ravel()[0] if block.size else '-'}")
    return block * 2


def counted_inc(x: int, path: str) -> int:
    append_line(path, f"{os.getpid()} {x}")
    return x + 1


def record_then_wait(path: str, tag: str, stop: str, timeout: float = 30.0) -> str:
    """Log ``tag`` (so the test knows the task started), then hold the thread until
    ``stop`` exists."""
    append_line(path, tag)
    deadline = time.monotonic() + timeout
    while not os.path.exists(stop):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stop} never appeared")
        time.sleep(0.02)
    return tag


def flaky(counter: str, failures: int) -> str:
    """Fail the first ``failures`` calls (counted in the file ``counter``)."""
    append_line(counter, "attempt")
    n = len(read_lines(counter))
    if n <= failures:
        raise RuntimeError(f"flaky attempt {n}")
    return f"ok after {n} attempts"


class UnpickleCounter:
    """Appends the unpickling process's pid to ``path`` each time it is unpickled: a
    function that closes over one shows how often that function is deserialised."""

    def __init__(self, path: str):
        self.path = path

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        append_line(self.path, str(os.getpid()))
