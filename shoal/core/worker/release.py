"""Executions that end, and tasks the scheduler takes back: the release half of
:class:`~shoal.core.worker.state.WorkerState` (a mixin, as the scheduler's placement).

- ``FreeKeys``: drop keys (a running task becomes ``cancelled`` until its thread ends).
- ``ReleaseCompute``: the scheduler released a task it had us compute. With ``drain``,
  it counts one of our threads busy until we answer ``ComputeReleased``, exactly once:
  at once unless a counted thread (``_executing``) runs the task, else when that thread
  ends, secedes, or a ComputeTask for the key takes the running execution over again
  (``_drains`` holds the answers owed).
- With ``interrupt`` (``client.cancel(force=True)``) a thread still running the
  released task is interrupted (:class:`Interrupt`). An interrupted execution is never
  taken over again: a ComputeTask for its key waits in ``resume``, and a local task that
  needs the key waits, until the thread ends; then the key is computed or fetched
  afresh, so the interruption never becomes anyone's result. If the thread still runs
  after the grace period (:class:`InterruptExpired`): :class:`RestartWorker`.
- ``_finished``: a thread ended (ExecuteSuccess/ExecuteFailure); whether its result
  counts.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from shoal.core.story import InvalidTransition, Record, StoryLog
from shoal.core.worker.events import (
    ExecuteFailure,
    ExecuteSuccess,
    Instruction,
    Interrupt,
    InterruptExpired,
    RestartWorker,
    SendMessage,
)
from shoal.protocol import messages as m
from shoal.protocol.messages import ComputeTask, FreeKeys, Key

if TYPE_CHECKING:
    from shoal.core.worker.state import WTask

# Seconds a force-cancelled task's thread has to return once interrupted, by default;
# then the worker restarts through its nanny (``shoal worker --interrupt-grace``).
DEFAULT_INTERRUPT_GRACE = 5.0


class Releases:
    """Release and end-of-execution methods of :class:`WorkerState`."""

    tasks: dict[Key, WTask]
    data: MutableMapping[Key, Any]
    _store: Callable[[Key, Any, int], None] | None  # data's store(key, value, size), if any
    total_resources: dict[str, float]
    available_resources: dict[str, float]
    _out: list[Instruction]
    _story: StoryLog
    _executing: set[WTask]
    _seceded: set[WTask]
    _rejoining: dict[WTask, None]
    _rejoined: set[WTask]
    _recent_duration: float
    _durations_measured: bool
    _drains: dict[WTask, int]
    _interrupted: dict[WTask, int]
    _interrupt_ids: int

    _log: Callable[[tuple[Any, ...]], None]  # the story's append
    _record_transition: Record
    _moves: dict[str, int]

    if TYPE_CHECKING:

        def _transition(self, ts: WTask, finish: str, sid: str) -> None: ...
        def _release(self, ts: WTask, sid: str) -> None: ...
        def _running(self, ts: WTask) -> bool: ...
        def _handle_compute(self, ev: ComputeTask, sid: str = "") -> None: ...
        def _add_who_has(self, ts: WTask, workers: list[str]) -> None: ...
        def _lost(self, lost: list[WTask], sid: str) -> None: ...

    def _forget_result(self, ts: WTask, sid: str) -> None:
        """``memory -> released -> forgotten`` in one step, with the same records and
        effects as the two transitions: freeing the results of a compute is common and
        runs on the event loop, ahead of the next compute's messages."""
        key, record = ts.key, self._record_transition
        record((key, "memory", "released", sid))
        del self.data[key]
        record((key, "released", "forgotten", sid))
        ts.state = "forgotten"  # (a result has no dependencies, holders nor run_spec left)
        ts.coming_from = ts.previous = None
        del self.tasks[key]
        moves = self._moves
        moves["memory"] -= 1
        moves["forgotten"] = moves.get("forgotten", 0) + 1

    def _forget_cancelled(self, ts: WTask, sid: str) -> None:
        self._transition(ts, "released", sid)
        self._transition(ts, "forgotten", sid)

    def _handle_free_keys(self, ev: FreeKeys) -> None:
        for key in ev.keys:
            ts = self.tasks.get(key)
            if ts is not None:
                self._log((key, "FreeKeys", ev.stimulus_id))
                ts.wanted = False
                ts.resume = None
                if not ts.dependents:  # else kept until its dependents are done
                    self._release(ts, ev.stimulus_id)

    def _handle_release_compute(self, ev: m.ReleaseCompute) -> None:
        """The scheduler released ``key``, which it had us compute; see the module
        docstring for the answer owed (``drain``) and ``interrupt``."""
        key, sid = ev.key, ev.stimulus_id
        ts = self.tasks.get(key)
        self._log((key, "ReleaseCompute", sid))
        if ts is not None:
            ts.wanted = False
            ts.resume = None
            if not ts.dependents:  # else kept until its dependents are done
                self._release(ts, sid)
            if (
                ev.interrupt
                and ts.state == "cancelled"
                and ts.previous == "executing"
                and ts not in self._interrupted
            ):
                self._interrupt_ids += 1
                self._interrupted[ts] = self._interrupt_ids
                self._out.append(Interrupt(key, self._interrupt_ids, sid))
        if ev.drain:
            if ts is not None and ts in self._executing:
                self._drains[ts] = self._drains.get(ts, 0) + 1
            else:
                self._out.append(SendMessage(m.ComputeReleased(key, sid), sid))

    def _handle_steal_request(self, ev: m.StealRequest) -> None:
        """The scheduler would move ``key`` to an idle worker: give it back only if it
        has not started (waiting for data, or ready), so it never runs twice."""
        key, sid = ev.key, ev.stimulus_id
        ts = self.tasks.get(key)
        self._log((key, "StealRequest", sid))
        ok = (
            ts is not None
            and ts.run_id == ev.run_id
            and ts.state in ("waiting", "ready")
            and not ts.dependents
        )
        if ok:
            assert ts is not None
            ts.wanted = False
            ts.resume = None
            self._release(ts, sid)
        self._out.append(SendMessage(m.StealReply(key, ev.run_id, ok, sid), sid))

    def _answer_drains(self, ts: WTask, sid: str) -> None:
        """``ts``'s execution no longer holds a thread for a released task."""
        for _ in range(self._drains.pop(ts, 0)):
            self._out.append(SendMessage(m.ComputeReleased(ts.key, sid), sid))

    def _handle_interrupt_expired(self, ev: InterruptExpired) -> None:
        ts = self.tasks.get(ev.key)
        if ts is None or self._interrupted.get(ts) != ev.interrupt_id:
            return  # its thread has ended
        self._log((ev.key, "InterruptExpired", ev.stimulus_id))
        reason = f"the thread running {ev.key!r} did not stop when interrupted"
        self._out.append(RestartWorker(reason, ev.stimulus_id))

    def _after_interrupt(self, ts: WTask, sid: str) -> None:
        """An interrupted execution ended while the key was wanted again: compute it
        afresh (a ComputeTask came meanwhile), or fetch it for the local tasks that
        need it."""
        ev, ts.resume = ts.resume, None
        peers = sorted(ts.who_has)
        self._transition(ts, "released", sid)
        if ev is not None:
            self._handle_compute(ev, sid)
        elif peers:
            self._transition(ts, "fetch", sid)
            self._add_who_has(ts, peers)
        else:
            self._lost([ts], sid)

    def _note_duration(self, duration: float) -> None:
        """A moving average of how long tasks take here (from the first one): it sets
        how far the threads run ahead."""
        if self._durations_measured:
            self._recent_duration += (duration - self._recent_duration) * 0.2
        else:
            self._recent_duration, self._durations_measured = duration, True

    def _store_result(self, ev: ExecuteSuccess) -> None:
        """Put a task's result in ``data``: through ``store`` with the size its thread
        measured where ``data`` has one (the server's SpillBuffer), so it is not
        measured again on the loop."""
        if self._store is None:
            self.data[ev.key] = ev.value
        else:
            self._store(ev.key, ev.value, ev.nbytes)

    def _finished(self, ev: ExecuteSuccess | ExecuteFailure, finish: str) -> WTask | None:
        """The task whose thread ended, if its result counts."""
        self._log((ev.key, type(ev).__name__, ev.stimulus_id))
        ts = self.tasks.get(ev.key)
        if ts is None or not self._running(ts):
            start = "forgotten" if ts is None else ts.state
            raise InvalidTransition(ev.key, start, finish, self._story.story(ev.key))
        self._executing.discard(ts)
        self._seceded.discard(ts)  # a seceded task may end without rejoining
        self._rejoining.pop(ts, None)
        self._rejoined.discard(ts)
        if self._drains:
            self._answer_drains(ts, ev.stimulus_id)
        interrupted = self._interrupted and self._interrupted.pop(ts, None) is not None
        if ts.resources is not None:  # the thread has ended: what it held is free
            available = self.available_resources
            for resource, need in ts.resources.items():
                available[resource] += need
            if not self._executing and not self._seceded and not self._rejoining:
                self.available_resources = dict(self.total_resources)  # no drift from sums
        self._note_duration(ev.stop - ev.start)
        if ts.state == "cancelled":
            if interrupted and (ts.resume is not None or ts.dependents):
                self._after_interrupt(ts, ev.stimulus_id)
                return None
            self._forget_cancelled(ts, ev.stimulus_id)
        if ts.state != "executing":
            return None  # cancelled, or scattered over while it ran: the result is dropped
        ts.start = ev.start
        ts.stop = ev.stop
        return ts
