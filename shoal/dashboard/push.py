"""Pushed updates for open pages (server-sent events), encoded once per tick.

Each topic makes, at most once per tick, one delta from the counters the scheduler
keeps (the summary, the task stream cursor, the workers' telemetry, the monitor),
encodes it once to an SSE event, and queues those same bytes for every page that
subscribed to it. Nothing changed: nothing is sent, except a comment every
``KEEPALIVE`` seconds so that proxies keep the stream open. A page that does not read
(its queue beyond ``MAX_QUEUED`` bytes) is dropped; the scheduler never waits for one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from shoal.dashboard import api
from shoal.dashboard.deltas import rows_delta, summary_delta, summary_dict
from shoal.dashboard.lanes import Lanes
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.server.scheduler import Scheduler

TICK = 0.5  # seconds between two ticks: at most two pushes a second per topic
KEEPALIVE = 15.0  # seconds of silence before a keep-alive comment
MAX_QUEUED = 4 << 20  # bytes queued for one page before it is dropped
STREAM_WINDOW = 60.0  # seconds of task stream a new page gets
STREAM_BATCH = 5000  # task stream records per tick at most (the newest)
_encode = msgspec.json.Encoder().encode


def sse(topic: str, data: Any) -> bytes:
    """One server-sent event (JSON has no raw newlines: one data line)."""
    return b"event: " + topic.encode() + b"\ndata: " + _encode(data) + b"\n\n"


KEEPALIVE_EVENT = b": keep-alive\n\n"


class Subscriber:
    """One open page: the bytes queued for it, written by its own request handler."""

    __slots__ = ("topics", "queue", "queued", "wake", "dropped")

    def __init__(self, topics: frozenset[str]):
        self.topics = topics
        self.queue: deque[bytes] = deque()
        self.queued = 0
        self.wake = asyncio.Event()
        self.dropped = False

    def offer(self, data: bytes) -> None:
        if self.dropped:
            return
        if self.queued + len(data) > MAX_QUEUED:
            self.dropped = True  # its handler ends the response
            self.queue.clear()
            self.queued = 0
        else:
            self.queue.append(data)
            self.queued += len(data)
        self.wake.set()

    def take(self) -> bytes:
        data = b"".join(self.queue)
        self.queue.clear()
        self.queued = 0
        self.wake.clear()
        return data


class Topic:
    """A source of pushes: ``snapshot()`` for a new page, ``tick()`` the delta since
    the previous tick (or None: nothing changed)."""

    name = ""

    def snapshot(self) -> Any:
        raise NotImplementedError

    def tick(self) -> Any | None:
        raise NotImplementedError


class SummaryTopic(Topic):
    """The cluster summary: tasks per state, per-prefix counters, totals."""

    name = "summary"

    def __init__(self, scheduler: Scheduler):
        self.state = scheduler.state
        self.pushed: m.ClusterState | None = None  # the base of the next delta

    def snapshot(self) -> Any:
        if self.pushed is None:
            self.pushed = self.state.summary()
        return summary_dict(self.pushed)  # the next delta builds on this very version

    def tick(self) -> Any | None:
        before = self.pushed
        if before is not None and before.version == self.state.version:
            return None
        now = self.state.summary()
        self.pushed = now
        return summary_dict(now) if before is None else summary_delta(before, now)


class TaskStreamTopic(Topic):
    """New task stream records, each with its row (``lanes.py``), and the records of
    the last minute for a new page."""

    name = "task-stream"

    def __init__(self, scheduler: Scheduler):
        self.state = scheduler.state
        self.lanes = Lanes()
        self.recent: deque[dict[str, Any]] = deque()  # pushed, the last STREAM_WINDOW s
        stream = self.state.task_stream
        self.cursor = max(0, stream.count - STREAM_BATCH)
        self._catch_up()

    def _catch_up(self) -> list[dict[str, Any]]:
        self.cursor, records = self.state.task_stream.since(self.cursor, STREAM_BATCH)
        if not records:
            return []
        new = [api.stream_record(r, self.lanes.assign(r.worker, r.start, r.stop)) for r in records]
        self.recent.extend(new)
        horizon = max(r["stop"] for r in new) - STREAM_WINDOW
        recent = self.recent
        while recent and recent[0]["stop"] < horizon:
            recent.popleft()
        if len(self.lanes) > 2 * len(self.state.workers) + 16:
            self.lanes.forget(self.state.workers)
        return new

    def snapshot(self) -> Any:
        return {"records": list(self.recent), "full": True}

    def tick(self) -> Any | None:
        if self.state.task_stream.count == self.cursor:
            return None
        new = self._catch_up()
        return {"records": new, "full": False} if new else None


def _worker_telemetry(ws: Any) -> tuple[Any, ...]:
    return (
        ws.address,
        ws.name,
        ws.nthreads,
        ws.memory_limit,
        ws.memory,
        ws.nbytes,
        ws.spilled,
        round(ws.cpu, 1),
        round(ws.net_in),
        round(ws.net_out),
        ws.memory_pause,
        ws.memory_terminate,
        len(ws.processing),
        ws.status,
    )


WORKER_FIELDS = (
    "address",
    "name",
    "nthreads",
    "memory_limit",
    "memory",
    "nbytes",
    "spilled",
    "cpu",
    "net_in",
    "net_out",
    "memory_pause",
    "memory_terminate",
    "processing",
    "status",
)


class WorkersTopic(Topic):
    """Each worker's memory, CPU, network and tasks: the rows that changed. Rows are
    arrays in the order of ``fields`` (sent in every snapshot), to stay small at
    1,000 workers. O(workers) per tick, and only on ticks after a change."""

    name = "workers"

    def __init__(self, scheduler: Scheduler):
        self.state = scheduler.state
        self.rows: dict[str, tuple[Any, ...]] = {}
        self.seen = (-1, -1)  # (summary version, heartbeats) at the last tick

    def _changed(self) -> bool:
        seen = (self.state.version, self.state.heartbeats)
        if seen == self.seen:
            return False
        self.seen = seen
        return True

    def _rows(self) -> dict[str, tuple[Any, ...]]:
        return {ws.address: _worker_telemetry(ws) for ws in self.state.workers.values()}

    def snapshot(self) -> Any:
        if not self.rows:
            self._changed()
            self.rows = self._rows()
        return {
            "fields": WORKER_FIELDS,
            "changed": list(self.rows.values()),
            "removed": [],
            "full": True,
        }

    def tick(self) -> Any | None:
        if not self._changed():
            return None
        now = self._rows()
        delta = rows_delta(self.rows, now)
        self.rows = now
        if delta is None:
            return None
        changed, removed = delta
        return {"changed": changed, "removed": removed, "full": False}


class SystemTopic(Topic):
    """The scheduler's monitor: its newest sample, when there is a new one."""

    name = "system"

    def __init__(self, scheduler: Scheduler):
        self.monitor = scheduler.monitor
        self.last: Any = None

    def snapshot(self) -> Any:
        history = list(self.monitor.history) if self.monitor is not None else []
        return {"samples": history, "full": True}

    def tick(self) -> Any | None:
        if self.monitor is None or not self.monitor.history:
            return None
        latest = self.monitor.history[-1]
        if latest is self.last:
            return None
        self.last = latest
        return {"samples": [latest], "full": False}


