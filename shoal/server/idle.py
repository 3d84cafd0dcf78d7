"""A worker's periodic loops (the memory monitor, the task-output forwarder) wake less
often while it is idle: each wake-up of an event loop costs CPU (some 50-200 µs with
its timers and syscalls, more on a loaded host), and an idle worker on a small machine
woke about 20 times a second. While nothing runs and nothing is in flight neither
memory nor task output can grow much, and the first task or transfer wakes the loops
at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

IDLE_INTERVAL = 0.5  # seconds between wake-ups of a periodic loop while the worker idles


class Activity:
    """Sleeps of the periodic loops: ``interval`` while busy, up to ``IDLE_INTERVAL``
    while idle, cut short by :meth:`started` (called on the event loop)."""

    def __init__(self, busy: Callable[[], bool], idle_interval: float = IDLE_INTERVAL):
        self._busy = busy
        self.idle_interval = idle_interval
        self._started: asyncio.Event | None = None

    def started(self) -> None:
        """Work began (a task handed to a thread, a transfer): wake the idle sleepers."""
        if self._started is not None:
            self._started.set()

    async def sleep(self, interval: float) -> None:
        if self._busy() or interval >= self.idle_interval:
            await asyncio.sleep(interval)
            return
        if self._started is None:
            self._started = asyncio.Event()
        started = self._started
        started.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(started.wait(), self.idle_interval)
