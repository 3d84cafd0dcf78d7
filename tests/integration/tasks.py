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
