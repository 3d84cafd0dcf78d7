"""The scheduler process watched from inside: CPU, memory, event-loop latency,
messages and bytes per second, connections; a bounded history for the dashboard's
system page (as Dask's ``SystemMonitor`` and its event-loop-interval check).

The event loop's latency is the scheduler's loop probe's (``loop_latency.py``: how
late a timer wakes up). Rates come from the scheduler's connection counters
(``shoal/comm/traffic.py``) read once per sample, so no message pays a clock call.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import psutil

from shoal.comm.traffic import Traffic
from shoal.server.loop_latency import LoopLatency

SAMPLE_INTERVAL = 0.5  # seconds between two samples
HISTORY = 240  # samples kept: two minutes


class Monitor:
    """Call :meth:`start` on the running loop; :attr:`history` holds the samples (dicts),
    :meth:`latest` the newest."""

    FIELDS = (
        "time",
        "cpu",
        "memory",
        "loop_latency",
        "messages_in",
        "messages_out",
        "bytes_in",
        "bytes_out",
        "connections",
    )

    def __init__(
        self,
        traffic: Traffic,
        loop_latency: LoopLatency,
        interval: float = SAMPLE_INTERVAL,
        history: int = HISTORY,
    ):
        self.traffic = traffic
        self.loop_latency = loop_latency
        self.interval = interval
        self.history: deque[dict[str, Any]] = deque(maxlen=history)
        self._proc = psutil.Process()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def latest(self) -> dict[str, Any]:
        return self.history[-1] if self.history else self._sample(0.0, self._counters())

    def _counters(self) -> tuple[int, int, int, int]:
        t = self.traffic
        return t.bytes_received, t.bytes_sent, t.messages_received, t.messages_sent

    async def _run(self) -> None:
        self._proc.cpu_percent(None)  # starts the measurement
        last = time.monotonic()
        counters = self._counters()
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            self.history.append(self._sample(now - last, counters))
            last, counters = now, self._counters()

    def _sample(self, elapsed: float, before: tuple[int, int, int, int]) -> dict[str, Any]:
        now = self._counters()
        rates = [(b - a) / elapsed if elapsed > 0 else 0.0 for a, b in zip(before, now)]
        return {
            "time": time.time(),
            "cpu": self._proc.cpu_percent(None) if elapsed > 0 else 0.0,
            "memory": self._proc.memory_info().rss,
            "loop_latency": self.loop_latency.last,
            "bytes_in": rates[0],
            "bytes_out": rates[1],
            "messages_in": rates[2],
            "messages_out": rates[3],
            "connections": self.traffic.open_connections,
        }
