"""A task run on the thread that computed its last input, right after it.

A task that waits for one running dependency would otherwise start only after a round
through the event loop: the thread hands its result to the loop, the loop wakes, the
state machine makes the dependent ready and hands it back to a thread, which wakes in
turn. On a machine where each wake-up costs a context switch (and, between cores, an
interrupt) that is a quarter to half a millisecond per level of a graph, paid by every
reduction and chain. Here the thread goes on with the dependent at once.

The state machine offers it (:class:`~shoal.core.worker.events.RunNext`: ``key`` waits
for ``after`` alone, which a thread is running) and sees nothing else: ``key`` stays
``waiting`` until ``after``'s result has been handled and then goes through ``ready``
and ``Execute`` as always. What runs early is kept here (an :class:`EarlyRun`) and
*claimed* by that Execute, which takes its result instead of queueing the task. So the
state machine's rules (priorities, the execution limit, resources, releases) stay its
own, and this is a question of when a computation happens, never of which result
counts:

- the thread takes an offer only when nothing is queued for it (the state machine's
  choice comes first), and only after ``after`` succeeded;
- the early run records each input value it was given; a claim delivers its result
  only if every one of them is still the very object in memory under its key (``is``,
  not ``==``). Otherwise (an input released, recomputed, spilled and read back) the
  task runs again, normally, and the early result is dropped: no value that the state
  machine did not hold can reach a result;
- a task released before it is claimed has its early result dropped (:meth:`purge`);
  one still running then is dropped when it ends;
- a failure is kept like a success: the same inputs give the same error, and the task
  does not run twice for it;
- a task that secedes while it runs early (``worker_client``) leaves its thread to a
  new one at once, as a claimed one would, and the state machine is told it seceded
  when it claims it; ``rejoin`` waits for the claim first.

The cost when nothing is offered is a dictionary lookup per batch of a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Any

from shoal import config
from shoal.protocol.messages import Key, Payload

_MISSING = object()
# Recorded for an input the early run could not get: such a run is never delivered.
UNRESOLVED = object()

# What finish() tells the thread to do with an early result.
DELIVER = "deliver"  # claimed, inputs unchanged: hand the result to the loop
RERUN = "rerun"  # claimed, an input changed: run the task again, normally
KEEP = "keep"  # not claimed yet: kept here
DROP = "drop"  # released meanwhile: nothing to do


def run_next_enabled() -> bool:
    """``shoal.worker.run-next``, checked once per worker."""
    value = config.get("worker.run-next")
    if type(value) is not bool:
        raise ValueError(f"shoal.worker.run-next must be true or false, not {value!r}")
    return value


class EarlyRun:
    """One task run (or running) before its Execute."""

    __slots__ = ("key", "inputs", "result", "done", "claimed", "dropped", "seceded", "decided")

    def __init__(self, key: Key):
        self.key = key
        self.inputs: dict[Key, Any] = {}  # each dependency's value as the task got it
        self.result: Any = None  # its ExecuteSuccess or ExecuteFailure, once done
        self.done = False
        self.claimed = False  # its Execute came while it ran: the thread delivers it
        self.dropped = False  # released while it ran: the thread drops it
        self.seceded = False  # it seceded (worker_client) before it was claimed
        self.decided = threading.Event()  # claimed or dropped (what rejoin waits for)

    def resolver(self, after: Key, after_value: Any, resolve: Callable[[Key], Any]) -> Any:
        """What the run resolves its dependencies with: ``after``'s value as its thread
        holds it, the others from memory; each recorded for the claim's check, and one
        that cannot be had as :data:`UNRESOLVED` (the run's error is then not the
        task's own, and the run is never delivered)."""
        inputs = self.inputs

        def resolve_early(dep: Key) -> Any:
            if dep == after:
                value = after_value
            else:
                try:
                    value = resolve(dep)
                except BaseException:
                    inputs[dep] = UNRESOLVED
                    raise
            inputs[dep] = value
            return value

        return resolve_early


def peek(data: MutableMapping[Key, Any], key: Key) -> Any:
    """``data[key]`` if it is in memory, without reading a spilled value back (nor
    counting as a use); ``_MISSING`` otherwise."""
    peek_value = getattr(data, "peek", None)
    if peek_value is not None:
        return peek_value(key, _MISSING)
    return data.get(key, _MISSING)


class RunNextOffers:
    """The offers and early runs of one worker, shared by its loop and its threads."""

    def __init__(self, data: Callable[[], MutableMapping[Key, Any]]):
        self._data = data  # the worker's data (a dict or its SpillBuffer), when asked
        self._lock = threading.Lock()
        self._offers: dict[Key, tuple[Key, str, Payload]] = {}  # after -> the task
        self._runs: dict[Key, EarlyRun] = {}
        self.early_runs = 0  # tasks run early, in all
        self.delivered = 0  # early results delivered at their Execute
        self.discarded = 0  # early results dropped (released, or an input changed)

    # ---------------------------------------------------------------- the loop's side

    def offer(self, after: Key, key: Key, run_spec: tuple[str, Payload]) -> None:
        """The thread running ``after`` may run ``key`` next (``RunNext``); the first
        offer after a task stands (the state machine offers the best first)."""
        if after not in self._offers:
            self._offers[after] = (key, run_spec[0], run_spec[1])

    def withdraw(self, after: Key) -> None:
        """The result of ``after``'s execution has been handled: an offer its thread did
        not take has lapsed (it must not be taken by a later execution of that key)."""
        self._offers.pop(after, None)

    def claim(self, key: Key) -> tuple[bool, Any, bool]:
        """At ``key``'s Execute: ``(claimed, result, seceded)``. Not claimed: run it as
        usual. Claimed with a result: deliver it now. Claimed without one: it is still
        running, and its thread delivers it; ``seceded``: it seceded before this claim,
        which the state machine must be told (as when a counted task secedes)."""
        if not self._runs:
            return False, None, False
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                return False, None, False
            if not run.done:
                run.claimed = True
                run.decided.set()
                return True, None, run.seceded
            del self._runs[key]
            if self._unchanged(run):
                self.delivered += 1
                return True, run.result, False
            self.discarded += 1
            return False, None, False

    def purge(self, pending: Callable[[Key], bool]) -> None:
        """Drop the early runs of tasks no longer ``pending`` (waiting or ready here):
        released, or failed for another reason, before their Execute."""
        if not self._runs:
            return
        with self._lock:
            for key, run in list(self._runs.items()):
                if run.claimed or pending(key):
                    continue
                del self._runs[key]
                run.dropped = True
                run.decided.set()
                if run.done:
                    self.discarded += 1

    # ---------------------------------------------------------------- a thread's side

    def take(self, after: Key) -> tuple[Key, str, Payload] | None:
        """The task offered to run after ``after``, if any (the offer is used up)."""
        if not self._offers:
            return None
        return self._offers.pop(after, None)

    def start(self, key: Key) -> EarlyRun | None:
        """Begin an early run of ``key``; None if one is already known."""
        with self._lock:
            if key in self._runs:
                return None
            run = self._runs[key] = EarlyRun(key)
            self.early_runs += 1
            return run

    def finish(self, run: EarlyRun, result: Any) -> str:
        """The early run has ended with ``result``: DELIVER, RERUN, KEEP or DROP."""
        with self._lock:
            run.result = result
            run.done = True
            if run.dropped:
                return DROP
            if not run.claimed:
                return KEEP
            self._runs.pop(run.key, None)
            if self._unchanged(run):
                self.delivered += 1
                return DELIVER
            self.discarded += 1
            return RERUN

    def note_secede(self, run: EarlyRun) -> bool:
        """The early task secedes: True if it was claimed already (then the state
        machine is told as for any task), False if the claim is still to come."""
        with self._lock:
            if run.claimed:
                return True
            run.seceded = True
            return False

    # ----------------------------------------------------------------

    def _unchanged(self, run: EarlyRun) -> bool:
        data = self._data()
        return all(v is not UNRESOLVED and peek(data, k) is v for k, v in run.inputs.items())

    @property
    def pending(self) -> int:
        """Early runs not yet claimed or dropped."""
        return len(self._runs)

    @property
    def offered(self) -> int:
        """Offers not taken yet."""
        return len(self._offers)
