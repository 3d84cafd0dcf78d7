"""The scheduler's structured event log: per topic, bounded, stamped with the wall clock
the server ticks in."""

from __future__ import annotations

import pytest
from scheduler_harness import W1, Sim

from shoal.core.scheduler.events import DEFAULT_EVENTS_PER_TOPIC, EventLog


def test_topics_are_kept_apart_oldest_first():
    log = EventLog()
    log.add("adaptive", 1.0, {"n": 1})
    log.add("p2p", 2.0, {"n": 2})
    log.add("adaptive", 3.0, {"n": 3})
    assert log.get("adaptive") == [(1.0, {"n": 1}), (3.0, {"n": 3})]
    assert log.get("p2p") == [(2.0, {"n": 2})]
    assert log.get("never") == []
    assert log.all() == {"adaptive": log.get("adaptive"), "p2p": log.get("p2p")}
    assert len(log) == 3


def test_each_topic_keeps_its_newest_events_only():
    log = EventLog(maxlen=3)
    for i in range(10):
        log.add("busy", float(i), {"i": i})
    log.add("quiet", 99.0, {})
    assert [data["i"] for _, data in log.get("busy")] == [7, 8, 9]
    assert log.get("quiet") == [(99.0, {})]  # a busy topic does not push others out
    assert DEFAULT_EVENTS_PER_TOPIC == 1_000  # as Dask's get_events
    big = EventLog()
    for i in range(2_500):
        big.add("t", float(i), {"i": i})
    assert len(big.get("t")) == 1_000 and big.get("t")[0][1] == {"i": 1_500}


def test_bad_input():
    with pytest.raises(ValueError, match="at least one event"):
        EventLog(maxlen=0)
    log = EventLog()
    for topic in ("", None, 3):
        with pytest.raises(ValueError, match="topic is a non-empty str"):
            log.add(topic, 1.0, {})  # type: ignore[arg-type]
    assert log.all() == {}


def test_scheduler_stamps_events_with_the_latest_tick():
    sim = Sim()
    s = sim.s
    s.log_event("adaptive", {"action": "none"})  # before any tick: time 0
    s.tick(1_700_000_000.5)
    s.log_event("adaptive", {"action": "scale-up", "n": 3})
    s.tick(1_700_000_002.0)
    s.log_event("p2p", {"action": "start"})
    assert s.get_events("adaptive") == {
        "adaptive": [(0.0, {"action": "none"}), (1_700_000_000.5, {"action": "scale-up", "n": 3})]
    }
    assert s.get_events("p2p") == {"p2p": [(1_700_000_002.0, {"action": "start"})]}
    assert s.get_events("nothing") == {"nothing": []}
    assert set(s.get_events()) == {"adaptive", "p2p"}


def test_the_wall_clock_leaves_the_monotonic_clock_alone():
    """Heartbeat TTLs and copy retries run on the monotonic clock the server passes with
    heartbeats; a tick (wall time, ~1.7e9) must not make every worker look silent."""
    sim = Sim(workers={W1: 1})
    s = sim.s
    s.tick(1_700_000_000.0)
    assert s.check_heartbeats(10.0, "ttl") == [] and W1 in s.workers
    assert s._now == 10.0 and s.wall_time == 1_700_000_000.0
