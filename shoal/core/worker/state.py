"""The worker's state machine: events in, instructions out.

Pure and synchronous: the asyncio worker server turns messages from the scheduler, peers
and its task threads into events, calls :meth:`WorkerState.handle` and carries out the
instructions it returns. ``forgotten`` means removed from ``tasks``::

    compute:  released -> waiting -> ready -> executing -> memory | error
    fetch:    released -> fetch -> flight -> memory          (a dependency held by a peer)
    freed while running or in flight: -> cancelled -> forgotten when it ends

A task is kept while the scheduler wants it here (``wanted``: it sent ComputeTask, or was
told we hold the key) or while a local task depends on it (``dependents``). A task keeps
links to its dependencies while it needs their data: waiting, ready, executing (also when
cancelled, since its thread reads them). Without either reason a task is released:
forgotten, or cancelled while an execution or a transfer is still running. A ``released``
task left after a batch is a stub a local task still depends on (the scheduler will send
it again or free the dependents). A ComputeTask may come *ahead* of dependencies this
worker is still computing (the scheduler names no holder for them): it waits for them
like for a transfer, and starts when they finish (``core/scheduler/ahead.py``).

While paused (memory over the pause fraction: :class:`Pause`) the worker starts no task
and fetches no dependency; what runs or is in flight finishes (as do tasks already
handed to the threads to run ahead: see :attr:`WorkerState.execution_limit`). A result that cannot be
pickled (to spill it or to send it: :class:`UnserializableData`) is reported to the
scheduler, which errs its task; the worker stops wanting it and drops it once no local
task depends on it.

A task that needs resources (``ComputeTask.resources``) waits in the ``constrained`` heap
instead of ``ready`` until enough of each is free; it holds them from ``executing`` until
its thread ends, also when it was cancelled meanwhile (the thread still runs). The
scheduler never assigns more than the worker has, but it counts a cancelled task's
resources as free at once, and the threads are pipelined: this is the check that holds.

Tasks the scheduler takes back while they run (``ReleaseCompute``: the thread counts
busy until it really ends; force-cancel interrupts it) and the ends of executions are in
:mod:`shoal.core.worker.release`.

A running task may *secede* (:class:`Secede`: it waits on other tasks, e.g. inside
``worker_client``): it stops counting against the execution limit, so another task
starts, while its own thread runs on and its result is reported as usual. It keeps the
resources it holds (as Dask), since its thread still uses them. :class:`Rejoin` asks to
count again: the task waits in ``_rejoining`` until a slot is free, then a
:class:`ResumeThread` instruction lets its thread go on; waiting rejoins take free slots
before new tasks start.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, ClassVar

from shoal.core.story import InvalidTransition, Record, StoryLog, transition_recorder
from shoal.core.worker import plain
from shoal.core.worker.events import (  # noqa: F401  (re-exported: the events are part of the API)
    Event,
    Execute,
    ExecuteFailure,
    ExecuteSuccess,
    GatherDep,
    GatherFailure,
    GatherSuccess,
    Instruction,
    Interrupt,
    InterruptExpired,
    Pause,
    Rejoin,
    RestartWorker,
    ResumeThread,
    Secede,
    SendMessage,
    TransferError,
    Unpause,
    UnserializableData,
    UpdateDataEvent,
    WorkerEvent,
)
from shoal.core.worker.fetch import Fetching, _unindex
from shoal.core.worker.release import Releases
from shoal.protocol import messages as m
from shoal.protocol.messages import ComputeTask, DepInfo, FreeKeys, Key, Payload

_UNCOUNTED = ("released", "forgotten")  # released: the rest of tasks; forgotten: gone

PIPELINE_WINDOW = 0.002  # seconds of short tasks a thread may have queued behind its current one
MAX_PIPELINE = 64  # (tasks of ~30 us: the window, not this cap, bounds them)
# Tasks shorter than this on average: each thread has one more queued behind the one it
# runs (a run-ahead), so that it goes on without waiting for the event loop; it costs a
# newly arrived better task at most that long a wait.
RUN_AHEAD_WINDOW = 0.05
SLACK = 1e-9  # float sums of resource amounts may miss a total by rounding

STATES = frozenset(
    {"released", "waiting", "fetch", "flight", "ready", "executing", "memory", "error", "cancelled"}
)

# --- tasks ------------------------------------------------------------------------------

_NO_SET: Any = frozenset()  # shared and never mutated: code that adds replaces it by a set


class WTask:
    """One key as this worker sees it."""

    __slots__ = (
        "key",
        "state",
        "run_spec",  # (func_id, payload), or None for pure data
        "priority",
        "dependencies",
        "dependents",
        "waiting_for_data",  # dependencies not yet in memory
        "who_has",  # peers holding the key (never our own address)
        "nbytes",
        "start",
        "stop",
        "type_name",
        "wanted",  # the scheduler wants this key here
        "previous",  # for "cancelled": "executing" or "flight"
        "coming_from",  # for "flight" and a cancelled flight: the peer asked
        "missed_on",  # peers asked for the key that did not deliver it (for MissingData)
        "resume",  # a ComputeTask received while the key was in flight
        "ready_seq",  # identifies the task's live entry in the ready (or constrained) heap
        "resources",  # what it holds while executing; None: nothing
        "run_id",  # the scheduler's assignment its result answers (ComputeTask.run_id)
    )

    def __init__(self, key: Key):
        self.key = key
        self.state = "released"
        self.run_spec: tuple[str, Payload] | None = None
        self.priority: tuple[int, ...] = ()
        self.dependencies: set[WTask] = _NO_SET  # real sets only once needed
        self.dependents: set[WTask] = _NO_SET
        self.waiting_for_data: set[WTask] = _NO_SET
        self.who_has: set[str] = _NO_SET
        self.nbytes = 0
        self.start = self.stop = 0.0
        self.type_name = ""
        self.wanted = False
        self.previous: str | None = None
        self.coming_from: str | None = None
        self.missed_on: tuple[str, ...] = ()
        self.resume: ComputeTask | None = None
        self.ready_seq = -1
        self.resources: dict[str, float] | None = None
        self.run_id = 0

    def __repr__(self) -> str:
        return f"<WTask {self.key!r} {self.state}>"


class WorkerState(Fetching, Releases):
    """The tasks of one worker. See the module docstring."""

    _TRANSITIONS: ClassVar[dict[tuple[str, str], Callable[[WorkerState, WTask, str], None]]]
    _HANDLERS: ClassVar[dict[type, Callable[[WorkerState, Any], None]]]
    plain_shortcuts = True  # plain tasks' straight path (core/worker/plain.py); tests vary it

    def __init__(
        self,
        nthreads: int,
        address: str = "",
        validate: bool = False,
        transfer_limit: int = 4,
        transfer_bytes_limit: int = 50_000_000,
        resources: Mapping[str, float] | None = None,
        data: MutableMapping[Key, Any] | None = None,
        memory_limit: int = 0,
    ):
        self.nthreads = nthreads
        self.memory_limit = memory_limit  # bytes; 0: none. A larger dependency is refused
        # Bytes of dependencies in flight at once, beyond the first transfer (as Dask's
        # distributed.worker.memory.transfer, 10% of the memory limit): data on its way
        # counts against memory before it lands.
        self.transfer_incoming_limit = memory_limit // 10 if memory_limit else 0
        self.address = address
        self.validate = validate
        self.transfer_limit = transfer_limit  # GatherDeps in flight at once
        self.transfer_bytes_limit = transfer_bytes_limit  # bytes asked per GatherDep
        # results by key: a dict, or the server's SpillBuffer (which may keep some on disk)
        self.data: MutableMapping[Key, Any] = {} if data is None else data
        self._store = getattr(self.data, "store", None)  # see Releases._store_result
        self.paused = False
        self.tasks: dict[Key, WTask] = {}
        self._story = StoryLog()
        self._log = self._story.append
        # Where transitions are recorded: the story, and while watched a sink too.
        self._record_transition: Record = self._story.append
        self._out: list[Instruction] = []
        self._ready: list[tuple[tuple[int, ...], int, WTask]] = []  # heap, lazy deletion
        self._constrained: list[tuple[tuple[int, ...], int, WTask]] = []  # ready, need resources
        self.total_resources: dict[str, float] = dict(resources or {})
        self.available_resources = dict(self.total_resources)  # less what executions hold
        self._ready_seq = 0
        self._n_ready = 0
        self._recent_duration = PIPELINE_WINDOW
        self._durations_measured = False  # until a task has ended: one task per thread
        self._executing: set[WTask] = set()  # Execute sent, no result yet: a busy thread
        # Running on threads of their own, not counted against the execution limit:
        self._seceded: set[WTask] = set()  # seceded (waiting on other tasks, say)
        self._rejoining: dict[WTask, None] = {}  # asked to rejoin, in order; not resumed yet
        # Rejoined (resumed) and still running, on threads of their own besides the pool's:
        # while there are any, nothing runs ahead (a pool thread would take it at once).
        self._rejoined: set[WTask] = set()
        self._data_needed: dict[str, dict[WTask, None]] = {}  # peer -> its tasks in fetch
        self._has_what: dict[str, dict[WTask, None]] = {}  # peer -> tasks naming it
        self._in_flight: dict[str, list[WTask]] = {}  # peer -> the tasks of its GatherDep
        self._in_flight_bytes: dict[str, int] = {}  # peer -> bytes its GatherDep asked for
        self._to_release: list[WTask] = []  # tasks that may have lost their last reason
        # Released executions still on a counted thread -> ComputeReleased answers owed.
        self._drains: dict[WTask, int] = {}
        # Running executions interrupted (force-cancelled) -> the id of the Interrupt.
        self._interrupted: dict[WTask, int] = {}
        self._interrupt_ids = 0
        self._unvalidated = 0  # events and instructions since the last full check
        # Moves into (+1) and out of (-1) each state, kept by _transition: tasks per
        # state without a scan (task_counts; new tasks start released, uncounted here).
        self._moves: dict[str, int] = {}

    @property
    def executing_count(self) -> int:
        """Busy threads (including executions of tasks cancelled meanwhile); seceded
        tasks do not count."""
        return len(self._executing)

    @property
    def seceded_count(self) -> int:
        """Running tasks that left the thread count (seceded, or waiting to rejoin)."""
        return len(self._seceded) + len(self._rejoining)

    def _running(self, ts: WTask) -> bool:
        """A thread runs ``ts`` (counted, seceded or waiting to rejoin)."""
        return ts in self._executing or ts in self._seceded or ts in self._rejoining

    @property
    def ready_count(self) -> int:
        return self._n_ready

    def handle(self, *events: Event) -> list[Instruction]:
        """Apply a batch of events; return what the server must do, in order."""
        out = self._out = []
        sid = ""
        for ev in events:
            sid = ev.stimulus_id  # type: ignore[union-attr]
            self._HANDLERS[type(ev)](self, ev)
            self._release_pending(sid)
        if events:  # once per batch, so that the batch is ordered by priority
            self._ensure_communicating(sid)
            self._release_pending(sid)  # what could not be fetched at all
            self._ensure_computing(sid)
        if self.validate:
            # As the scheduler's: every batch while small, amortised once there are many
            # tasks, and always when no thread is busy.
            self._unvalidated += 1 + len(events) + len(out)
            if not self._executing or self._unvalidated * 8 >= len(self.tasks):
                self._unvalidated = 0
                self.validate_state()
        return out

    def _release_pending(self, sid: str) -> None:
        while self._to_release:
            ts = self._to_release.pop()
            if not ts.dependents and not ts.wanted:
                self._release(ts, sid)

    def story(self, *keys: Key) -> list[tuple[Any, ...]]:
        return self._story.story(*keys)

    def watch_transitions(
        self, sink: list[tuple[Any, ...]] | None, wake: Callable[[], None] | None = None
    ) -> None:
        """Append every transition ``(key, start, finish, stimulus_id)`` to ``sink`` as
        well as to the story, calling ``wake()`` when ``sink`` stops being empty; or
        stop (None). Plugins' ``transition`` hooks are fed so; unwatched, a transition
        costs what it did before plugins existed."""
        self._record_transition = transition_recorder(self._story.append, sink, wake)

    # --- transitions ------------------------------------------------------------------

    def _transition(self, ts: WTask, finish: str, sid: str) -> None:
        start = ts.state
        func = self._TRANSITIONS.get((start, finish))
        if func is None:
            raise InvalidTransition(ts.key, start, finish, self._story.story(ts.key))
        self._record_transition((ts.key, start, finish, sid))
        func(self, ts, sid)
        moves = self._moves
        moves[start] = moves.get(start, 0) - 1
        end = ts.state
        moves[end] = moves.get(end, 0) + 1

    def task_counts(self) -> dict[str, int]:
        """Tasks per state (those with any), O(states): for ``/metrics``."""
        counts = {s: n for s, n in self._moves.items() if n > 0 and s not in _UNCOUNTED}
        released = len(self.tasks) - sum(counts.values())
        if released > 0:
            counts["released"] = released
        return counts

    def _transition_released_waiting(self, ts: WTask, sid: str) -> None:
        ts.state = "waiting"

    def _transition_released_ready(self, ts: WTask, sid: str) -> None:
        ts.state = "ready"
        seq = ts.ready_seq = self._ready_seq
        self._ready_seq = seq + 1
        self._n_ready += 1
        heap = self._ready if ts.resources is None else self._constrained
        heapq.heappush(heap, (ts.priority, seq, ts))
        if len(heap) > 2 * self._n_ready + 1024:  # drop stale entries now and then
            heap[:] = [e for e in heap if e[2].state == "ready" and e[2].ready_seq == e[1]]
            heapq.heapify(heap)

    def _transition_released_fetch(self, ts: WTask, sid: str) -> None:
        ts.state = "fetch"
        for w in sorted(ts.who_has):  # usually none yet: _add_who_has follows
            self._data_needed.setdefault(w, {})[ts] = None

    def _transition_released_memory(self, ts: WTask, sid: str) -> None:
        """Every ``* -> memory`` ends here; the caller has put the value in ``data``."""
        self._done(ts, "memory")
        for dependent in ts.dependents:
            waiting = dependent.waiting_for_data
            if ts in waiting:
                waiting.discard(ts)
                if not waiting and dependent.state == "waiting":
                    self._transition(dependent, "ready", sid)

    def _transition_released_forgotten(self, ts: WTask, sid: str) -> None:
        ts.state = "forgotten"
        del self.tasks[ts.key]

    def _transition_waiting_released(self, ts: WTask, sid: str) -> None:
        """Every ``* -> released`` ends here."""
        self._done(ts, "released")
        ts.coming_from = ts.previous = None

    def _transition_ready_executing(self, ts: WTask, sid: str) -> None:
        self._n_ready -= 1
        ts.state = "executing"
        self._executing.add(ts)
        if ts.resources is not None:
            available = self.available_resources
            for resource, need in ts.resources.items():
                available[resource] -= need
        self._out.append(Execute(ts.key, sid))

    def _transition_ready_released(self, ts: WTask, sid: str) -> None:
        self._n_ready -= 1
        self._transition_waiting_released(ts, sid)

    def _transition_ready_memory(self, ts: WTask, sid: str) -> None:
        self._n_ready -= 1
        self._transition_released_memory(ts, sid)

    def _transition_executing_error(self, ts: WTask, sid: str) -> None:
        self._done(ts, "error")

    def _transition_waiting_error(self, ts: WTask, sid: str) -> None:
        """A dependency's data cannot be had (``_transfer_failed``)."""
        self._done(ts, "error")

    def _transition_executing_cancelled(self, ts: WTask, sid: str) -> None:
        ts.state = "cancelled"  # dependencies stay linked: the thread may still read them
        ts.previous = "executing"

    def _transition_fetch_flight(self, ts: WTask, sid: str) -> None:
        self._unfetch(ts)  # the caller has set coming_from and _in_flight
        ts.state = "flight"

    def _transition_fetch_released(self, ts: WTask, sid: str) -> None:
        self._unfetch(ts)
        self._transition_waiting_released(ts, sid)

    def _transition_fetch_memory(self, ts: WTask, sid: str) -> None:
        self._unfetch(ts)
        self._transition_released_memory(ts, sid)

    def _transition_flight_fetch(self, ts: WTask, sid: str) -> None:
        ts.coming_from = None
        self._transition_released_fetch(ts, sid)

    def _transition_flight_memory(self, ts: WTask, sid: str) -> None:
        ts.coming_from = None  # left in its GatherDep's list, skipped when that ends
        self._transition_released_memory(ts, sid)

    def _transition_flight_cancelled(self, ts: WTask, sid: str) -> None:
        ts.state = "cancelled"
        ts.previous = "flight"

    def _transition_cancelled_executing(self, ts: WTask, sid: str) -> None:
        ts.state = "executing"
        ts.previous = None

    def _transition_cancelled_flight(self, ts: WTask, sid: str) -> None:
        ts.state = "flight"
        ts.previous = None

    def _transition_cancelled_memory(self, ts: WTask, sid: str) -> None:
        ts.coming_from = ts.previous = None  # a running thread stays counted until it ends
        self._transition_released_memory(ts, sid)

    def _transition_memory_released(self, ts: WTask, sid: str) -> None:
        del self.data[ts.key]
        self._transition_waiting_released(ts, sid)

    def _transition_memory_cancelled(self, ts: WTask, sid: str) -> None:
        del self.data[ts.key]  # scattered over a running task, then freed
        ts.state = "cancelled"
        ts.previous = "executing"

    _transition_waiting_ready = _transition_released_ready
    _transition_waiting_memory = _transition_released_memory
    _transition_executing_memory = _transition_released_memory
    _transition_error_memory = _transition_released_memory
    _transition_flight_released = _transition_waiting_released
    _transition_cancelled_released = _transition_waiting_released
    _transition_error_released = _transition_waiting_released

    def _done(self, ts: WTask, state: str) -> None:
        """Drop what only a task on its way needs: dependencies, holders, run_spec."""
        if ts.dependencies:
            for dep in ts.dependencies:
                dep.dependents.discard(ts)
                if not dep.dependents and not dep.wanted:
                    self._to_release.append(dep)
            ts.dependencies = ts.waiting_for_data = _NO_SET
        if ts.who_has:
            for w in ts.who_has:
                _unindex(self._has_what, w, ts)
            ts.who_has = _NO_SET
        ts.state = state
        ts.run_spec = None

    def _unfetch(self, ts: WTask) -> None:
        for w in ts.who_has:
            _unindex(self._data_needed, w, ts)

    def _release(self, ts: WTask, sid: str) -> None:
        """Drop a task without reason to stay: forget it, or cancel what still runs."""
        st = ts.state
        if st == "cancelled" or st == "forgotten":
            return
        if st == "flight" or self._running(ts):
            self._transition(ts, "cancelled", sid)
            return
        if st == "memory" and not ts.dependents:
            self._forget_result(ts, sid)
            return
        if st != "released":
            self._transition(ts, "released", sid)
        if not ts.dependents:
            self._transition(ts, "forgotten", sid)

    def _add_who_has(self, ts: WTask, workers: list[str]) -> None:
        for w in workers:
            if w != self.address and w not in ts.who_has:
                if w in ts.missed_on:  # the scheduler says it has the key again
                    ts.missed_on = tuple(x for x in ts.missed_on if x != w)
                if ts.who_has is _NO_SET:
                    ts.who_has = set()
                ts.who_has.add(w)
                self._has_what.setdefault(w, {})[ts] = None
                if ts.state == "fetch":
                    self._data_needed.setdefault(w, {})[ts] = None

    # --- event handlers -----------------------------------------------------------------

    def _handle_compute(self, ev: ComputeTask, sid: str = "") -> None:
        key = ev.key
        sid = sid or ev.stimulus_id
        self._log((key, "ComputeTask", sid))
        ts = self.tasks.get(key)
        if ts is not None and ts.state not in ("released", "fetch", "error"):
            ts.wanted = True
            ts.run_id = ev.run_id  # what runs or is held answers this assignment now
            st = ts.state
            if st == "memory":
                msg = m.TaskFinished(
                    key,
                    ts.nbytes,
                    ts.start,
                    ts.stop,
                    type_name=ts.type_name,
                    stimulus_id=sid,
                    run_id=ev.run_id,
                )
                self._out.append(SendMessage(msg, sid))
            elif st == "flight" or ts.previous == "flight":
                ts.resume = ev  # computed here if the transfer fails
                if st == "cancelled":
                    self._transition(ts, "flight", sid)
            elif st == "cancelled":
                if ts in self._interrupted:  # computed afresh once its thread has ended
                    ts.resume = ev
                else:  # still running: its result counts again, and its thread
                    self._transition(ts, "executing", sid)
                    self._answer_drains(ts, sid)
            return  # else waiting, ready or executing already
        deps = ev.deps
        if deps and (missing := self._missing_deps(key, deps)):
            told = {d.key: d.who_has for d in deps}
            tried = [list(told[k]) for k in missing]
            self._out.append(SendMessage(m.MissingData(key, missing, sid, tried), sid))
            if ts is not None and ts.state != "fetch":
                if ts.state == "error":
                    self._transition(ts, "released", sid)
                ts.wanted = False
                self._to_release.append(ts)
            return
        if ts is None:
            ts = self.tasks[key] = WTask(key)
        elif ts.state != "released":
            self._transition(ts, "released", sid)
        ts.run_spec = (ev.func, ev.payload)
        ts.run_id = ev.run_id
        ts.priority = ev.priority
        ts.resources = ev.resources or None
        ts.wanted = True
        if deps:
            self._link(ts, deps, sid)
        self._transition(ts, "waiting" if ts.waiting_for_data else "ready", sid)

    def _missing_deps(self, key: Key, deps: list[DepInfo]) -> list[Key]:
        """Dependencies neither here nor on any peer we are told of."""
        missing = []
        for d in deps:
            dts = self.tasks.get(d.key)
            if d.key == key or (dts is not None and dts.state not in ("released", "error")):
                continue
            if all(w == self.address for w in d.who_has):
                missing.append(d.key)
        return missing

    def _link(self, ts: WTask, deps: list[DepInfo], sid: str) -> None:
        tasks = self.tasks
        ts.dependencies = set()
        ts.waiting_for_data = set()
        for d in deps:
            if d.key == ts.key:
                continue
            dts = tasks.get(d.key)
            if dts is None:
                dts = tasks[d.key] = WTask(d.key)
                dts.nbytes = d.nbytes
                self._transition(dts, "fetch", sid)
            elif dts.state == "error" or dts.state == "released":
                if dts.state == "error":  # it failed here, but a peer holds it now
                    self._transition(dts, "released", sid)
                    dts.wanted = False
                dts.nbytes = d.nbytes
                self._transition(dts, "fetch", sid)
            elif dts.state == "cancelled" and dts not in self._interrupted:
                self._transition(dts, dts.previous or "", sid)  # needed again: run or arrive
            if dts.state != "memory":
                self._add_who_has(dts, d.who_has)  # peers in the order given
                ts.waiting_for_data.add(dts)
            ts.dependencies.add(dts)
            if dts.dependents is _NO_SET:
                dts.dependents = set()
            dts.dependents.add(ts)

    def _handle_execute_success(self, ev: ExecuteSuccess) -> None:
        ts = self._finished(ev, "memory")
        if ts is not None:
            self._store_result(ev)
            ts.nbytes = ev.nbytes
            ts.type_name = ev.type_name
            self._transition(ts, "memory", ev.stimulus_id)
            if ts.wanted:
                msg = m.TaskFinished(
                    ev.key,
                    ev.nbytes,
                    ev.start,
                    ev.stop,
                    ev.inline,
                    ev.type_name,
                    ev.stimulus_id,
                    ts.run_id,
                )
                self._out.append(SendMessage(msg, ev.stimulus_id))

    def _handle_execute_failure(self, ev: ExecuteFailure) -> None:
        ts = self._finished(ev, "error")
        if ts is not None:
            self._transition(ts, "error", ev.stimulus_id)
            if ts.wanted:
                msg = m.TaskErred(
                    ev.key,
                    ev.exception,
                    ev.traceback,
                    ev.start,
                    ev.stop,
                    ev.stimulus_id,
                    run_id=ts.run_id,
                )
                self._out.append(SendMessage(msg, ev.stimulus_id))

    def _handle_copy_keys(self, ev: m.CopyKeys) -> None:
        """Fetch replicas the scheduler asks for (data leaving a retiring worker); they
        are reported with AddKeys once here, like any fetched key."""
        sid = ev.stimulus_id
        for d in ev.deps:
            peers = [w for w in d.who_has if w != self.address]
            ts = self.tasks.get(d.key)
            if not peers or (ts is not None and ts.state not in ("released", "error")):
                continue  # here, on its way, or being computed: reported when done
            if ts is None:
                ts = self.tasks[d.key] = WTask(d.key)
            elif ts.state == "error":
                self._transition(ts, "released", sid)
            self._log((d.key, "CopyKeys", sid))
            ts.nbytes = d.nbytes
            ts.wanted = True  # kept once it arrives
            self._transition(ts, "fetch", sid)
            self._add_who_has(ts, peers)

    def _handle_update_data(self, ev: UpdateDataEvent) -> None:
        for key, value in ev.data.items():
            ts = self.tasks.get(key)
            if ts is None:
                ts = self.tasks[key] = WTask(key)
            self._log((key, "UpdateData", ev.stimulus_id))
            self.data[key] = value
            ts.nbytes = ev.nbytes.get(key, ts.nbytes)
            assigned = ts.run_spec is not None and ts.wanted  # the scheduler awaits a result
            ts.wanted = True
            ts.resume = None
            if ts.state != "memory":
                self._transition(ts, "memory", ev.stimulus_id)
            if assigned:  # its own result will be dropped: report this one (untimed)
                msg = m.TaskFinished(
                    key, ts.nbytes, 0.0, 0.0, stimulus_id=ev.stimulus_id, run_id=ts.run_id
                )
                self._out.append(SendMessage(msg, ev.stimulus_id))

    def _handle_secede(self, ev: Secede) -> None:
        self._log((ev.key, "Secede", ev.stimulus_id))
        ts = self.tasks.get(ev.key)
        if ts is None or ts not in self._executing:  # only a counted running task secedes
            start = "forgotten" if ts is None else ts.state
            raise InvalidTransition(ev.key, start, "seceded", self._story.story(ev.key))
        self._executing.discard(ts)
        self._rejoined.discard(ts)
        self._seceded.add(ts)  # resources stay held: the thread still runs
        if self._drains:  # its thread no longer counts
            self._answer_drains(ts, ev.stimulus_id)
        if ts.state == "executing" and ts.wanted:  # the scheduler counts it out too
            msg = m.TaskSeceded(ev.key, ev.stimulus_id)
            self._out.append(SendMessage(msg, ev.stimulus_id))

    def _handle_rejoin(self, ev: Rejoin) -> None:
        self._log((ev.key, "Rejoin", ev.stimulus_id))
        ts = self.tasks.get(ev.key)
        if ts is None or ts not in self._seceded:
            start = "forgotten" if ts is None else ts.state
            raise InvalidTransition(ev.key, start, "rejoining", self._story.story(ev.key))
        self._seceded.discard(ts)
        self._rejoining[ts] = None  # resumed by _ensure_computing once a slot is free

    def _handle_pause(self, ev: Pause) -> None:
        if not self.paused:
            self.paused = True
            msg = m.WorkerStatus("paused", ev.stimulus_id)
            self._out.append(SendMessage(msg, ev.stimulus_id))

    def _handle_unpause(self, ev: Unpause) -> None:
        if self.paused:  # the end of the batch starts what waited
            self.paused = False
            msg = m.WorkerStatus("running", ev.stimulus_id)
            self._out.append(SendMessage(msg, ev.stimulus_id))

    def _handle_unserializable(self, ev: UnserializableData) -> None:
        ts = self.tasks.get(ev.key)
        if ts is None or ts.state != "memory" or not ts.wanted:
            return  # gone meanwhile, or reported already
        self._log((ev.key, "UnserializableData", ev.stimulus_id))
        ts.wanted = False  # local dependents may still read it; then it is dropped
        msg = m.KeyUnserializable(ev.key, ev.reason, ev.stimulus_id)
        self._out.append(SendMessage(msg, ev.stimulus_id))
        self._to_release.append(ts)

    # --- starting work ------------------------------------------------------------------

    @property
    def execution_limit(self) -> int:
        """How many tasks may be handed to the threads at once.

        One per thread for tasks of RUN_AHEAD_WINDOW or more, until a task has ended,
        and while a rejoined task runs (on a thread besides the pool's). Shorter tasks run ahead: each thread has one queued behind the one it
        runs, and goes from one to the next without waiting for the event loop (which
        then hands it the next). For tasks under PIPELINE_WINDOW each thread may have a
        few queued (about that window's worth), so completions reach the scheduler in
        batches rather than one frame per task. The priority order is kept; a newly
        arrived better task waits at most for what is queued.
        """
        d = self._recent_duration
        if not self._durations_measured or d >= RUN_AHEAD_WINDOW or self._rejoined:
            return self.nthreads
        if d >= PIPELINE_WINDOW:
            return 2 * self.nthreads
        return self.nthreads * (1 + min(MAX_PIPELINE, int(PIPELINE_WINDOW / max(d, 1e-6))))

    def _ensure_computing(self, sid: str) -> None:
        """Start the best ready tasks while threads are free. The best task that needs
        resources starts once they are free; the others start meanwhile (as Dask).

        Rejoining tasks come first, also while paused: they already run and hold their
        memory; pausing only keeps new tasks from starting. A rejoining task waits for a
        thread, not a place in the queue (tasks run ahead of their threads): it resumes
        once fewer than ``nthreads`` tasks are handed out, and no new task is handed out
        while one waits, so that it waits at most for what was queued before it."""
        rejoining = self._rejoining
        while rejoining and len(self._executing) < self.nthreads:
            ts = next(iter(rejoining))
            del rejoining[ts]
            self._executing.add(ts)
            self._rejoined.add(ts)
            self._log((ts.key, "ResumeThread", sid))
            self._out.append(ResumeThread(ts.key, sid))
        if self.paused or rejoining:
            return
        limit = self.execution_limit  # (once the rejoined are counted)
        ready, constrained = self._ready, self._constrained
        while len(self._executing) < limit:
            best = _live_top(ready)
            held = _live_top(constrained)
            if held is not None and self._fits(held[2]) and (best is None or held < best):
                heap = constrained
            elif best is not None:
                heap = ready
            else:
                return
            self._transition(heapq.heappop(heap)[2], "executing", sid)

    def _fits(self, ts: WTask) -> bool:
        """Enough of each resource ``ts`` needs is free here now."""
        available = self.available_resources
        needs = ts.resources or {}
        return all(k in available and available[k] >= need - SLACK for k, need in needs.items())

    # --- invariants ---------------------------------------------------------------------

    def validate_state(self) -> None:
        """Check every invariant; raise InvalidState on the first one broken."""
        from shoal.core.worker.validation import validate_worker_state  # imports this module

        validate_worker_state(self)


