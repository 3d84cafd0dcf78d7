"""How late the event loop runs what it was asked to run: a timer-based probe.

A task sleeps ``interval`` seconds again and again; how much later than asked it
wakes is the time the loop was busy with something else (a long handler, a blocked
call). Shared by the scheduler and the worker (Prometheus ``/metrics``) and usable by
any page that shows it: a tiny object, no thread, one wake-up per interval.
"""

from __future__ import annotations

import asyncio
import time

LOOP_PROBE_INTERVAL = 0.5  # seconds between two measurements


class LoopLatency:
    """Start it on the loop to watch; read ``last``, ``maximum`` (since the last
    :meth:`reset_maximum`), ``count`` and ``total`` (seconds of lateness summed)."""

    __slots__ = ("interval", "last", "maximum", "count", "total", "_task")

    def __init__(self, interval: float = LOOP_PROBE_INTERVAL):
        if not interval > 0:
            raise ValueError(f"the loop probe's interval must be positive, not {interval}")
        self.interval = interval
        self.last = 0.0
        self.maximum = 0.0
        self.count = 0
        self.total = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> LoopLatency:
        """Begin measuring on the running loop (again after ``stop``)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._probe())
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def reset_maximum(self) -> float:
        """The largest lateness since the previous call (Dask's "since the last
        scrape"), and start over."""
        out, self.maximum = self.maximum, 0.0
        return out

    def record(self, late: float) -> None:
        late = max(0.0, late)
        self.last = late
        self.maximum = max(self.maximum, late)
        self.count += 1
        self.total += late

    async def _probe(self) -> None:
        while True:
            asked = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            self.record(time.monotonic() - asked)
