"""What happened to a key: a bounded log of transitions and events, and the error
raised when a state machine is asked for a transition it does not allow."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from shoal.protocol.messages import Key


class InvalidTransition(Exception):
    """A state machine was asked to move a key between states it cannot connect."""

    def __init__(self, key: Key, start: str, finish: str, story: list[tuple[Any, ...]]):
        self.key = key
        self.start = start
        self.finish = finish
        self.story = story
        lines = "\n".join(f"  {entry}" for entry in story[-20:])
        super().__init__(f"impossible transition {start!r} -> {finish!r} for key {key!r}\n{lines}")


class InvalidState(AssertionError):
    """``validate_state()`` found a broken invariant."""


class StoryLog:
    """Recent transitions and events, newest last; ``story(key)`` filters by key."""

    __slots__ = ("_log", "append")

    def __init__(self, maxlen: int = 100_000):
        self._log: deque[tuple[Any, ...]] = deque(maxlen=maxlen)
        # The deque's own method: several entries per task, no Python call in between.
        self.append: Callable[[tuple[Any, ...]], None] = self._log.append

    def story(self, *keys: Key) -> list[tuple[Any, ...]]:
        wanted = set(keys)
        return [e for e in self._log if e[0] in wanted]

    def __len__(self) -> int:
        return len(self._log)


Record = Callable[[tuple[Any, ...]], None]


def transition_recorder(
    story: Record, sink: list[tuple[Any, ...]] | None, wake: Callable[[], None] | None = None
) -> Record:
    """What a state machine calls with each transition ``(key, start, finish,
    stimulus_id)``: ``story`` alone, or while watched (``sink`` given) ``story`` and
    ``sink`` too, calling ``wake()`` when ``sink`` stops being empty. Unwatched, a
    transition costs what it did before plugins watched them."""
    if sink is None:
        return story
    pending = sink

    def record(entry: tuple[Any, ...]) -> None:
        story(entry)
        if not pending and wake is not None:
            wake()
        pending.append(entry)

    return record
