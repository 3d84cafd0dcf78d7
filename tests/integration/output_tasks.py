"""Task functions of the task-output tests (workers import them by name)."""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings


class TaskWarning(UserWarning):
    """A category of our own: the client must raise this one, not a stand-in."""


def say(text: str) -> str:
    print(text)
    print(f"{text} (to stderr)", file=sys.stderr)
    return text


def log_it(text: str) -> str:
    logging.getLogger("shoal-test-task").warning("logged: %s", text)
    logging.getLogger("shoal-test-task").debug("below the level: %s", text)
    return text


def warn(text: str, times: int = 1) -> str:
    for _ in range(times):
        warnings.warn(text, TaskWarning, stacklevel=1)
    return text


def warn_runtime(text: str) -> str:
    warnings.warn(text, RuntimeWarning, stacklevel=1)
    return text


def flood(nbytes: int) -> int:
    line = "x" * 99
    for _ in range(nbytes // 100):
        print(line)
    return nbytes


_barrier = threading.Barrier(2, timeout=20)


def warn_together(text: str) -> str:
    """Two of these on one worker's two threads warn at the same time."""
    _barrier.wait()
    for _ in range(20):
        warnings.warn(text, TaskWarning, stacklevel=1)
        time.sleep(0.001)
    return text