def _live_top(
    heap: list[tuple[tuple[int, ...], int, WTask]],
) -> tuple[tuple[int, ...], int, WTask] | None:
    """The best entry of a ready heap whose task is still ready, dropping stale ones."""
    while heap:
        entry = heap[0]
        ts = entry[2]
        if ts.state == "ready" and ts.ready_seq == entry[1]:
            return entry
        heapq.heappop(heap)
    return None


# The one transition table: (start, finish) -> WorkerState._transition_<start>_<finish>
WorkerState._TRANSITIONS = {
    (start, finish): getattr(WorkerState, name)
    for name in dir(WorkerState)
    if name.startswith("_transition_")
    for start, _, finish in [name.removeprefix("_transition_").partition("_")]
}
WorkerState._HANDLERS = {
    ComputeTask: plain.handle_compute,
    FreeKeys: plain.handle_free_keys,
    m.ReleaseCompute: WorkerState._handle_release_compute,
    m.StealRequest: WorkerState._handle_steal_request,
    InterruptExpired: WorkerState._handle_interrupt_expired,
    ExecuteSuccess: plain.handle_execute_success,
    ExecuteFailure: WorkerState._handle_execute_failure,
    GatherSuccess: WorkerState._handle_gather_success,
    GatherFailure: WorkerState._handle_gather_failure,
    UpdateDataEvent: WorkerState._handle_update_data,
    m.CopyKeys: WorkerState._handle_copy_keys,
    Pause: WorkerState._handle_pause,
    Unpause: WorkerState._handle_unpause,
    UnserializableData: WorkerState._handle_unserializable,
    Secede: WorkerState._handle_secede,
    Rejoin: WorkerState._handle_rejoin,
}