TOPICS: dict[str, Callable[[Scheduler], Topic]] = {
    "summary": SummaryTopic,
    "task-stream": TaskStreamTopic,
    "workers": WorkersTopic,
    "system": SystemTopic,
}


class PushHub:
    """The subscribers and the tick loop (running only while a page is open)."""

    def __init__(self, scheduler: Scheduler, tick: float = TICK, keepalive: float = KEEPALIVE):
        self.scheduler = scheduler
        self.interval = tick
        self.keepalive = keepalive
        self.subscribers: set[Subscriber] = set()
        self.topics: dict[str, Topic] = {}
        self.encodes = 0  # events encoded (one per topic per tick with a change)
        self._task: asyncio.Task[None] | None = None
        self._last_sent = time.monotonic()

    @staticmethod
    def parse_topics(text: str) -> frozenset[str]:
        names = frozenset(t for t in text.split(",") if t) if text else frozenset(TOPICS)
        unknown = sorted(names - set(TOPICS))
        if unknown:
            raise api.BadRequest(
                f"unknown topics {', '.join(unknown)} (known: {', '.join(sorted(TOPICS))})"
            )
        return names

    def subscribe(self, topics: Iterable[str]) -> Subscriber:
        """A new page: it gets each topic's snapshot now, then the deltas."""
        sub = Subscriber(frozenset(topics))
        for name in sorted(sub.topics):
            topic = self.topics.get(name)
            if topic is None:
                topic = self.topics[name] = TOPICS[name](self.scheduler)
                topic.tick()  # what exists now is in the snapshot, not in the next delta
            sub.offer(sse(name, topic.snapshot()))
        self.subscribers.add(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        wanted = set().union(*(s.topics for s in self.subscribers)) if self.subscribers else set()
        for name in [n for n in self.topics if n not in wanted]:
            del self.topics[name]  # its state would go stale; made afresh when wanted

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sub in list(self.subscribers):
            sub.dropped = True
            sub.wake.set()
        self.subscribers.clear()

    def tick(self) -> None:
        """Encode each topic's delta once and queue it for its subscribers."""
        sent = False
        for name, topic in self.topics.items():
            delta = topic.tick()
            if delta is None:
                continue
            data = sse(name, delta)
            self.encodes += 1
            for sub in self.subscribers:
                if name in sub.topics:
                    sub.offer(data)
            sent = True
        now = time.monotonic()
        if sent:
            self._last_sent = now
        elif now - self._last_sent >= self.keepalive:
            self._last_sent = now
            for sub in self.subscribers:
                sub.offer(KEEPALIVE_EVENT)
        for sub in [s for s in self.subscribers if s.dropped]:
            self.unsubscribe(sub)

    async def _run(self) -> None:
        while self.subscribers:
            await asyncio.sleep(self.interval)
            self.tick()
