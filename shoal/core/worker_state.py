"""The worker's state machine: events in, instructions out.

Pure and synchronous (no asyncio, sockets, threads, clocks or config): the asyncio worker
server turns messages from the scheduler, peers and its executor threads into events, calls
:meth:`WorkerState.handle` and carries out the returned instructions.

Lifecycle of a key on a worker (``forgotten`` means removed from ``tasks``)::

    compute: released -> waiting -> ready -> executing -> memory | error
    fetch:   released -> fetch -> flight -> memory           (a dependency held by a peer)
    freed while executing or in flight: -> cancelled -> forgotten when it ends

A task is kept while the scheduler wants it here (``wanted``: it sent ComputeTask, or we
told it we hold the key) or while a local task depends on it (``dependents``). Dependency
links exist only while the dependent still needs its inputs (waiting, ready, executing).
When a task loses both reasons it is released: forgotten, or cancelled if an execution or
a transfer is still running. A ``released`` task that survives a batch is a stub some local
task still depends on (the scheduler will reschedule or free it).

Assumption about the server: it reads the dependency values of an ``Execute`` from
``data`` before it feeds the next batch of events.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from shoal.core.story import InvalidState, InvalidTransition, StoryLog
from shoal.protocol.messages import (
    AddKeys,
    ComputeTask,
    DepInfo,
    FreeKeys,
    Key,
    Message,
    MissingData,
    Payload,
    TaskErred,
    TaskFinished,
)

__all__ = [
    "WTask",
    "WorkerState",
    "WorkerEvent",
    "ExecuteSuccess",
    "ExecuteFailure",
    "GatherSuccess",
    "GatherFailure",
    "UpdateDataEvent",
    "Event",
    "Instruction",
    "Execute",
    "GatherDep",
    "SendMessage",
    "STATES",
]

STATES = frozenset(
    {"released", "waiting", "fetch", "flight", "ready", "executing", "memory", "error", "cancelled"}
)


# --- events ---------------------------------------------------------------------------


class WorkerEvent(msgspec.Struct):
    """Base of the events made by the worker server itself (not wire messages)."""


class ExecuteSuccess(WorkerEvent):
    key: Key
    value: Any
    nbytes: int
    inline: Payload | None
    type_name: str
    start: float
    stop: float
    stimulus_id: str


class ExecuteFailure(WorkerEvent):
    key: Key
    exception: Payload
    traceback: str
    start: float
    stop: float
    stimulus_id: str


class GatherSuccess(WorkerEvent):
    """A GatherDep ended: ``data`` holds what the peer sent, ``missing`` what it lacked."""

    worker: str
    data: dict[Key, Any]
    nbytes: dict[Key, int]
    missing: list[Key]
    stimulus_id: str


class GatherFailure(WorkerEvent):
    """A GatherDep ended because the peer could not be reached."""

    worker: str
    keys: list[Key]
    stimulus_id: str


class UpdateDataEvent(WorkerEvent):
    """A client scattered data onto this worker."""

    data: dict[Key, Any]
    nbytes: dict[Key, int]
    stimulus_id: str


Event = ComputeTask | FreeKeys | WorkerEvent


# --- instructions ---------------------------------------------------------------------


class Instruction(msgspec.Struct, gc=False):
    """Base of what the server must do after a call to ``handle``."""


class Execute(Instruction):
    key: Key
    stimulus_id: str


class GatherDep(Instruction):
    worker: str
    keys: list[Key]
    total_nbytes: int
    stimulus_id: str


class SendMessage(Instruction):
    msg: Message
    stimulus_id: str


# --- tasks ----------------------------------------------------------------------------


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
        "coming_from",  # for "flight" and cancelled flight: the peer asked
        "resume",  # ComputeTask received while the key was in flight
        "ready_seq",  # identifies this task's live entry in the ready heap
    )

    def __init__(self, key: Key):
        self.key = key
        self.state = "released"
        self.run_spec: tuple[str, Payload] | None = None
        self.priority: tuple[int, ...] = ()
        self.dependencies: set[WTask] = set()
        self.dependents: set[WTask] = set()
        self.waiting_for_data: set[WTask] = set()
        self.who_has: set[str] = set()
        self.nbytes = 0
        self.start = 0.0
        self.stop = 0.0
        self.type_name = ""
        self.wanted = False
        self.previous: str | None = None
        self.coming_from: str | None = None
        self.resume: ComputeTask | None = None
        self.ready_seq = -1

    def __repr__(self) -> str:
        return f"<WTask {self.key!r} {self.state}>"


_TransitionFunc = Callable[["WorkerState", WTask, str], None]


class WorkerState:
    """The state of one worker's tasks. See the module docstring."""

    _TRANSITIONS: ClassVar[dict[tuple[str, str], _TransitionFunc]]
    _HANDLERS: ClassVar[dict[type, Callable[[WorkerState, Any], None]]]

    def __init__(
        self,
        nthreads: int,
        address: str = "",
        validate: bool = False,
        transfer_limit: int = 4,
        transfer_bytes_limit: int = 50_000_000,
    ):
        self.nthreads = nthreads
        self.address = address
        self.validate = validate
        self.transfer_limit = transfer_limit
        self.transfer_bytes_limit = transfer_bytes_limit
        self.data: dict[Key, Any] = {}
        self.tasks: dict[Key, WTask] = {}
        self._story = StoryLog()
        self._instructions: list[Instruction] = []
        self._ready: list[tuple[tuple[int, ...], int, WTask]] = []  # heap, lazy deletion
        self._ready_seq = 0
        self._n_ready = 0
        self._executing: set[WTask] = set()  # Execute issued, no result yet (thread busy)
        self._data_needed: dict[str, dict[WTask, None]] = {}  # peer -> its tasks in "fetch"
        self._has_what: dict[str, set[WTask]] = {}  # peer -> tasks listing it in who_has
        self._in_flight: dict[str, list[WTask]] = {}  # peer -> tasks of its GatherDep
        self._pending_release: list[WTask] = []

    # --- public API -------------------------------------------------------------------

    @property
    def executing_count(self) -> int:
        """Threads busy (including executions whose task was cancelled meanwhile)."""
        return len(self._executing)

    @property
    def ready_count(self) -> int:
        return self._n_ready

    def handle(self, *events: Event) -> list[Instruction]:
        out = self._instructions = []
        handlers = self._HANDLERS
        sid = ""
        for ev in events:
            sid = ev.stimulus_id  # type: ignore[union-attr]
            handlers[type(ev)](self, ev)
            if self._pending_release:
                self._drain(sid)
        if events:
            self._ensure_communicating(sid)
            self._ensure_computing(sid)
        if self.validate:
            self.validate_state()
        return out

    def story(self, *keys: Key) -> list[tuple[Any, ...]]:
        return self._story.story(*keys)

    # --- transitions machinery ----------------------------------------------------------

    def _transition(self, ts: WTask, finish: str, sid: str) -> None:
        start = ts.state
        func = self._TRANSITIONS.get((start, finish))
        if func is None:
            raise InvalidTransition(ts.key, start, finish, self._story.story(ts.key))
        self._story.append((ts.key, start, finish, sid))
        func(self, ts, sid)

    def _send(self, msg: Message, sid: str) -> None:
        self._instructions.append(SendMessage(msg, sid))

    def _release(self, ts: WTask, sid: str) -> None:
        """Drop a task nobody wants: forget it, or cancel what is still running."""
        st = ts.state
        if st == "cancelled" or st == "forgotten":
            return
        if st == "flight" or ts in self._executing:
            self._transition(ts, "cancelled", sid)
            return
        if st != "released":
            self._transition(ts, "released", sid)
        if not ts.dependents:
            self._transition(ts, "forgotten", sid)

    def _drain(self, sid: str) -> None:
        pending = self._pending_release
        while pending:
            ts = pending.pop()
            if not ts.dependents and not ts.wanted:
                self._release(ts, sid)

    def _unlink_dependencies(self, ts: WTask) -> None:
        for dep in ts.dependencies:
            dep.dependents.discard(ts)
            if not dep.dependents and not dep.wanted:
                self._pending_release.append(dep)
        ts.dependencies.clear()
        ts.waiting_for_data.clear()

    def _add_who_has(self, ts: WTask, workers: list[str]) -> None:
        for w in workers:
            if w != self.address and w not in ts.who_has:
                ts.who_has.add(w)
                self._has_what.setdefault(w, set()).add(ts)
                if ts.state == "fetch":
                    self._data_needed.setdefault(w, {})[ts] = None

    def _remove_who_has(self, ts: WTask, worker: str) -> None:
        if worker not in ts.who_has:
            return
        ts.who_has.remove(worker)
        holders = self._has_what[worker]
        holders.discard(ts)
        if not holders:
            del self._has_what[worker]
        if ts.state == "fetch":
            needed = self._data_needed[worker]
            del needed[ts]
            if not needed:
                del self._data_needed[worker]

    def _clear_who_has(self, ts: WTask) -> None:
        has_what = self._has_what
        for w in ts.who_has:
            holders = has_what[w]
            holders.discard(ts)
            if not holders:
                del has_what[w]
        ts.who_has.clear()

    def _add_data_needed(self, ts: WTask) -> None:
        needed = self._data_needed
        for w in ts.who_has:
            d = needed.get(w)
            if d is None:
                d = needed[w] = {}
            d[ts] = None

    def _remove_data_needed(self, ts: WTask) -> None:
        needed = self._data_needed
        for w in ts.who_has:
            d = needed[w]
            del d[ts]
            if not d:
                del needed[w]

    def _push_ready(self, ts: WTask) -> None:
        ts.state = "ready"
        seq = ts.ready_seq = self._ready_seq
        self._ready_seq = seq + 1
        self._n_ready += 1
        heap = self._ready
        heapq.heappush(heap, (ts.priority, seq, ts))
        if len(heap) > 2 * self._n_ready + 1024:  # drop stale entries now and then
            heap[:] = [e for e in heap if e[2].state == "ready" and e[2].ready_seq == e[1]]
            heapq.heapify(heap)

    def _to_released(self, ts: WTask) -> None:
        """Shared tail of every ``* -> released``."""
        self._unlink_dependencies(ts)
        self._clear_who_has(ts)
        ts.state = "released"
        ts.run_spec = None
        ts.coming_from = None
        ts.previous = None

    # --- transitions ------------------------------------------------------------------

    def _transition_released_waiting(self, ts: WTask, sid: str) -> None:
        ts.state = "waiting"

    def _transition_released_ready(self, ts: WTask, sid: str) -> None:
        self._push_ready(ts)

    def _transition_released_fetch(self, ts: WTask, sid: str) -> None:
        ts.state = "fetch"
        self._add_data_needed(ts)

    def _transition_released_memory(self, ts: WTask, sid: str) -> None:
        self._memory(ts, sid)

    def _transition_released_forgotten(self, ts: WTask, sid: str) -> None:
        self._clear_who_has(ts)
        ts.state = "forgotten"
        del self.tasks[ts.key]

    def _transition_waiting_ready(self, ts: WTask, sid: str) -> None:
        self._push_ready(ts)

    def _transition_waiting_released(self, ts: WTask, sid: str) -> None:
        self._to_released(ts)

    def _transition_waiting_memory(self, ts: WTask, sid: str) -> None:
        self._memory(ts, sid)

    def _transition_ready_executing(self, ts: WTask, sid: str) -> None:
        self._n_ready -= 1
        ts.state = "executing"
        self._executing.add(ts)
        self._instructions.append(Execute(ts.key, sid))

    def _transition_ready_released(self, ts: WTask, sid: str) -> None:
        self._n_ready -= 1
        self._to_released(ts)

    def _transition_ready_memory(self, ts: WTask, sid: str) -> None:
        self._n_ready -= 1
        self._memory(ts, sid)

    def _transition_executing_memory(self, ts: WTask, sid: str) -> None:
        self._memory(ts, sid)

    def _transition_executing_error(self, ts: WTask, sid: str) -> None:
        self._unlink_dependencies(ts)
        self._clear_who_has(ts)
        ts.state = "error"
        ts.run_spec = None

    def _transition_executing_cancelled(self, ts: WTask, sid: str) -> None:
        # keep the dependencies: the thread may not have read them yet
        ts.state = "cancelled"
        ts.previous = "executing"

    def _transition_fetch_flight(self, ts: WTask, sid: str) -> None:
        self._remove_data_needed(ts)  # the caller set coming_from and _in_flight
        ts.state = "flight"

    def _transition_fetch_released(self, ts: WTask, sid: str) -> None:
        self._remove_data_needed(ts)
        self._to_released(ts)

    def _transition_fetch_memory(self, ts: WTask, sid: str) -> None:
        self._remove_data_needed(ts)
        self._memory(ts, sid)

    def _transition_flight_memory(self, ts: WTask, sid: str) -> None:
        ts.coming_from = None  # stays in its GatherDep's list, ignored when that ends
        self._memory(ts, sid)

    def _transition_flight_fetch(self, ts: WTask, sid: str) -> None:
        ts.coming_from = None
        ts.state = "fetch"
        self._add_data_needed(ts)

    def _transition_flight_released(self, ts: WTask, sid: str) -> None:
        self._to_released(ts)

    def _transition_flight_cancelled(self, ts: WTask, sid: str) -> None:
        ts.state = "cancelled"
        ts.previous = "flight"

    def _transition_cancelled_executing(self, ts: WTask, sid: str) -> None:
        ts.state = "executing"
        ts.previous = None

    def _transition_cancelled_flight(self, ts: WTask, sid: str) -> None:
        ts.state = "flight"
        ts.previous = None

    def _transition_cancelled_released(self, ts: WTask, sid: str) -> None:
        self._to_released(ts)

    def _transition_cancelled_memory(self, ts: WTask, sid: str) -> None:
        ts.previous = None  # if it was executing, the thread stays counted until it ends
        ts.coming_from = None
        self._memory(ts, sid)

    def _transition_memory_released(self, ts: WTask, sid: str) -> None:
        del self.data[ts.key]
        self._to_released(ts)

    def _transition_memory_cancelled(self, ts: WTask, sid: str) -> None:
        # scattered over a running execution, then freed: wait for the thread to end
        del self.data[ts.key]
        ts.state = "cancelled"
        ts.previous = "executing"

    def _transition_error_released(self, ts: WTask, sid: str) -> None:
        self._to_released(ts)

    def _transition_error_memory(self, ts: WTask, sid: str) -> None:
        self._memory(ts, sid)

    def _memory(self, ts: WTask, sid: str) -> None:
        """Shared tail of every ``* -> memory`` (the caller has put the value in data)."""
        self._unlink_dependencies(ts)
        self._clear_who_has(ts)
        ts.state = "memory"
        ts.run_spec = None
        for dependent in ts.dependents:
            waiting = dependent.waiting_for_data
            if ts in waiting:
                waiting.discard(ts)
                if not waiting and dependent.state == "waiting":
                    self._transition(dependent, "ready", sid)

    # --- event handlers -----------------------------------------------------------------

    def _handle_compute(self, ev: ComputeTask) -> None:
        key = ev.key
        sid = ev.stimulus_id
        self._story.append((key, "ComputeTask", sid))
        ts = self.tasks.get(key)
        if ts is not None:
            st = ts.state
            if st == "memory":
                ts.wanted = True
                msg = TaskFinished(
                    key, ts.nbytes, ts.start, ts.stop, type_name=ts.type_name, stimulus_id=sid
                )
                self._send(msg, sid)
                return
            if st == "waiting" or st == "ready" or st == "executing":
                ts.wanted = True
                return
            if st == "flight" or (st == "cancelled" and ts.previous == "flight"):
                ts.wanted = True
                ts.resume = ev  # computed here only if the transfer fails
                if st == "cancelled":
                    self._transition(ts, "flight", sid)
                return
            if st == "cancelled":  # still executing: its result counts again
                ts.wanted = True
                self._transition(ts, "executing", sid)
                return
        deps = ev.deps
        if deps:
            missing = self._missing_deps(key, deps)
            if missing:
                self._send(MissingData(key, missing, sid), sid)
                if ts is not None and ts.state == "released":
                    ts.wanted = False
                    self._pending_release.append(ts)
                return
        if ts is None:
            ts = self.tasks[key] = WTask(key)
        elif ts.state != "released":  # fetch or error
            self._transition(ts, "released", sid)
        ts.run_spec = (ev.func, ev.payload)
        ts.priority = ev.priority
        ts.wanted = True
        if deps:
            self._link(ts, deps, sid)
        self._transition(ts, "waiting" if ts.waiting_for_data else "ready", sid)

    def _missing_deps(self, key: Key, deps: list[DepInfo]) -> list[Key]:
        """Dependencies that are neither here nor on any peer we know of."""
        missing: list[Key] = []
        tasks = self.tasks
        address = self.address
        for d in deps:
            dts = tasks.get(d.key)
            if d.key == key or (dts is not None and dts.state not in ("released", "error")):
                continue
            for w in d.who_has:
                if w != address:
                    break
            else:
                missing.append(d.key)
        return missing

    def _link(self, ts: WTask, deps: list[DepInfo], sid: str) -> None:
        tasks = self.tasks
        for d in deps:
            if d.key == ts.key:
                continue
            dts = tasks.get(d.key)
            if dts is None:
                dts = tasks[d.key] = WTask(d.key)
                dts.nbytes = d.nbytes
                self._add_who_has(dts, d.who_has)
                self._transition(dts, "fetch", sid)
            elif dts.state != "memory":
                st = dts.state
                if st == "error":  # erred here, but a peer holds it now
                    self._transition(dts, "released", sid)
                    dts.wanted = False
                    st = "released"
                if st != "executing" and st != "ready" and st != "waiting":
                    dts.nbytes = d.nbytes
                self._add_who_has(dts, d.who_has)
                if st == "released":
                    self._transition(dts, "fetch", sid)
                elif st == "cancelled":
                    self._transition(dts, dts.previous or "", sid)
            ts.dependencies.add(dts)
            dts.dependents.add(ts)
            if dts.state != "memory":
                ts.waiting_for_data.add(dts)

    def _handle_free_keys(self, ev: FreeKeys) -> None:
        sid = ev.stimulus_id
        tasks = self.tasks
        for key in ev.keys:
            ts = tasks.get(key)
            if ts is None:
                continue
            self._story.append((key, "FreeKeys", sid))
            ts.wanted = False
            ts.resume = None
            if not ts.dependents:
                self._release(ts, sid)

    def _running(self, key: Key, finish: str) -> WTask:
        ts = self.tasks.get(key)
        if ts is None or ts not in self._executing:
            start = "forgotten" if ts is None else ts.state
            raise InvalidTransition(key, start, finish, self._story.story(key))
        self._executing.discard(ts)
        return ts

    def _handle_execute_success(self, ev: ExecuteSuccess) -> None:
        key = ev.key
        sid = ev.stimulus_id
        self._story.append((key, "ExecuteSuccess", sid))
        ts = self._running(key, "memory")
        if ts.state == "executing":
            self.data[key] = ev.value
            ts.nbytes = ev.nbytes
            ts.start = ev.start
            ts.stop = ev.stop
            ts.type_name = ev.type_name
            self._transition(ts, "memory", sid)
            if ts.wanted:
                msg = TaskFinished(
                    key, ev.nbytes, ev.start, ev.stop, ev.inline, ev.type_name, stimulus_id=sid
                )
                self._send(msg, sid)
        elif ts.state == "cancelled":
            self._transition(ts, "released", sid)
            self._transition(ts, "forgotten", sid)
        # else memory: data was scattered meanwhile; this result is discarded

    def _handle_execute_failure(self, ev: ExecuteFailure) -> None:
        key = ev.key
        sid = ev.stimulus_id
        self._story.append((key, "ExecuteFailure", sid))
        ts = self._running(key, "error")
        if ts.state == "executing":
            ts.start = ev.start
            ts.stop = ev.stop
            self._transition(ts, "error", sid)
            if ts.wanted:
                msg = TaskErred(key, ev.exception, ev.traceback, ev.start, ev.stop, sid)
                self._send(msg, sid)
        elif ts.state == "cancelled":
            self._transition(ts, "released", sid)
            self._transition(ts, "forgotten", sid)

    def _handle_gather_success(self, ev: GatherSuccess) -> None:
        worker = ev.worker
        sid = ev.stimulus_id
        asked = self._in_flight.pop(worker, None)
        if asked is None:
            return
        data = ev.data
        keys: list[Key] = []
        nbytes: list[int] = []
        lost: list[WTask] = []
        for ts in asked:
            if ts.coming_from != worker:
                continue  # scattered or forgotten meanwhile
            key = ts.key
            self._story.append((key, "GatherSuccess", sid))
            if key not in data:
                self._remove_who_has(ts, worker)
                self._gather_missed(ts, sid, lost)
            elif ts.state == "cancelled":
                self._transition(ts, "released", sid)
                self._transition(ts, "forgotten", sid)
            else:
                self.data[key] = data[key]
                nb = ts.nbytes = ev.nbytes.get(key, ts.nbytes)
                resume = ts.resume
                ts.resume = None
                ts.wanted = True  # the scheduler is told below
                self._transition(ts, "memory", sid)
                if resume is not None:
                    self._send(TaskFinished(key, nb, 0.0, 0.0, stimulus_id=sid), sid)
                else:
                    keys.append(key)
                    nbytes.append(nb)
        if keys:
            self._send(AddKeys(keys, nbytes, sid), sid)
        self._lost(lost, sid)

    def _handle_gather_failure(self, ev: GatherFailure) -> None:
        worker = ev.worker
        sid = ev.stimulus_id
        lost: list[WTask] = []
        holders = self._has_what.pop(worker, None)
        if holders:
            self._data_needed.pop(worker, None)
            for ts in holders:
                ts.who_has.discard(worker)
                if ts.state == "fetch" and not ts.who_has:
                    self._story.append((ts.key, "GatherFailure", sid))
                    self._transition(ts, "released", sid)
                    lost.append(ts)
        for ts in self._in_flight.pop(worker, ()):
            if ts.coming_from == worker:
                self._story.append((ts.key, "GatherFailure", sid))
                self._gather_missed(ts, sid, lost)
        self._lost(lost, sid)

    def _gather_missed(self, ts: WTask, sid: str, lost: list[WTask]) -> None:
        """``ts`` (flight or cancelled) did not come from the peer asked."""
        if ts.state == "cancelled":
            self._transition(ts, "released", sid)
            self._transition(ts, "forgotten", sid)
        elif ts.who_has:
            self._transition(ts, "fetch", sid)
        elif ts.resume is not None:  # the scheduler asked us to compute it: do so
            ev = ts.resume
            ts.resume = None
            self._transition(ts, "released", sid)
            self._handle_compute(ev)
        else:
            self._transition(ts, "released", sid)
            lost.append(ts)

    def _lost(self, lost: list[WTask], sid: str) -> None:
        """No peer holds these released keys: give up their dependents (MissingData)."""
        if not lost:
            return
        by_dependent: dict[WTask, list[Key]] = {}
        for ts in lost:
            for dependent in ts.dependents:
                by_dependent.setdefault(dependent, []).append(ts.key)
            self._pending_release.append(ts)
        for dependent, keys in by_dependent.items():
            self._send(MissingData(dependent.key, keys, sid), sid)
            dependent.wanted = False
            dependent.resume = None
            self._release(dependent, sid)

    def _handle_update_data(self, ev: UpdateDataEvent) -> None:
        sid = ev.stimulus_id
        tasks = self.tasks
        for key, value in ev.data.items():
            ts = tasks.get(key)
            if ts is None:
                ts = tasks[key] = WTask(key)
            self._story.append((key, "UpdateData", sid))
            self.data[key] = value
            ts.nbytes = ev.nbytes.get(key, ts.nbytes)
            ts.wanted = True
            ts.resume = None
            if ts.state != "memory":
                self._transition(ts, "memory", sid)

    # --- scheduling work ----------------------------------------------------------------

    def _ensure_computing(self, sid: str) -> None:
        heap = self._ready
        executing = self._executing
        while heap and len(executing) < self.nthreads:
            _, seq, ts = heapq.heappop(heap)
            if ts.state == "ready" and ts.ready_seq == seq:
                self._transition(ts, "executing", sid)

    def _ensure_communicating(self, sid: str) -> None:
        needed = self._data_needed
        in_flight = self._in_flight
        limit = self.transfer_bytes_limit
        while needed and len(in_flight) < self.transfer_limit:
            # busy peers are skipped: at most transfer_limit of them
            worker = next((w for w in needed if w not in in_flight), None)
            if worker is None:
                return
            candidates = needed[worker]
            batch: list[WTask] = []
            total = 0
            for ts in candidates:
                if batch and total + ts.nbytes > limit:
                    break
                batch.append(ts)
                total += ts.nbytes
            in_flight[worker] = batch
            for ts in batch:
                ts.coming_from = worker
                self._transition(ts, "flight", sid)
            self._instructions.append(GatherDep(worker, [ts.key for ts in batch], total, sid))

    # --- invariants -----------------------------------------------------------------------

    def validate_state(self) -> None:
        try:
            self._validate()
        except AssertionError as e:
            if isinstance(e, InvalidState):
                raise
            raise InvalidState(str(e)) from None

    def _validate(self) -> None:
        tasks = self.tasks
        n_ready = n_memory = 0
        assert not self._pending_release, "pending releases left over"
        heap_live = {seq for _, seq, ts in self._ready if ts.state == "ready"}
        for key, ts in tasks.items():
            st = ts.state
            where = f"{ts!r}"
            assert ts.key == key, where
            assert st in STATES, f"{where}: unknown state"
            for dep in ts.dependencies:
                assert tasks.get(dep.key) is dep, f"{where}: dependency {dep!r} not in tasks"
                assert ts in dep.dependents, f"{where}: not a dependent of {dep!r}"
            for dep in ts.dependents:
                assert tasks.get(dep.key) is dep, f"{where}: dependent {dep!r} not in tasks"
                assert ts in dep.dependencies, f"{where}: not a dependency of {dep!r}"
            expect_waiting = {d for d in ts.dependencies if d.state != "memory"}
            assert ts.waiting_for_data == expect_waiting, f"{where}: waiting_for_data wrong"
            if ts.dependencies:
                assert st in ("waiting", "ready", "executing", "cancelled"), where
                assert st != "cancelled" or ts.previous == "executing", where
            for w in ts.who_has:
                assert w != self.address, f"{where}: lists our own address"
                assert ts in self._has_what.get(w, ()), f"{where}: {w} not indexed"
            assert (key in self.data) == (st == "memory"), f"{where}: data disagrees"
            assert (ts in self._executing) == (
                st == "executing" or (st == "cancelled" and ts.previous == "executing")
            ) or st == "memory", f"{where}: thread accounting"
            if st != "cancelled":
                assert ts.wanted or ts.dependents, f"{where}: neither wanted nor needed"
                assert ts.previous is None, f"{where}: previous set"
            if st not in ("flight", "cancelled"):
                assert ts.coming_from is None, f"{where}: coming_from set"
            if st != "flight":
                assert ts.resume is None, f"{where}: resume set"
            if st in ("waiting", "ready", "executing"):
                assert ts.run_spec is not None or st == "executing", f"{where}: no run_spec"
            if st == "waiting":
                assert ts.waiting_for_data, f"{where}: waiting for nothing"
            elif st == "ready":
                n_ready += 1
                assert ts.ready_seq in heap_live, f"{where}: not in the ready heap"
            elif st == "fetch":
                assert ts.who_has, f"{where}: nobody to fetch from"
                assert ts.dependents, f"{where}: fetched for nobody"
                for w in ts.who_has:
                    assert ts in self._data_needed.get(w, ()), f"{where}: not in data_needed"
            elif st == "flight" or (st == "cancelled" and ts.previous == "flight"):
                src = ts.coming_from
                assert src and any(t is ts for t in self._in_flight.get(src, ())), where
                assert st == "cancelled" or ts.dependents or ts.resume is not None, where
                assert ts.resume is None or ts.wanted, f"{where}: resume but not wanted"
            elif st == "memory":
                n_memory += 1
                assert not ts.who_has, f"{where}: who_has in memory"
            elif st == "released":
                assert ts.dependents and not ts.wanted, f"{where}: released and kept"
            elif st == "cancelled":
                assert ts.previous in ("executing", "flight"), f"{where}: previous"
                assert not ts.dependents and not ts.wanted, f"{where}: cancelled but needed"
        assert n_memory == len(self.data), "data holds keys not in memory"
        assert n_ready == self._n_ready, f"ready count {self._n_ready} != {n_ready}"
        for ts in self._executing:
            assert tasks.get(ts.key) is ts, f"executing {ts!r} not in tasks"
        for w, holders in self._has_what.items():
            assert holders, f"empty has_what entry for {w}"
            for ts in holders:
                assert tasks.get(ts.key) is ts and w in ts.who_has, f"has_what[{w}]: {ts!r}"
        for w, needed in self._data_needed.items():
            assert needed, f"empty data_needed entry for {w}"
            for ts in needed:
                assert ts.state == "fetch" and w in ts.who_has, f"data_needed[{w}]: {ts!r}"
        assert len(self._in_flight) <= self.transfer_limit, "too many transfers"
        assert len(self._executing) <= self.nthreads, "too many executions"
        if len(self._executing) < self.nthreads:
            assert not self._n_ready, "idle thread while tasks are ready"
        if len(self._in_flight) < self.transfer_limit:
            idle = [w for w in self._data_needed if w not in self._in_flight]
            assert not idle, f"idle transfer slot while {idle} hold wanted data"


