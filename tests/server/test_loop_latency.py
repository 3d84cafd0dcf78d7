"""The event-loop latency probe: a loop blocked for a while shows as that much
lateness; an idle loop shows almost none."""

from __future__ import annotations

import asyncio
import time

import pytest

from shoal.server.loop_latency import LoopLatency


def test_blocked_loop_is_measured() -> None:
    async def main() -> LoopLatency:
        probe = LoopLatency(interval=0.05).start()
        await asyncio.sleep(0.2)  # idle: a few measurements, each small
        idle_count = probe.count
        assert idle_count >= 2 and probe.reset_maximum() < 0.04
        time.sleep(0.3)  # the loop cannot run the probe's timer meanwhile
        await asyncio.sleep(0.1)
        probe.stop()
        assert probe.count > idle_count
        return probe

    probe = asyncio.run(main())
    assert 0.25 <= probe.maximum < 1.0
    assert probe.total >= probe.maximum
    assert probe.reset_maximum() >= 0.25 and probe.maximum == 0.0  # since the last scrape


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be positive, not 0"):
        LoopLatency(interval=0)
