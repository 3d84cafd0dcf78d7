"""The scheduler's structured event log: what it decided and why, per topic.

Each topic ("adaptive", "p2p", "pins", ...) keeps its newest ``maxlen`` events as
``(timestamp, data)``: a bounded deque, as Dask's ``Scheduler.get_events``, so a
long-lived scheduler never grows with its history. Timestamps are wall-clock seconds
given by the caller (the core has no clock); ``data`` is a dict of plain values
(str, int, float, bool, None, lists and dicts of them) that can travel as msgpack.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shoal.core.story import StoryLog, transition_recorder
from shoal.protocol import messages as m

DEFAULT_EVENTS_PER_TOPIC = 1_000  # as Dask's distributed.admin.low-level-log-length

Event = tuple[float, dict[str, Any]]


class EventLog:
    __slots__ = ("maxlen", "topics")

    def __init__(self, maxlen: int = DEFAULT_EVENTS_PER_TOPIC):
        if maxlen < 1:
            raise ValueError(f"an event log keeps at least one event per topic, not {maxlen}")
        self.maxlen = maxlen
        self.topics: dict[str, deque[Event]] = {}

    def add(self, topic: str, timestamp: float, data: dict[str, Any]) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"an event topic is a non-empty str, not {topic!r}")
        events = self.topics.get(topic)
        if events is None:
            events = self.topics[topic] = deque(maxlen=self.maxlen)
        events.append((timestamp, data))

    def get(self, topic: str) -> list[Event]:
        """The events of ``topic``, oldest first (none for a topic never used)."""
        return list(self.topics.get(topic, ()))

    def all(self) -> dict[str, list[Event]]:
        return {topic: list(events) for topic, events in self.topics.items()}

    def __len__(self) -> int:
        return sum(len(events) for events in self.topics.values())


class Events:
    """The event log and wall clock of :class:`~shoal.core.scheduler.SchedulerState`.

    Two clocks enter the core, both as values: ``_now`` (monotonic, from heartbeats:
    worker TTLs, copy retries) and ``wall_time`` (``time.time()``, from ``tick``:
    event timestamps, pin leases), as Dask stamps its events with wall time."""

    pins: dict[int, Any]
    log: StoryLog

    if TYPE_CHECKING:

        def expire_pins(self, now: float, stimulus_id: str) -> None: ...
        def expire_coordination(self, now: float, stimulus_id: str) -> None: ...
        def _done(self, stimulus_id: str) -> None: ...

    def _init_events(self, maxlen: int = DEFAULT_EVENTS_PER_TOPIC) -> None:
        self.events = EventLog(maxlen)
        self.wall_time = 0.0  # the latest wall-clock time a tick brought
        # Where each transition (key, start, finish, stimulus_id) is recorded: the story,
        # and while watched (``watch_transitions``) a sink of the server's too.
        self._record_transition: Callable[[tuple[Any, ...]], None] = self.log.append

    def watch_transitions(
        self, sink: list[tuple[Any, ...]] | None, wake: Callable[[], None] | None = None
    ) -> None:
        """Append every transition ``(key, start, finish, stimulus_id)`` to ``sink`` as
        well as to the story, calling ``wake()`` when ``sink`` stops being empty; or
        stop (None). Plugins' ``transition`` hooks are fed so; unwatched, a transition
        costs what it did before plugins existed."""
        self._record_transition = transition_recorder(self.log.append, sink, wake)

    def tick(self, now: float, stimulus_id: str = "") -> None:
        """The server's wall clock (``time.time()``), given before each batch of events
        it handles and periodically: events are stamped with it, leases expire by it."""
        self.wall_time = now
        pins_before = len(self.pins)
        self.expire_pins(now, stimulus_id or "tick")
        self.expire_coordination(now, stimulus_id or "tick")  # waiters past their deadline
        if len(self.pins) != pins_before:
            self._done(stimulus_id or "tick")  # validated, as after any event

    def log_event(self, topic: str, data: dict[str, Any]) -> None:
        """Record ``data`` under ``topic``, stamped with the latest tick."""
        self.events.add(topic, self.wall_time, data)

    def _worker_log_event(self, ws: Any, msg: m.LogEvent) -> None:
        """A worker's event (a plugin's, or a plugin that failed there)."""
        if not msg.topic:
            raise TypeError("a LogEvent needs a non-empty topic")
        self.log_event(msg.topic, {**msg.data, "worker": ws.address})

    def get_events(self, topic: str | None = None) -> dict[str, list[Event]]:
        """The events of ``topic`` (``{topic: [...]}``), or of every topic."""
        if topic is None:
            return self.events.all()
        return {topic: self.events.get(topic)}