WorkerState._TRANSITIONS = {
    ("released", "waiting"): WorkerState._transition_released_waiting,
    ("released", "ready"): WorkerState._transition_released_ready,
    ("released", "fetch"): WorkerState._transition_released_fetch,
    ("released", "memory"): WorkerState._transition_released_memory,
    ("released", "forgotten"): WorkerState._transition_released_forgotten,
    ("waiting", "ready"): WorkerState._transition_waiting_ready,
    ("waiting", "released"): WorkerState._transition_waiting_released,
    ("waiting", "memory"): WorkerState._transition_waiting_memory,
    ("ready", "executing"): WorkerState._transition_ready_executing,
    ("ready", "released"): WorkerState._transition_ready_released,
    ("ready", "memory"): WorkerState._transition_ready_memory,
    ("executing", "memory"): WorkerState._transition_executing_memory,
    ("executing", "error"): WorkerState._transition_executing_error,
    ("executing", "cancelled"): WorkerState._transition_executing_cancelled,
    ("fetch", "flight"): WorkerState._transition_fetch_flight,
    ("fetch", "released"): WorkerState._transition_fetch_released,
    ("fetch", "memory"): WorkerState._transition_fetch_memory,
    ("flight", "memory"): WorkerState._transition_flight_memory,
    ("flight", "fetch"): WorkerState._transition_flight_fetch,
    ("flight", "released"): WorkerState._transition_flight_released,
    ("flight", "cancelled"): WorkerState._transition_flight_cancelled,
    ("cancelled", "executing"): WorkerState._transition_cancelled_executing,
    ("cancelled", "flight"): WorkerState._transition_cancelled_flight,
    ("cancelled", "released"): WorkerState._transition_cancelled_released,
    ("cancelled", "memory"): WorkerState._transition_cancelled_memory,
    ("memory", "released"): WorkerState._transition_memory_released,
    ("memory", "cancelled"): WorkerState._transition_memory_cancelled,
    ("error", "released"): WorkerState._transition_error_released,
    ("error", "memory"): WorkerState._transition_error_memory,
}
WorkerState._HANDLERS = {
    ComputeTask: WorkerState._handle_compute,
    FreeKeys: WorkerState._handle_free_keys,
    ExecuteSuccess: WorkerState._handle_execute_success,
    ExecuteFailure: WorkerState._handle_execute_failure,
    GatherSuccess: WorkerState._handle_gather_success,
    GatherFailure: WorkerState._handle_gather_failure,
    UpdateDataEvent: WorkerState._handle_update_data,
}
