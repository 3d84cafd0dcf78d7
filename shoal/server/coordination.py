"""Waking the scheduler core at the deadlines of coordination waiters (a ``Lock.acquire``
or ``Queue.get`` with a timeout): the core says when, this timer ticks it then."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from shoal.core.scheduler.state import SchedulerState


class DeadlineTimer:
    def __init__(self, state: SchedulerState, stimulus: Callable[[str], str]):
        self.state = state
        self._stimulus = stimulus
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def arm(self) -> None:
        """Be called at the core's next coordination deadline (after every batch)."""
        deadline = self.state.coordination.next_deadline()
        if deadline >= self._at:
            return  # already due by then (or no deadline at all)
        if self._handle is not None:
            self._handle.cancel()
        self._at = deadline
        delay = max(0.0, deadline - time.time())
        self._handle = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._at = math.inf
        self.state.tick(time.time(), self._stimulus("coordination-deadline"))
        self.arm()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
