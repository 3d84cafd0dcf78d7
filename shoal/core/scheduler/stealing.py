"""Work stealing: queued tasks move from busy workers to idle ones (a mixin of
:class:`~shoal.core.scheduler.SchedulerState`, as placement).

A task placed by data locality (or on a loosely restricted worker) may wait behind
others on its worker while another worker has idle threads. :meth:`balance`, called
periodically by the server (never per task: it costs nothing while every worker is
busy), asks the busy worker (the *victim*) to give such a task back
(:class:`~shoal.protocol.messages.StealRequest`), if it would start sooner on the idle
worker (the *thief*): moving it costs the bytes of its dependencies the thief lacks, at
the assumed bandwidth (plus :data:`STEAL_LATENCY`), which must be less than the time it
would wait on the victim (the tasks ahead of it there, at its prefix's measured mean
duration, per thread) and at most :data:`STEAL_COST_RATIO` times that duration (no large
transfer for little work); tasks measured under :data:`MIN_STEAL_DURATION` stay.

The victim answers (:class:`~shoal.protocol.messages.StealReply`): ``ok`` if the task had
not started (it dropped it and will never run it), else "too late" (it runs, or ran,
there, and its result is reported as usual). Only on ``ok`` does the task move; so it is
never lost and never runs twice. Each request names the assignment (``run_id``): an
answer about an assignment that ended meanwhile (the task finished, was released or
reassigned, the victim left) is ignored; the worker dropped a task that the scheduler
no longer had there, which is what the scheduler asked of it already.

Like Dask's ``distributed/stealing.py``, much simplified: no cost levels, no per-task
bookkeeping on the hot path; a steal is decided only when a balance finds idle threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.model import TaskState, WorkerRecord
from shoal.core.scheduler.placement import BANDWIDTH
from shoal.core.story import StoryLog
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.core.comm import Comm

STEAL_COST_RATIO = 10.0  # a move may cost at most this many times the task's duration
MIN_STEAL_DURATION = 0.005  # seconds: shorter tasks are not worth a round trip (as Dask)
STEAL_LATENCY = 0.002  # seconds a steal costs besides the transfer (two messages)
STEAL_INTERVAL = 0.1  # seconds between the server's balance calls


class Stealing:
    """Work stealing methods of :class:`SchedulerState`."""

    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]
    nlimited: int
    comm: Comm
    log: StoryLog
    transition_counter: int

    if TYPE_CHECKING:

        def _remove_processing(self, ts: TaskState) -> WorkerRecord | None: ...
        def _add_processing(self, ts: TaskState, ws: WorkerRecord) -> None: ...
        def _send_compute(self, ts: TaskState, ws: WorkerRecord, stimulus_id: str) -> None: ...
        def _decide_worker(self, ts: TaskState) -> WorkerRecord | None: ...
        def _fitting(self, ts: TaskState, workers: Any) -> list[WorkerRecord]: ...
        def _shuffle_run_of(self, ts: TaskState) -> Any: ...
        def _transitions(self, recs: dict[TaskState, str], stimulus_id: str) -> None: ...
        def _done(self, stimulus_id: str) -> None: ...
        def _waited_on_ahead(self, ts: TaskState) -> list[TaskState]: ...

        shuffle_tasks: Any

    def _init_stealing(self, enabled: bool = True) -> None:
        self.stealing_enabled = enabled
        # Requests sent and not yet answered: task -> (victim, thief, run_id asked about).
        self.steals: dict[TaskState, tuple[WorkerRecord, WorkerRecord, int]] = {}
        self.steals_done = 0  # tasks moved
        self.steals_refused = 0  # answered "too late"

    # ------------------------------------------------------------------ deciding

    def balance(self, stimulus_id: str = "balance") -> int:
        """Ask busy workers to give queued tasks to idle ones; how many requests were
        sent. Cheap when nothing is idle: one pass over the workers."""
        if not self.stealing_enabled or len(self.runnable) < 2:
            return 0
        self._prune_steals()
        idle: list[tuple[WorkerRecord, int]] = []
        victims: list[tuple[float, str, WorkerRecord]] = []
        incoming: dict[WorkerRecord, int] = {}
        for _, thief, _ in self.steals.values():
            incoming[thief] = incoming.get(thief, 0) + 1
        for ws in self.runnable.values():
            running = (
                len(ws.processing) - len(ws.long_running) - len(ws.ahead) + incoming.get(ws, 0)
            )
            free = ws.slot_threads - running
            if free > 0:
                idle.append((ws, free))
            elif running - incoming.get(ws, 0) > ws.slot_threads:
                victims.append((-ws.occupancy / max(ws.nthreads, 1), ws.address, ws))
        if not idle or not victims:
            return 0
        victims.sort()
        sent = 0
        for _, _, victim in victims:
            if not idle:
                break
            sent += self._steal_from(victim, idle, stimulus_id)
        return sent

    def _steal_from(
        self, victim: WorkerRecord, idle: list[tuple[WorkerRecord, int]], stimulus_id: str
    ) -> int:
        """Offer ``victim``'s waiting tasks, last to run first, to the idle workers."""
        active = len(victim.processing) - len(victim.long_running) - len(victim.ahead)
        queued = active - victim.slot_threads
        threads = max(victim.slot_threads, 1)
        # (not a task waiting ahead, nor one something waits on ahead: ahead.py)
        candidates = sorted(
            (
                ts
                for ts in victim.processing
                if ts not in victim.long_running
                and not ts.waiting_on
                and not self._waited_on_ahead(ts)
            ),
            key=lambda ts: ts.rank,
            reverse=True,  # the worker runs the smallest priority first
        )[:queued]
        sent = 0
        for behind, ts in enumerate(candidates):
            if not idle:
                break
            if ts in self.steals or not self._movable(ts):
                continue
            duration = ts.prefix.mean_duration
            if duration < MIN_STEAL_DURATION:
                continue
            wait = (active - 1 - behind) * duration / threads  # the tasks ahead of it
            best = self._best_thief(ts, idle, min(wait, duration * STEAL_COST_RATIO))
            if best is None:
                continue
            thief = idle[best][0]
            free = idle[best][1] - 1
            if free:
                idle[best] = (thief, free)
            else:
                del idle[best]
            self.steals[ts] = (victim, thief, ts.run_id)
            self.log.append((ts.key, "steal-request", victim.address, thief.address, stimulus_id))
            self.comm.send_worker(victim.address, m.StealRequest(ts.key, ts.run_id, stimulus_id))
            sent += 1
        return sent

    def _movable(self, ts: TaskState) -> bool:
        if self.shuffle_tasks and self._shuffle_run_of(ts) is not None:
            return False  # a shuffle's tasks run where its data is
        r = ts.restrictions
        return r is None or not r.workers or r.loose

    def _best_thief(
        self, ts: TaskState, idle: list[tuple[WorkerRecord, int]], limit: float
    ) -> int | None:
        """Index into ``idle`` of the cheapest worker to move ``ts`` to, if one costs
        less than ``limit`` seconds."""
        r = ts.restrictions
        best = None
        best_cost = 0.0
        for i, (thief, _) in enumerate(idle):
            if r is not None and not (r.capable(thief) and r.has_room(thief)):
                continue
            if self.nlimited and not self._fitting(ts, [thief]):
                continue  # it would outlive the thief's lifetime, or budget
            missing = 0
            for dts in ts.dependencies:
                if thief not in dts.who_has:
                    missing += dts.nbytes
            cost = missing / BANDWIDTH + STEAL_LATENCY
            if cost < limit and (best is None or cost < best_cost):
                best, best_cost = i, cost
        return best

    def _prune_steals(self) -> None:
        """Forget requests whose assignment ended (its answer will be ignored)."""
        stale = [
            ts
            for ts, (victim, _, run_id) in self.steals.items()
            if ts.processing_on is not victim or ts.run_id != run_id
        ]
        for ts in stale:
            del self.steals[ts]

    # ------------------------------------------------------------------ answers

    def _steal_reply(self, victim: WorkerRecord, msg: m.StealReply) -> None:
        ts = self.tasks.get(msg.key)  # type: ignore[attr-defined]
        if ts is None:
            return
        entry = self.steals.get(ts)
        if entry is None or entry[0] is not victim or entry[2] != msg.run_id:
            return  # not asked, or asked about another assignment
        del self.steals[ts]
        if ts.processing_on is not victim or ts.run_id != msg.run_id:
            return  # that assignment ended meanwhile
        sid = msg.stimulus_id
        self.log.append((ts.key, "steal-reply", victim.address, msg.ok, sid))
        if not msg.ok:
            self.steals_refused += 1
            return
        # The victim dropped the task, which never started: its thread was never taken.
        self._remove_processing(ts)
        thief = entry[1]
        ws = thief if self._may_take(ts, thief) else self._decide_worker(ts)
        if ws is None:  # nowhere to run it now: it waits as a task whose worker left
            ts.state = "waiting"
            self._transitions({ts: "queued"}, sid)
            return
        self.steals_done += 1
        self.log.append((ts.key, "stolen", victim.address, ws.address, sid))
        self.transition_counter += 1  # the summary's per-worker counts changed
        self._add_processing(ts, ws)
        self._send_compute(ts, ws, sid)

    def _may_take(self, ts: TaskState, ws: WorkerRecord) -> bool:
        if ws.address not in self.runnable or not ws.min_slots:
            return False
        r = ts.restrictions
        if r is not None and not (r.capable(ws) and r.has_room(ws)):
            return False
        return not self.nlimited or bool(self._fitting(ts, [ws]))
