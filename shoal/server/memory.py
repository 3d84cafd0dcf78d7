"""Worker memory: the limit, its Dask-like thresholds, and the monitor that applies them.

Thresholds are fractions of the worker's memory limit:

- ``target`` (0.6): the bytes of results held in memory past which the least recently
  used go to disk (the SpillBuffer's own bookkeeping, checked on every store);
- ``spill`` (0.7): process memory (RSS) past which results go to disk until it is back
  under ``target``;
- ``pause`` (0.8): process memory past which the worker starts no task and fetches no
  data, until it is back under;
- ``terminate`` (0.95): process memory past which the nanny restarts the worker.

Any of them may be None: that threshold is off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable
from typing import NamedTuple

import psutil

from shoal.comm.buffer_pool import process_pool
from shoal.server.spill import SpillBuffer

logger = logging.getLogger("shoal.memory")

MONITOR_INTERVAL = 0.1  # seconds between two looks at the process memory
MAX_EVICT_SECONDS = 0.5  # spilling for longer than this per look would starve the loop

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}


class MemoryFractions(NamedTuple):
    target: float | None = 0.6
    spill: float | None = 0.7
    pause: float | None = 0.8
    terminate: float | None = 0.95


def parse_bytes(text: str) -> int:
    """``"4GiB"`` -> 4294967296, ``"200MB"`` -> 200000000, ``"2e9"`` -> 2000000000."""
    match = re.fullmatch(r"\s*([0-9._]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not an amount of memory: {text!r} (e.g. 4GiB, 200MB, 2e9)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def total_memory() -> int:
    return int(psutil.virtual_memory().total)


def parse_memory_limit(value: str | float | None, nthreads: int = 1) -> int | None:
    """Bytes from ``"4GiB"``/``"2e9"``/``"0.5"`` (a fraction of this machine)/``"auto"``
    (this machine's memory shared in proportion to threads); None from ``"0"``/``"none"``
    (no limit). Never more than the machine has."""
    total = total_memory()
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        share = min(1.0, nthreads / (os.cpu_count() or 1))
        return int(total * share)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "off", "false"):
            return None
        try:
            number = float(text)
        except ValueError:
            return min(total, parse_bytes(text)) or None
    else:
        number = float(value)
    if number < 0:
        raise ValueError(f"a memory limit cannot be negative: {value!r}")
    if 0 < number <= 1:
        return int(total * number)
    return min(total, int(number)) or None


def parse_fraction(value: str | float | None) -> float | None:
    """A threshold: a number in (0, 1], or None from ``"off"``/``"false"``/``0``."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in ("off", "false", "none"):
            return None
        value = float(value)
    if not 0 <= value <= 1:
        raise ValueError(f"a memory fraction is between 0 and 1, not {value!r}")
    return value or None


def process_memory(proc: psutil.Process | None = None) -> int:
    """Resident bytes of ``proc`` (this process by default)."""
    if proc is None or proc.pid == os.getpid():
        return _own_rss()
    return int(proc.memory_info().rss)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: tuple[int, int] | None = None  # (pid, descriptor of its /proc/<pid>/statm)


def _own_rss() -> int:
    """This process's resident bytes from ``/proc/self/statm`` through a descriptor kept
    open: a few µs where ``psutil`` takes tens (it runs ten times a second on every
    worker). Reopened after a fork; psutil where there is no ``/proc``."""
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:
        if _statm is not None:  # the parent's, inherited through a fork: our copy
            with contextlib.suppress(OSError):
                os.close(_statm[1])
            _statm = None
        try:
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC))
        except (OSError, AttributeError):
            return int(psutil.Process().memory_info().rss)
    return int(os.pread(_statm[1], 256, 0).split()[1]) * _PAGE


class MemoryMonitor:
    """Looks at the worker's process memory (call :meth:`check` every MONITOR_INTERVAL):
    spills results past the spill fraction, pauses past the pause fraction."""

    def __init__(
        self,
        limit: int,
        fractions: MemoryFractions,
        data: SpillBuffer | None,
        set_paused: Callable[[bool], None],
    ):
        self.limit = limit
        self.fractions = fractions
        self.data = data
        self.set_paused = set_paused
        self.paused = False
        self.rss = process_memory()

    def check(self) -> None:
        rss = self.rss = process_memory()
        spill, pause = self.fractions.spill, self.fractions.pause
        lowest = min((f for f in (spill, pause) if f is not None), default=None)
        if lowest is not None and rss > lowest * self.limit:
            # Idle receive buffers kept for reuse go first: they hold no result.
            pool = process_pool()
            if pool is not None and pool.clear():
                rss = self.rss = process_memory()
        if spill is not None and self.data is not None and rss > spill * self.limit:
            rss = self._spill(rss)
        if pause is not None:
            over = rss > pause * self.limit
            if over != self.paused:
                self.paused = over
                logger.warning(
                    "%s: process memory %d MB, pause threshold %d MB",
                    "pausing" if over else "resuming",
                    rss // 10**6,
                    int(pause * self.limit) // 10**6,
                )
                self.set_paused(over)

    def _spill(self, rss: int) -> int:
        """Spill the least recently used results until memory is back under the target
        (the spill fraction when there is no target) or nothing is left to spill."""
        assert self.data is not None
        low = self.fractions.target or self.fractions.spill or 0.0
        deadline = time.monotonic() + MAX_EVICT_SECONDS
        while rss > low * self.limit and time.monotonic() < deadline:
            if not self.data.evict():
                break
            rss = self.rss = process_memory()
        return rss
