"""The task stream the scheduler core keeps: one record per finished execution, read by
cursor, bounded."""

from __future__ import annotations

import pytest
from scheduler_harness import W1, W2, Sim

from shoal.core.scheduler.task_stream import TaskStream
from shoal.protocol.messages import TaskStreamRecord


def test_every_finished_or_erred_execution_is_recorded_with_its_worker_and_times():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"inc-1": [], "inc-2": [], "sum-1": ["inc-1", "inc-2"]})
    on1 = sim.worker_of("inc-1")
    sim.finish("inc-1", nbytes=28, duration=0.5)
    sim.fail("inc-2")
    sim.run_all()
    cursor, records = sim.s.task_stream.since(0)
    assert cursor == 2
    by_key = {r.key: r for r in records}
    assert set(by_key) == {"inc-1", "inc-2"}  # sum-1 erred without running: no bar
    one = by_key["inc-1"]
    assert (one.prefix, one.worker, one.status, one.nbytes) == ("inc", on1, "memory", 28)
    assert one.stop - one.start == pytest.approx(0.5)
    assert by_key["inc-2"].status == "erred"


def test_a_reader_gets_only_what_is_new_since_its_cursor():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.run_all()
    cursor, first = sim.s.task_stream.since(0)
    assert [r.key for r in first] == ["a"]
    assert sim.s.task_stream.since(cursor) == (cursor, [])
    sim.submit({"b": [], "c": []})
    sim.run_all()
    cursor2, new = sim.s.task_stream.since(cursor)
    assert sorted(r.key for r in new) == ["b", "c"] and cursor2 == cursor + 2


def test_the_ring_keeps_the_newest_and_a_lagging_or_foreign_cursor_gets_what_is_kept():
    stream = TaskStream(capacity=3)
    for i in range(5):
        stream.add(TaskStreamRecord(f"k-{i}", "k", "k", "w", float(i), i + 0.5, "memory"))
    cursor, kept = stream.since(0)
    assert cursor == 5 and [r.key for r in kept] == ["k-2", "k-3", "k-4"]
    assert [r.key for r in stream.since(3)[1]] == ["k-3", "k-4"]
    assert [r.key for r in stream.since(10**9)[1]] == ["k-2", "k-3", "k-4"]
    assert [r.key for r in stream.since(0, limit=1)[1]] == ["k-4"]
    with pytest.raises(ValueError, match="capacity"):
        TaskStream(capacity=0)
