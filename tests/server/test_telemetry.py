"""The worker's heartbeat figures, read cheaply: process memory from /proc/self/statm,
CPU from os.times, the host's network counters at most once per NET_INTERVAL."""

from __future__ import annotations

from typing import Any

import psutil
import pytest

from shoal.server import memory, telemetry
from shoal.server.memory import process_memory
from shoal.server.telemetry import NET_INTERVAL, Telemetry


def test_own_process_memory_agrees_with_psutil():
    ballast = bytearray(50 * 2**20)  # touched: resident
    ballast[::4096] = b"x" * len(ballast[::4096])
    ours, theirs = process_memory(), psutil.Process().memory_info().rss
    assert abs(ours - theirs) < 4 * 2**20, (ours, theirs)
    assert process_memory(psutil.Process()) == pytest.approx(ours, abs=4 * 2**20)
    del ballast


def test_process_memory_reopens_its_file_in_a_forked_child(monkeypatch: Any):
    process_memory()
    assert memory._statm is not None
    monkeypatch.setattr(memory, "_statm", (-1, memory._statm[1]))  # another pid's file
    assert process_memory() > 0
    assert memory._statm[0] == memory.os.getpid()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 5.0
        self.net = [1000, 2000]
        self.net_reads = 0

    def counters(self) -> tuple[int, int]:
        self.net_reads += 1
        return self.net[0], self.net[1]


@pytest.fixture
def clock(monkeypatch: Any) -> Clock:
    c = Clock()
    monkeypatch.setattr(telemetry.time, "monotonic", lambda: c.now)
    monkeypatch.setattr(telemetry, "_cpu_seconds", lambda: c.cpu)
    monkeypatch.setattr(telemetry, "_net_counters", c.counters)
    return c


def test_cpu_is_the_share_of_a_core_since_the_last_beat(clock: Clock):
    t = Telemetry()
    clock.now += 0.5
    clock.cpu += 0.25  # half of one core over the half second
    assert t.sample()[0] == 50.0
    clock.now += 0.5
    clock.cpu += 1.0  # two cores busy
    assert t.sample()[0] == 200.0


def test_network_counters_are_read_once_per_interval_and_give_its_rates(clock: Clock):
    t = Telemetry()
    assert clock.net_reads == 1
    for _ in range(3):  # beats within the interval: no read, no rate yet
        clock.now += 0.5
        clock.net[0] += 500
        assert t.sample()[1:] == (0.0, 0.0)
    assert clock.net_reads == 1
    clock.now += NET_INTERVAL - 1.5
    clock.net[0] += 500
    clock.net[1] += 4000 * NET_INTERVAL
    assert t.sample()[1:] == (2000 / NET_INTERVAL, 4000.0)
    assert clock.net_reads == 2
    clock.now += 0.5
    assert t.sample()[1:] == (2000 / NET_INTERVAL, 4000.0)  # the last interval's rates
    assert clock.net_reads == 2
