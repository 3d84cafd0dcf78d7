"""The scheduler state machine: pure, synchronous, deterministic.

The server feeds it events (decoded messages, connections coming and going); it
updates task, worker and client records through a table of transitions and writes
the resulting messages to a :class:`~shoal.core.comm.Comm`.

Transitions follow Dask's pattern: a transition function changes one task and
returns *recommendations* (other tasks' next states), processed until none remain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from shoal.core.comm import Comm
from shoal.core.errors import error_payload
from shoal.core.scheduler.actors import Actors
from shoal.core.scheduler.ahead import PlaceAhead
from shoal.core.scheduler.coordination import Coordination
from shoal.core.scheduler.datasets import Datasets
from shoal.core.scheduler.events import Events
from shoal.core.scheduler.introspection import Introspection
from shoal.core.scheduler.lanes import Lanes
from shoal.core.scheduler.membership import (
    DEFAULT_ALLOWED_FAILURES,
    DEFAULT_WORKER_TTL,
    Membership,
)
from shoal.core.scheduler.model import (
    SMALL,
    TASK_STATES,
    ClientRecord,
    TaskGroup,
    TaskPrefix,
    TaskState,
    WorkerRecord,
    added,
    discarded,
    group_name,
    key_split,
    rank_priority,
)
from shoal.core.scheduler.output import OutputRouting
from shoal.core.scheduler.packing import Packing
from shoal.core.scheduler.pins import Pins
from shoal.core.scheduler.placement import Placement
from shoal.core.scheduler.progress import Progress
from shoal.core.scheduler.rebalance import Rebalance
from shoal.core.scheduler.replication import Replication
from shoal.core.scheduler.reports import WorkerReports
from shoal.core.scheduler.restart import Restart
from shoal.core.scheduler.scaling import Scaling
from shoal.core.scheduler.stealing import Stealing
from shoal.core.scheduler.submission import Submission
from shoal.core.scheduler.task_stream import TaskStream
from shoal.core.scheduler.validation import validate_scheduler_state
from shoal.core.scheduler.walltime import Walltime
from shoal.core.story import InvalidTransition, StoryLog
from shoal.protocol import messages as m
from shoal.protocol.messages import Key
from shoal.shuffle._scheduler import ShuffleCoordinator

Recs = dict[TaskState, str]
VALIDATION_SHARE = 8  # validate=True: a full check per this many tasks' worth of transitions
NO_RESOURCES: dict[str, float] = {}  # what an unrestricted ComputeTask carries (never mutated)


class SchedulerState(
    Submission,
    Placement,
    PlaceAhead,
    Packing,
    Membership,
    WorkerReports,
    Introspection,
    Progress,
    Pins,
    Events,
    Scaling,
    ShuffleCoordinator,
    Walltime,
    Datasets,
    Restart,
    Replication,
    Rebalance,
    Stealing,
    OutputRouting,
    Coordination,
    Actors,
    Lanes,
):
    def __init__(
        self,
        comm: Comm,
        validate: bool = False,
        allowed_failures: int = DEFAULT_ALLOWED_FAILURES,
        worker_ttl: float = DEFAULT_WORKER_TTL,
        stealing: bool = True,
    ):
        self.comm = comm
        self.validate = validate
        self.tasks: dict[Key, TaskState] = {}
        self.groups: dict[str, TaskGroup] = {}
        self.prefixes: dict[str, TaskPrefix] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.clients: dict[str, ClientRecord] = {}
        self.functions: dict[str, bytes] = {}
        # One str object per function id, which every task naming it shares: a task's
        # decoded copy would cost ~73 bytes per task.
        self._function_ids: dict[Any, Any] = {}  # shared copies of ids and id tuples
        self.log = StoryLog()
        self.task_stream = TaskStream()
        self._init_placement()
        self._init_ahead()
        self._init_packing()
        self._init_walltime()
        self._init_membership(allowed_failures, worker_ttl)
        self._init_progress()
        self._init_events()
        self._init_pins()
        self._init_datasets()
        self._init_scaling()
        self._init_shuffles()  # after pins: it registers its pin owners
        self._init_stealing(stealing)
        self._init_coordination()
        self._init_rebalance()
        self._init_actors()  # after pins: it registers its pin owners
        self._init_lanes()
        self._generation = itertools.count()
        # True while a CancelKeys(force=True) is applied: the processing tasks it
        # releases are interrupted on their workers.
        self._interrupting = False
        self.transition_counter = 0
        self.task_counts = dict.fromkeys(TASK_STATES, 0)  # per state, kept by the tasks
        # The summary's version: a change of workers or a batch with transitions bumps it.
        self.version = 0
        self._version_at = 0  # transition_counter when the version last changed
        self._validated_at = 0  # transition_counter at the last full check
        self._table: dict[tuple[str, str], Callable[..., Recs]] = {
            ("released", "waiting"): self._transition_released_waiting,
            ("released", "forgotten"): self._transition_released_forgotten,
            ("released", "erred"): self._transition_released_erred,
            ("waiting", "queued"): self._transition_waiting_queued,
            ("waiting", "processing"): self._transition_waiting_processing,
            ("waiting", "released"): self._transition_waiting_released,
            ("waiting", "erred"): self._transition_waiting_erred,
            ("queued", "processing"): self._transition_queued_processing,
            ("queued", "released"): self._transition_queued_released,
            ("processing", "memory"): self._transition_processing_memory,
            ("processing", "erred"): self._transition_processing_erred,
            ("processing", "released"): self._transition_processing_released,
            ("memory", "released"): self._transition_memory_released,
            ("erred", "released"): self._transition_erred_released,
        }

    # ------------------------------------------------------------------ plumbing

    def _transition(self, ts: TaskState, finish: str, stimulus_id: str, **kwargs: Any) -> Recs:
        start = ts._state
        if start == finish:
            return {}
        func = self._table.get((start, finish))
        if func is not None:
            self._record_transition((ts.key, start, finish, stimulus_id))
            self.transition_counter += 1
            recs = func(ts, stimulus_id, **kwargs) if kwargs else func(ts, stimulus_id)
            if self._actor_ids and ts.key in self._actor_ids:  # its worker's pin follows it
                self._actor_transition(ts, start, stimulus_id)
            return recs
        # Two-step paths through "released" (e.g. memory -> forgotten).
        if (start, "released") in self._table and ("released", finish) in self._table:
            recs = self._transition(ts, "released", stimulus_id)
            own = recs.pop(ts, None)
            if ts.state == "released":
                recs.update(self._transition(ts, finish, stimulus_id))
                if ts.state == "released" and own is not None:
                    recs[ts] = own  # e.g. still needed: not forgotten after all
            return recs
        raise InvalidTransition(ts.key, start, finish, self.log.story(ts.key))

    def _transitions(self, recs: Recs, stimulus_id: str) -> None:
        # _transition's one-step case inlined: a graph's tasks take ~5 transitions
        # each through this loop, and a Python call per transition showed in profiles.
        table, record, transition = self._table, self._record_transition, self._transition
        while recs:
            ts, finish = recs.popitem()
            start = ts._state
            if start == finish or start == "forgotten":
                continue
            func = table.get((start, finish))
            if func is None or self._actor_ids:  # two steps, or an actor's pin to move
                recs.update(transition(ts, finish, stimulus_id))
                continue
            record((ts.key, start, finish, stimulus_id))
            self.transition_counter += 1
            recs.update(func(ts, stimulus_id))

    def _done(self, stimulus_id: str) -> None:
        """End of one event: hand queued tasks to free threads, then check."""
        if self.shuffles:  # a shuffle whose tasks are ready starts before they are placed
            self._shuffles_check(stimulus_id)
        if self.parked and (self._recheck_parked or self.wall_time >= self._parked_recheck_at):
            self._recheck(stimulus_id)  # a worker came, or measured durations changed
        if self._retry_restricted or (self.nslotted and self.free_workers):
            self._schedule_restricted(stimulus_id)
        if self.retiring:
            self._advance_retirements(stimulus_id)
        if self.moves:  # rebalance moves that can no longer finish are given up
            self._advance_moves(stimulus_id)
        if self.nqueued and self.free_workers:
            self._schedule_queued(stimulus_id)
            if self.nslotted and self.free_workers:  # those that gave way to root tasks
                self._schedule_restricted(stimulus_id)
        if self.fired_done:  # fire-and-forget keys now done: nobody holds them any more
            self.release_fired(stimulus_id)
        if self._ahead_from:  # last: after everything placed in this event
            self._place_ahead(stimulus_id)
        if self.transition_counter != self._version_at:
            self._version_at = self.transition_counter
            self.version += 1
        if self.validate:
            self._maybe_validate()

    def _maybe_validate(self) -> None:
        """Check every invariant after this batch, or, once there are many tasks, after
        enough transitions to pay for it (about one check per len(tasks) / 8 of them)
        and whenever nothing is running: a full O(tasks) check after every batch made
        a validated 5,000-task run take minutes."""
        done = self.transition_counter - self._validated_at + 1
        idle = not self.nqueued and not any(ws.processing for ws in self.workers.values())
        if idle or done * VALIDATION_SHARE >= len(self.tasks):
            self._validated_at = self.transition_counter
            self.validate_state()

    # ------------------------------------------------------------------ events: membership

    def add_client(self, client_id: str) -> None:
        if client_id not in self.clients:
            self.clients[client_id] = ClientRecord(client_id)

    def remove_client(self, client_id: str, stimulus_id: str) -> None:
        cs = self.clients.pop(client_id, None)
        if cs is None:
            return
        if cs.partial is not None:  # a graph it never finished submitting
            recs, errs = cs.partial
            cs.partial = None
            self._transitions(dict.fromkeys([*recs, *errs], "forgotten"), stimulus_id)
        self._close_watches(cs)
        self.release_pins_of(f"client:{client_id}", stimulus_id, "its client left")
        self._coordination_client_left(client_id, stimulus_id)  # its leases go with it
        self._close_client_lane(client_id)
        self._release_wants(cs, list(cs.wants), stimulus_id)
        self._done(stimulus_id)

    # ------------------------------------------------------------------ events: clients

    def handle_client(self, client_id: str, *msgs: m.Message) -> None:
        """Apply a batch of messages from one client."""
        self._apply(self.clients[client_id], self._client_handlers, msgs, "client")

    def _apply(
        self,
        sender: ClientRecord | WorkerRecord,
        handlers: dict[type, Callable[..., None]],
        msgs: tuple[m.Message, ...],
        role: str,
    ) -> None:
        for msg in msgs:
            handler = handlers.get(type(msg))
            if handler is None:
                raise TypeError(f"a {role} may not send {type(msg).__name__}")
            handler(self, sender, msg)
        self._done(getattr(msgs[-1], "stimulus_id", "") if msgs else "")

    _client_handlers: dict[type, Callable[..., None]] = {
        m.SubmitTasks: Submission._submit_tasks,
        m.ReleaseKeys: Submission._release_keys,
        m.CancelKeys: Submission._cancel_keys,
        m.WantKeys: Submission._want_keys,
        m.ScatterDone: Submission._scatter_done,
        m.FireAndForget: Datasets._fire_and_forget,
        m.PublishDataset: Datasets._publish_dataset,
        m.DatasetRequest: Datasets._dataset_request,
        m.RestartRequest: Restart._restart,
        m.RetryKeys: Restart._retry_keys,
        m.ReplicateKeys: Replication._replicate_keys,
        m.RebalanceRequest: Rebalance._rebalance,
        m.RetireWorkers: Membership._retire_workers,
        m.WatchProgress: Progress._watch_progress,
        m.StopProgress: Progress._stop_progress,
        m.PinWorkers: Pins._pin_workers,
        m.ReleasePin: Pins._pin_change,
        m.RenewPin: Pins._pin_change,
        m.ScaleRequest: Scaling._scale_request,
        m.ForwardOutput: OutputRouting._forward_output,
        m.Coordinate: Coordination._coordinate,
        m.RegisterActor: Actors._register_actor,
        m.LaneRequest: Lanes._lane_request,
    }

    # ------------------------------------------------------------------ events: workers

    _worker_handlers: dict[type, Callable[..., None]] = {
        **WorkerReports._worker_handlers,
        m.ShuffleStats: ShuffleCoordinator._shuffle_stats,
        m.LogEvent: Events._worker_log_event,
        m.StealReply: Stealing._steal_reply,
        m.TaskOutput: OutputRouting._task_output,
        m.LaneRan: Lanes._lane_ran,
        m.LaneBusy: Lanes._lane_busy,
    }

    def handle_worker(self, address: str, *msgs: m.Message) -> None:
        """Apply a batch of messages from one worker (none, if it was removed: a
        retired or silent worker's last messages may still arrive)."""
        ws = self.workers.get(address)
        if ws is not None:
            self._apply(ws, self._worker_handlers, msgs, "worker")  # see reports.py

    # ------------------------------------------------------------------ helpers

    def _group(self, name: Any) -> TaskGroup:
        name = group_name(name)
        tg = self.groups.get(name)
        if tg is None:
            pname = key_split(name)
            tp = self.prefixes.get(pname)
            if tp is None:
                tp = self.prefixes[pname] = TaskPrefix(pname, self.task_counts)
            tg = self.groups[name] = tp.groups[name] = TaskGroup(name, tp)
        return tg

    def _needed(self, ts: TaskState) -> bool:
        return bool(ts.who_wants or ts.waiters)

    def _add_replica(self, ts: TaskState, ws: WorkerRecord, nbytes: int) -> None:
        # The first copy sets the size; replicas count at that size (a worker may report
        # another), so every holder's nbytes and the group's stay sums of ts.nbytes.
        if not ts.who_has:
            ts.nbytes = nbytes
        if ws not in ts.who_has:
            ts.who_has = added(ts.who_has, ws)
            ws.has_what.add(ts)
            ws.nbytes += ts.nbytes
            self.total_nbytes += ts.nbytes

    def _remove_replica(self, ts: TaskState, ws: WorkerRecord) -> None:
        if ws in ts.who_has:
            ts.who_has = discarded(ts.who_has, ws)
            ws.has_what.discard(ts)
            ws.nbytes -= ts.nbytes
            self.total_nbytes -= ts.nbytes

    def _set_memory(self, ts: TaskState, stimulus_id: str) -> None:
        """A released task whose data arrived without being computed (scatter)."""
        self._record_transition((ts.key, ts.state, "memory", stimulus_id))
        ts.state = "memory"
        ts.group.nbytes += ts.nbytes
        ts.prefix.nbytes += ts.nbytes

    def _send_compute(self, ts: TaskState, ws: WorkerRecord, stimulus_id: str) -> None:
        func = ts.func
        if type(func) is str:
            if func and func not in ws.known_functions:
                ws.known_functions.add(func)
                self.comm.send_worker(ws.address, m.FunctionDefs({func: self.functions[func]}))
        else:
            known = ws.known_functions
            if not known.issuperset(func):  # (usually: checked without building a dict)
                new = {fid: self.functions[fid] for fid in func if fid not in known}
                known.update(new)
                self.comm.send_worker(ws.address, m.FunctionDefs(new))
            func = func[0]
        deps = [
            m.DepInfo(dts.key, dts.nbytes, [w.address for w in dts.who_has])
            for dts in ts.dependencies
        ]
        assert ts.payload is not None
        r = ts.restrictions
        resources = r.resources if r is not None else NO_RESOURCES
        ts.run_id = run_id = ts.run_id + 1
        shuffle = self._shuffle_run_of(ts) if self.shuffle_tasks else None
        self.comm.send_worker(
            ws.address,
            m.ComputeTask(
                ts.key,
                func,
                ts.payload,
                rank_priority(ts.rank),  # ts.priority, without the property's call
                deps,
                stimulus_id,
                resources,
                run_id,
                shuffle,
                client_wants=bool(ts.who_wants),  # a small result comes back inline
            ),
        )

    def _report_erred(
        self, ts: TaskState, clients: Iterable[ClientRecord], stimulus_id: str
    ) -> None:
        # Each erred task holds a copy of the error: the task to blame may have been
        # released (and its error cleared) since, when nobody wanted it.
        blame = ts.exception_blame
        assert ts.exception is not None
        for cs in clients:
            self.comm.send_client(
                cs.id,
                m.KeyErred(
                    ts.key,
                    ts.exception,
                    ts.traceback,
                    blame.key if blame is not None else None,
                    stimulus_id,
                ),
            )

    def _set_lost_data_exception(self, ts: TaskState) -> None:
        exc = RuntimeError(
            f"the data of {ts.key!r} was lost with the worker that held it and cannot be recomputed"
        )
        ts.exception = error_payload(exc)
        ts.traceback = ""

    def _lost_data_error(self, ts: TaskState, stimulus_id: str) -> None:
        self._set_lost_data_exception(ts)
        self._transitions({ts: "erred"}, stimulus_id)

    # ------------------------------------------------------------------ transitions

    def _transition_released_waiting(self, ts: TaskState, stimulus_id: str) -> Recs:
        ts.state = "waiting"
        # Errors are recommendations (not nested transitions), so they replace this
        # event's other recommendations for the same tasks instead of racing them; and
        # they come before any dependency is asked for, so none is computed for nothing.
        if ts.payload is None:  # scattered data that is gone
            self._set_lost_data_exception(ts)
            return {ts: "erred"}
        if ts._failure is not None and ts.refused is not None:  # it can never run
            ts.exception, ts.traceback, ts.exception_blame = ts.refused, "", None
            return {ts: "erred"}
        for dts in ts.dependencies:
            if dts.state == "erred":
                ts.exception_blame = dts.exception_blame or dts
                ts.exception, ts.traceback = dts.exception, dts.traceback
                return {ts: "erred"}
        recs: Recs = {}
        waiting_on = []
        computing = True  # every dependency it waits on is processing already
        for dts in ts.dependencies:
            waiters = added(dts.waiters, ts)
            if type(waiters) is tuple and waiters == dts.dependents:
                waiters = dts.dependents  # one tuple for both (tuples never change)
            dts.waiters = waiters
            state = dts.state
            if state == "memory":
                continue
            waiting_on.append(dts)
            if state == "released":
                recs[dts] = "waiting"
            if state != "processing":
                computing = False
        if waiting_on:  # distinct, as dependencies are
            if len(waiting_on) > SMALL:
                ts.waiting_on = set(waiting_on)
            elif len(waiting_on) == len(ts.dependencies):
                ts.waiting_on = ts.dependencies  # one tuple for both (tuples never change)
            else:
                ts.waiting_on = tuple(waiting_on)
            if computing and self.ahead_per_thread:
                # Submitted while what it needs computes (``y = submit(g, x)`` right
                # after ``x = submit(f)``): it may go ahead now, as a dependent submitted
                # with them would have, not a round trip after they finish.
                self._ahead_from.append(ts)
        else:
            recs[ts] = self._ready_state(ts)
        return recs

    def _ready_state(self, ts: TaskState) -> str:
        if ts.restrictions is not None:
            return "queued"  # placed at the end of the event, in priority order
        return "queued" if not ts.dependencies or not self.runnable else "processing"

    def _transition_waiting_queued(self, ts: TaskState, stimulus_id: str) -> Recs:
        ts.state = "queued"
        self._enqueue(ts)
        if self.nlimited and ts.restrictions is None:
            self._park_if_unfit(ts, stimulus_id)  # no worker has the time left for it
        return {}

    def _transition_waiting_processing(self, ts: TaskState, stimulus_id: str) -> Recs:
        ws = self._decide_worker(ts)
        if ws is None:
            return self._transition_waiting_queued(ts, stimulus_id)
        ts.state = "processing"
        self._add_processing(ts, ws)
        self._send_compute(ts, ws, stimulus_id)
        return {}

    def _transition_queued_processing(
        self, ts: TaskState, stimulus_id: str, ws: WorkerRecord | None = None
    ) -> Recs:
        if ws is None:
            ws = self._decide_worker(ts)
            if ws is None:
                return {}
        self._dequeue(ts)
        ts.state = "processing"
        self._add_processing(ts, ws)
        self._send_compute(ts, ws, stimulus_id)
        return {}

    def _forget_or_keep(self, ts: TaskState) -> Recs:
        """After a task reaches released: run it again if needed, forget it if nothing
        refers to it any more."""
        if self._needed(ts):
            return {ts: "waiting"}
        if not ts.dependents:
            return {ts: "forgotten"}
        return {}

    def _leave_dependencies(self, ts: TaskState) -> Recs:
        """``ts`` no longer needs its dependencies' data."""
        recs: Recs = {}
        for dts in ts.dependencies:
            dts.waiters = discarded(dts.waiters, ts)
            if not dts.waiters and not dts.who_wants and dts.state != "released":
                recs[dts] = "released"
        ts.waiting_on = ()
        return recs

    def _transition_waiting_released(self, ts: TaskState, stimulus_id: str) -> Recs:
        ts.state = "released"
        recs = self._leave_dependencies(ts)
        recs.update(self._forget_or_keep(ts))
        return recs

    def _transition_queued_released(self, ts: TaskState, stimulus_id: str) -> Recs:
        self._dequeue(ts)
        return self._transition_waiting_released(ts, stimulus_id)

    def _release_compute(self, ts: TaskState, stimulus_id: str, drain: bool = True) -> None:
        """``ts`` stops processing. If it was on a worker (not gone), that worker is
        told to drop it; unless the task had seceded (it holds no slot) or the worker
        said its thread is over (``drain=False``), the thread counts busy until the
        worker answers ComputeReleased."""
        ws = ts.processing_on
        if ws is None:
            return
        # (a task waiting ahead holds no thread: nothing to drain)
        drain = drain and ts not in ws.long_running and not ts.waiting_on
        self._remove_processing(ts)
        if drain:
            self._drain(ws, ts.key)
        if drain or self._interrupting:
            msg: m.Message = m.ReleaseCompute(ts.key, drain, self._interrupting, stimulus_id)
        else:  # no answer wanted, nothing to interrupt: as any key it should drop
            msg = m.FreeKeys([ts.key], stimulus_id)
        self.comm.send_worker(ws.address, msg)

    def _transition_processing_released(
        self, ts: TaskState, stimulus_id: str, drain: bool = True
    ) -> Recs:
        self._release_compute(ts, stimulus_id, drain)
        ts.state = "released"
        # what waits ahead on it waits in vain: taken back, to wait for it again
        recs: Recs = dict.fromkeys(self._waited_on_ahead(ts), "released")
        if not self._needed(ts):
            recs.update(self._leave_dependencies(ts))
        else:
            for dts in ts.dependencies:
                dts.waiters = discarded(dts.waiters, ts)  # re-added on the way back to waiting
        ts.waiting_on = ()
        recs.update(self._forget_or_keep(ts))
        return recs

    def _transition_processing_memory(
        self, ts: TaskState, stimulus_id: str, msg: m.TaskFinished
    ) -> Recs:
        ws = self._remove_processing(ts)
        assert ws is not None
        ws.tasks_run += 1
        group = ts.group
        prefix = group.prefix
        if msg.start or msg.stop:  # both 0.0: the worker fetched it, nothing was timed
            duration = msg.stop - msg.start
            group.duration_sum += duration  # Counters.add_duration, without a call per task
            group.duration_count += 1
            prefix.add_duration(duration)
            self.task_stream.add(
                m.TaskStreamRecord(
                    ts.key,
                    prefix.name,
                    group.name,
                    ws.address,
                    msg.start,
                    msg.stop,
                    "memory",
                    msg.nbytes,
                )
            )
        ts.type_name = msg.type_name
        self._add_replica(ts, ws, msg.nbytes)
        ts.state = "memory"
        group.nbytes += msg.nbytes
        prefix.nbytes += msg.nbytes
        recs: Recs = {}
        for dts in ts.dependents:
            state = dts._state
            if state == "waiting":
                dts.waiting_on = discarded(dts.waiting_on, ts)
                if not dts.waiting_on:
                    recs[dts] = self._ready_state(dts)
                elif self.ahead_per_thread:
                    self._ahead_from.append(dts)  # what it still waits on may take it ahead
            elif dts.waiting_on and state == "processing":
                self._dependency_done_ahead(ts, dts)  # on its way already
        for dts in ts.dependencies:
            dts.waiters = discarded(dts.waiters, ts)
            if not dts.waiters and not dts.who_wants:
                recs[dts] = "released"
        if self.shuffle_tasks:
            self._shuffle_task_done(ts, stimulus_id)
        if ts.who_wants:
            # The inline value is forwarded, never kept: a client asking later fetches.
            note = m.KeyInMemory(ts.key, msg.value, msg.type_name, stimulus_id, [ws.address])
            for cs in ts.who_wants:
                self.comm.send_client(cs.id, note)
            self.note_done(ts)
        elif not ts.waiters:
            recs[ts] = "released"
        return recs

    def _transition_memory_released(self, ts: TaskState, stimulus_id: str) -> Recs:
        for ws in ts.who_has:
            ws.has_what.discard(ts)
            ws.nbytes -= ts.nbytes
            self.total_nbytes -= ts.nbytes
            self.comm.send_worker(ws.address, m.FreeKeys([ts.key], stimulus_id))
        ts.who_has = ()
        ts.state = "released"
        group = ts.group
        group.nbytes -= ts.nbytes
        group.prefix.nbytes -= ts.nbytes
        dependents = ts.dependents
        recs: Recs = {}
        for dts in dependents:
            state = dts._state
            if state == "waiting":
                dts.waiting_on = added(dts.waiting_on, ts)
            elif state == "processing" or state == "queued":
                recs[dts] = "released"  # it will wait for this one again
        # _forget_or_keep, inlined (once per task); last, so that it is taken first
        if ts.who_wants or ts.waiters:
            recs[ts] = "waiting"
        elif not dependents:
            recs[ts] = "forgotten"
        return recs

    def _transition_released_erred(self, ts: TaskState, stimulus_id: str) -> Recs:
        return self._set_erred(ts, stimulus_id)

    def _transition_waiting_erred(self, ts: TaskState, stimulus_id: str) -> Recs:
        recs = self._leave_dependencies(ts)
        recs.update(self._set_erred(ts, stimulus_id))
        return recs

    def _transition_processing_erred(
        self, ts: TaskState, stimulus_id: str, msg: m.TaskErred | None = None
    ) -> Recs:
        worker = None
        if msg is None:  # a dependency failed while this ran: the blame is already set
            self._release_compute(ts, stimulus_id)
        else:
            worker = self._remove_processing(ts)
            ts.exception = msg.exception
            ts.traceback = msg.traceback
            # A dependency whose data could not be had is to blame, if still known.
            blamed = self.tasks.get(msg.blamed) if msg.blamed is not None else None
            ts.exception_blame = blamed if blamed is not None and blamed is not ts else None
        if msg is not None and msg.stop > msg.start:
            ts.group.add_duration(msg.stop - msg.start)
            ts.prefix.add_duration(msg.stop - msg.start)
            if worker is not None:
                self.task_stream.add(
                    m.TaskStreamRecord(
                        ts.key,
                        ts.prefix.name,
                        ts.group.name,
                        worker.address,
                        msg.start,
                        msg.stop,
                        "erred",
                    )
                )
        recs = self._leave_dependencies(ts)
        recs.update(self._set_erred(ts, stimulus_id))
        return recs

    def _set_erred(self, ts: TaskState, stimulus_id: str) -> Recs:
        """Mark ``ts`` erred, tell the clients that want it, and pass the error on to
        every dependent."""
        ts.state = "erred"
        if ts.exception is None and ts.exception_blame is None:
            ts.exception = error_payload(RuntimeError(f"task {ts.key!r} erred"))
        if self.shuffle_tasks:
            self._shuffle_task_erred(ts, stimulus_id)
        self._report_erred(ts, ts.who_wants, stimulus_id)
        self.note_done(ts)
        blame = ts.exception_blame or ts
        recs: Recs = {}
        for dts in ts.dependents:
            if dts.state in ("waiting", "queued", "processing", "released"):
                dts.exception_blame = blame
                dts.exception, dts.traceback = ts.exception, ts.traceback
                recs[dts] = "erred"
        ts.waiters = ()
        if not ts.who_wants:
            recs[ts] = "forgotten" if not ts.dependents else "released"
        return recs

    def _transition_erred_released(self, ts: TaskState, stimulus_id: str) -> Recs:
        ts.state = "released"
        ts.exception = None
        ts.traceback = ""
        ts.exception_blame = None
        recs = self._forget_or_keep(ts)
        if recs.get(ts) == "waiting":
            recs.pop(ts)  # an erred task is not retried by a mere release
        return recs

    def _transition_released_forgotten(self, ts: TaskState, stimulus_id: str) -> Recs:
        if ts.dependents or self._needed(ts):
            return {}
        ts.state = "forgotten"
        del self.tasks[ts.key]
        if self.hints:
            self.hints.pop(ts, None)
        if self.shuffle_tasks:
            self._shuffle_task_forgotten(ts, stimulus_id)
        if self.suspicious:
            self.suspicious.pop(ts, None)
        group = ts.group
        group.alive -= 1
        ts.prefix.alive -= 1
        if group.alive == 0:
            del self.groups[group.name]
            del group.prefix.groups[group.name]
        recs: Recs = {}
        for dts in ts.dependencies:
            dts.dependents = discarded(dts.dependents, ts)
            dts.waiters = discarded(dts.waiters, ts)
            if not dts.dependents and not self._needed(dts) and dts.state != "forgotten":
                recs[dts] = "forgotten"
        ts.dependencies = ()
        return recs

    # ------------------------------------------------------------------ invariants

    def validate_state(self) -> None:
        """Check every invariant; raise InvalidState naming the first one broken."""
        validate_scheduler_state(self)
