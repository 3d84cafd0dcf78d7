"""What a worker's heartbeat tells the dashboard beyond memory: its process CPU and
the host's network rates since the previous beat (as Dask's ``SystemMonitor``)."""

from __future__ import annotations

import time

import psutil


class Telemetry:
    """Call :meth:`sample` once per heartbeat: (cpu percent, bytes/s in, bytes/s out)."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call starts the measurement
        self._last = time.monotonic()
        self._net = _net_counters()

    def sample(self) -> tuple[float, float, float]:
        now = time.monotonic()
        cpu = self._proc.cpu_percent(None)
        net = _net_counters()
        elapsed = now - self._last
        if elapsed <= 0:
            return cpu, 0.0, 0.0
        rate_in = max(0, net[0] - self._net[0]) / elapsed
        rate_out = max(0, net[1] - self._net[1]) / elapsed
        self._last, self._net = now, net
        return cpu, rate_in, rate_out


def _net_counters() -> tuple[int, int]:
    try:
        counters = psutil.net_io_counters()
    except (OSError, RuntimeError):  # no /proc/net/dev (a sandbox): no network figures
        return 0, 0
    if counters is None:
        return 0, 0
    return counters.bytes_recv, counters.bytes_sent
