"""The push hub against a scheduler core (no network): one encoding per topic per
tick for every page, nothing when idle, slow pages dropped."""

from __future__ import annotations

import asyncio
import types

from shoal.core.comm import RecordingComm
from shoal.core.scheduler.state import SchedulerState
from shoal.dashboard import push
from shoal.dashboard.push import KEEPALIVE_EVENT, PushHub, Subscriber
from shoal.protocol import messages as m


def _hub(keepalive: float = 1e9) -> tuple[PushHub, SchedulerState]:
    state = SchedulerState(RecordingComm(), validate=True)
    scheduler = types.SimpleNamespace(state=state, monitor=None)
    return PushHub(scheduler, tick=3600, keepalive=keepalive), state  # type: ignore[arg-type]


def test_every_page_gets_the_same_bytes_encoded_once() -> None:
    async def main() -> None:
        hub, state = _hub()
        pages = [hub.subscribe(["summary", "workers"]) for _ in range(5)]
        assert all(len(p.queue) == 2 for p in pages)  # the two snapshots
        for p in pages:
            p.take()
        state.add_worker("tcp://w:1", "w", 4, 1000, "join")
        encodes = hub.encodes
        hub.tick()
        assert hub.encodes - encodes == 2  # summary and workers: once each, for 5 pages
        first = list(pages[0].queue)
        assert all(a is b for p in pages[1:] for a, b in zip(first, p.queue))
        assert b"event: summary" in first[0] and b"event: workers" in first[1]
        hub.close()

    asyncio.run(main())


def test_idle_sends_nothing_but_a_rare_keepalive() -> None:
    async def main() -> None:
        hub, state = _hub(keepalive=0.2)
        page = hub.subscribe(["summary", "workers", "task-stream"])
        page.take()
        encodes = hub.encodes
        for _ in range(5):
            hub.tick()
        assert hub.encodes == encodes and not page.queue  # nothing changed: nothing sent
        state.heartbeat("tcp://nobody:1", m.Heartbeat(1, memory=5), now=1.0)  # no such worker
        hub.tick()
        assert not page.queue
        await asyncio.sleep(0.25)
        hub.tick()
        assert list(page.queue) == [KEEPALIVE_EVENT] and hub.encodes == encodes
        hub.close()

    asyncio.run(main())


def test_worker_telemetry_is_pushed_as_changed_rows() -> None:
    async def main() -> None:
        hub, state = _hub()
        state.add_worker("tcp://a:1", "a", 1, 1000, "join")
        state.add_worker("tcp://b:1", "b", 1, 1000, "join")
        page = hub.subscribe(["workers"])
        snapshot = page.take()
        assert b'"full":true' in snapshot and b"tcp://a:1" in snapshot and b"tcp://b:1" in snapshot
        beat = m.Heartbeat(1, memory=500, cpu=75.0, net_in=10.0, memory_pause=0.8)
        state.heartbeat("tcp://b:1", beat, now=1.0)
        hub.tick()
        delta = page.take()
        assert b"tcp://b:1" in delta and b"tcp://a:1" not in delta and b"75.0" in delta
        state.remove_worker("tcp://a:1", "gone")
        hub.tick()
        assert b'"removed":["tcp://a:1"]' in page.take()
        hub.close()

    asyncio.run(main())


def test_a_page_that_does_not_read_is_dropped(monkeypatch: object) -> None:
    async def main() -> None:
        hub, state = _hub()
        slow = hub.subscribe(["workers"])
        fast = hub.subscribe(["workers"])
        for i in range(200):
            state.add_worker(f"tcp://w{i}:1", f"worker-number-{i}", 1, 1000, f"join-{i}")
            hub.tick()
            fast.take()  # this page reads
        assert slow.dropped and slow not in hub.subscribers and not slow.queue
        assert fast in hub.subscribers and not fast.dropped
        hub.close()

    setattr_ = monkeypatch.setattr  # type: ignore[attr-defined]
    setattr_(push, "MAX_QUEUED", 20_000)
    asyncio.run(main())


def test_subscriber_bound() -> None:
    async def main() -> None:
        sub = Subscriber(frozenset({"summary"}))
        sub.offer(b"x" * (push.MAX_QUEUED - 1))
        assert not sub.dropped
        sub.offer(b"yy")
        assert sub.dropped and sub.queued == 0

    asyncio.run(main())
