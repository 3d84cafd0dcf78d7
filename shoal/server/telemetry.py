"""What a worker's heartbeat tells the dashboard beyond memory: its process CPU and
the host's network rates since the previous beat (as Dask's ``SystemMonitor``).

Cheap, since it runs on every heartbeat of every idle worker: the CPU from
``os.times()`` (under a µs, where ``psutil.Process.cpu_percent`` takes tens), and the
host's network counters (``/proc/net/dev``, the dearest read) at most once per
NET_INTERVAL, the rates in between being those of the last such interval."""

from __future__ import annotations

import os
import time

import psutil

NET_INTERVAL = 2.0  # seconds between two reads of the host's network counters, at least


class Telemetry:
    """Call :meth:`sample` once per heartbeat: (cpu percent, bytes/s in, bytes/s out)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._cpu = _cpu_seconds()
        self._net_last = self._last
        self._net = _net_counters()
        self._rates = (0.0, 0.0)

    def sample(self) -> tuple[float, float, float]:
        now = time.monotonic()
        elapsed = now - self._last
        if elapsed <= 0:
            return 0.0, *self._rates
        cpu_seconds = _cpu_seconds()
        cpu = max(0.0, cpu_seconds - self._cpu) / elapsed * 100  # as psutil: 100 per core
        self._last, self._cpu = now, cpu_seconds
        net_elapsed = now - self._net_last
        if net_elapsed >= NET_INTERVAL:
            net = _net_counters()
            self._rates = (
                max(0, net[0] - self._net[0]) / net_elapsed,
                max(0, net[1] - self._net[1]) / net_elapsed,
            )
            self._net_last, self._net = now, net
        return round(cpu, 1), *self._rates


def _cpu_seconds() -> float:
    """User and system CPU seconds of this process (all its threads)."""
    t = os.times()
    return t.user + t.system


def _net_counters() -> tuple[int, int]:
    try:
        counters = psutil.net_io_counters()
    except (OSError, RuntimeError):  # no /proc/net/dev (a sandbox): no network figures
        return 0, 0
    if counters is None:
        return 0, 0
    return counters.bytes_recv, counters.bytes_sent
