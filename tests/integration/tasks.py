"""Task functions shared by the integration tests (workers import them by name)."""

from __future__ import annotations

import os
import time


def wait_for_file(path: str, timeout: float = 30.0) -> str:
    """Run until ``path`` exists (so a test can hold a worker thread, then let it go)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)
    return "released"


def getpid(_: object = None) -> int:
    return os.getpid()


def die_with_sigkill(_: object = None) -> None:
    """Kill the worker process running this task, as a segfault or the OOM killer would."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def make_list(n: int) -> list[int]:
    return list(range(n))
