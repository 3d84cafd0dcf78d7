"""Walltime: workers that end (``--lifetime``) or run a bounded number of tasks
(``--max-tasks``), as batch jobs on HPC machines do. A mixin of
:class:`~shoal.core.scheduler.SchedulerState`, like placement.

- A worker says in its Hello how many seconds it has left and how many tasks it may
  run; at registration the scheduler turns the seconds into a *deadline* on its own
  wall clock (``wall_time``, from ``tick``: the core never reads a clock) and keeps
  the budget (``WorkerRecord.deadline``, ``.budget``, ``.assigned``).
- A worker fits a task only if ``now + the work already given to it (per thread) +
  expected duration <= deadline`` and it was given fewer tasks than its budget. The expected duration is the task's hint
  (``submit(duration=)``, ``dask.annotate(duration=)``), else the smaller of its
  prefix's measured mean and recent duration (``TaskPrefix.recent_duration``), else the unknown default (``UNKNOWN_DURATION``). Every path that puts a task on
  a worker goes through ``_decide_worker`` or ``_schedule_queued`` (placement.py),
  which only consider workers it fits; a worker whose budget is spent is not free, so
  it gets no queued task either.
- A task that fits no connected worker (of those its restrictions allow) is *parked*:
  it stays "queued" but out of the queues, so that it never blocks the tasks behind
  it, until a worker joins or resumes (or, every ``PARKED_RECHECK`` seconds, when a
  measured duration may have changed); then it is queued again. The first task of a
  prefix parked opens an *episode*: one event on topic ``"scheduling"`` and one
  ``TaskUnplaceable`` to the clients that want the task (to every client, if none
  does: it is a dependency), naming the task, its expected duration and the longest
  time any worker has left. The episode ends when no task of that prefix is parked.
- Workers without a lifetime or budget cost nothing: every check here is behind
  ``nlimited`` (runnable workers with a limit), zero on clusters without.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.model import UNKNOWN_DURATION, ClientRecord, TaskState, WorkerRecord
from shoal.core.scheduler.placement import Restrictions
from shoal.core.scheduler.rank_queue import RankQueue
from shoal.protocol import messages as m

SCHEDULING_TOPIC = "scheduling"
PARKED_RECHECK = 5.0  # seconds of wall time between rechecks of parked tasks
INFINITY = float("inf")


class Walltime:
    """Walltime methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    runnable: dict[str, WorkerRecord]
    clients: dict[str, ClientRecord]
    queue: RankQueue
    restricted: dict[Restrictions, None]
    wall_time: float
    _retry_restricted: bool

    if TYPE_CHECKING:
        from shoal.core.comm import Comm

        comm: Comm

        def log_event(self, topic: str, data: dict[str, Any]) -> None: ...
        def _worker_leaving(self, ws: WorkerRecord, msg: m.WorkerLeaving) -> None: ...

        workers: dict[str, WorkerRecord]
        retiring: dict[str, Any]
        free_workers: set[WorkerRecord]
        lanes_of_worker: dict[str, Any]

        def _close_worker_lanes(self, address: str, reason: str) -> None: ...

        def _valid_workers(self, r: Restrictions) -> Iterable[WorkerRecord]: ...
        def _capable_workers(self, r: Restrictions) -> Iterable[WorkerRecord]: ...

    def _init_walltime(self) -> None:
        self.nlimited = 0  # runnable workers with a deadline or a budget
        self.hints: dict[TaskState, float] = {}  # tasks with a duration hint -> seconds
        self.parked: dict[TaskState, None] = {}  # queued tasks that fit no worker
        self.parked_prefixes: dict[str, int] = {}  # prefix -> tasks parked (open episodes)
        self._recheck_parked = False  # a worker came: parked tasks may fit it
        self._parked_recheck_at = 0.0  # wall time of the next periodic recheck
        # The longest time left over the runnable workers, kept while neither the
        # workers, their budgets (``limits_version``) nor the clock changed.
        self.limits_version = 0
        self._longest_cache: tuple[int, float, float] = (-1, 0.0, 0.0)
        # Workers at the end of their lifetime or budget that wait for another worker to
        # take their results (see _walltime_leaving) -> the WorkerLeaving they sent.
        self.waiting_to_leave: dict[str, m.WorkerLeaving] = {}

    # ------------------------------------------------------------------ what fits where

    def expected_duration(self, ts: TaskState) -> float:
        """Seconds ``ts`` is expected to run: its hint, else the smaller of its
        prefix's measured mean and recent duration (the unknown default before any
        measurement): a slow first run (imports, cold caches) soon stops counting, and
        one slow run late does not count at once."""
        if self.hints:
            hint = self.hints.get(ts)
            if hint is not None:
                return hint
        prefix = ts.group.prefix
        recent = prefix.recent_duration
        if recent is None:
            return UNKNOWN_DURATION
        mean = prefix.duration_sum / prefix.duration_count
        return mean if mean < recent else recent  # min(), without its call (per task)

    def _time_left(self, ws: WorkerRecord) -> float:
        """Seconds ``ws`` has left for a new task (negative past its deadline, -inf
        once its budget is spent): a task of ``d`` seconds fits it iff ``d <=`` this."""
        if ws.budget is not None and ws.assigned >= ws.budget:
            return -INFINITY
        return INFINITY if ws.deadline is None else ws.deadline - self.wall_time

    def _fits(self, ws: WorkerRecord, duration: float) -> bool:
        """Whether a task of ``duration`` seconds given to ``ws`` now would finish
        before its deadline: it starts after the work already given to ``ws``
        (its occupancy, spread over its threads; a running task counts whole, which
        errs on the safe side), so a task queued behind another is not started late."""
        if ws.budget is not None and ws.assigned >= ws.budget:
            return False
        if ws.deadline is None:
            return True
        return self.wall_time + ws.occupancy / ws.nthreads + duration <= ws.deadline

    def _fitting(self, ts: TaskState, workers: Iterable[WorkerRecord]) -> list[WorkerRecord]:
        """Those of ``workers`` that ``ts`` fits (time and budget)."""
        duration = self.expected_duration(ts)
        return [ws for ws in workers if self._fits(ws, duration)]

    def _valid_fitting(self, ts: TaskState, r: Restrictions) -> list[WorkerRecord]:
        """The workers ``r`` allows that ``ts`` fits. A loose restriction (``workers=``
        with ``allow_other_workers``) allows any capable worker when none it names
        fits, as when none is connected."""
        fit = self._fitting(ts, self._valid_workers(r))
        if not fit and r.loose:
            fit = self._fitting(ts, self._capable_workers(r))
        return fit

    def _allowed(self, ts: TaskState) -> list[WorkerRecord]:
        """The workers ``ts`` may run on (whether it fits them or not)."""
        r = ts.restrictions
        if r is None:
            return list(self.runnable.values())
        workers = list(self._valid_workers(r))
        if r.loose and not self._fitting(ts, workers):
            workers = list(self._capable_workers(r))
        return workers

    def _longest_left(self, workers: Iterable[WorkerRecord]) -> float:
        """The most seconds any of ``workers`` has for a new task (-inf: none has any)."""
        return max((self._time_left(ws) for ws in workers), default=-INFINITY)

    def _longest_runnable(self) -> float:
        version, when, longest = self._longest_cache
        if version != self.limits_version or when != self.wall_time:
            longest = self._longest_left(self.runnable.values())
            self._longest_cache = (self.limits_version, self.wall_time, longest)
        return longest

    def workers_with_time(self) -> list[str]:
        """The runnable workers that may still be given a task (time and budget left),
        or all of them if none may: where a P2P shuffle places its partitions."""
        if not self.nlimited:
            return list(self.runnable)
        live = [a for a, ws in self.runnable.items() if self._time_left(ws) > 0]
        return live or list(self.runnable)

    # ------------------------------------------------------------------ leaving

    def _walltime_leaving(self, ws: WorkerRecord, msg: m.WorkerLeaving) -> None:
        """``WorkerLeaving``. One at the end of its lifetime or budget (``walltime``)
        with results and no other worker to take them waits: it is given no task (its
        budget is set to what it was given) but stays a home for the results of other
        leaving workers, so that two workers spent at once do not both lose theirs;
        it goes once a worker joins. Any other leaves at once (membership.py)."""
        if msg.walltime and ws.has_what and not self._others_to_copy_to(ws):
            if ws.address not in self.waiting_to_leave:
                if ws.budget is None and ws.deadline is None and ws.address in self.runnable:
                    self.nlimited += 1  # limited from now on
                ws.budget = ws.assigned  # no new task
                self.free_workers.discard(ws)
                if ws.address in self.lanes_of_worker:  # nor direct ones (lanes.py)
                    self._close_worker_lanes(ws.address, f"worker {ws.address} is leaving")
                self.limits_version += 1
                self.waiting_to_leave[ws.address] = msg
                self.log_event(
                    SCHEDULING_TOPIC,
                    {"action": "leave-waits", "worker": ws.address, "reason": msg.reason},
                )
            return
        self.waiting_to_leave.pop(ws.address, None)
        self._worker_leaving(ws, msg)

    def _others_to_copy_to(self, ws: WorkerRecord) -> bool:
        return any(w is not ws and w.address not in self.retiring for w in self.runnable.values())

    def _let_waiting_leave(self) -> None:
        """A worker came: the walltime leavers that waited for one go now."""
        for address, msg in list(self.waiting_to_leave.items()):
            ws = self.workers.get(address)
            if ws is None:
                del self.waiting_to_leave[address]
            elif self._others_to_copy_to(ws):
                del self.waiting_to_leave[address]
                self._worker_leaving(ws, msg)

    # ------------------------------------------------------------------ parking

    def _park_if_unfit(self, ts: TaskState, stimulus_id: str) -> bool:
        """Park queued ``ts`` if no worker it may run on fits it; True if parked."""
        r = ts.restrictions
        duration = self.expected_duration(ts)
        if r is None and duration <= self._longest_runnable():
            return False  # the common case, O(1) for a batch of queued tasks
        workers = self._allowed(ts)
        longest = self._longest_left(workers)
        if duration <= longest:
            return False
        self.parked[ts] = None
        name = ts.prefix.name
        n = self.parked_prefixes.get(name, 0)
        self.parked_prefixes[name] = n + 1
        if not n:
            self._unplaceable(ts, duration, longest, bool(workers), stimulus_id)
        return True

    def _unplaceable(
        self, ts: TaskState, duration: float, longest: float, any_worker: bool, sid: str
    ) -> None:
        """A new episode of ``ts``'s prefix waiting for a worker with time: say so once."""
        left = None if longest == -INFINITY else max(0.0, longest)
        if not any_worker:
            reason = "no connected worker may run it"
        elif left is None or longest <= 0:
            reason = "every worker that may run it has spent its task budget or its lifetime"
        else:
            reason = (
                f"it is expected to run {duration:g}s and no worker that may run it has "
                f"that long left (the longest: {left:g}s)"
            )
        text = f"task {ts.key!r} (prefix {ts.prefix.name!r}) waits for a worker with time: {reason}"
        self.log_event(
            SCHEDULING_TOPIC,
            {
                "action": "unplaceable",
                "key": ts.key,
                "prefix": ts.prefix.name,
                "duration": duration,
                "longest_left": left,
                "reason": text,
            },
        )
        msg = m.TaskUnplaceable(ts.key, ts.prefix.name, duration, left, text, sid)
        for cs in ts.who_wants or self.clients.values():
            self.comm.send_client(cs.id, msg)

    def _unpark_one(self, ts: TaskState) -> None:
        del self.parked[ts]
        name = ts.prefix.name
        n = self.parked_prefixes[name] - 1
        if n:
            self.parked_prefixes[name] = n
        else:
            del self.parked_prefixes[name]
            self.log_event(SCHEDULING_TOPIC, {"action": "placeable", "prefix": name})

    def _forget_parked(self, ts: TaskState) -> None:
        """``ts`` leaves state "queued" while parked (released, erred)."""
        self._unpark_one(ts)

    def _recheck(self, stimulus_id: str) -> None:
        """Queue again the parked tasks that fit a worker now."""
        self._recheck_parked = False
        self._parked_recheck_at = self.wall_time + PARKED_RECHECK
        for ts in list(self.parked):
            r = ts.restrictions
            if self._longest_left(self._allowed(ts)) < self.expected_duration(ts):
                continue
            self._unpark_one(ts)
            if r is None:
                self.queue.push(ts)
            else:
                heapq.heappush(r.queue, ts)
                self._retry_restricted = True
