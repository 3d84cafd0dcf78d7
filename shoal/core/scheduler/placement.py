"""Which worker runs a task: the placement half of :class:`SchedulerState`.

A mixin, so that its methods keep their names and share the scheduler's records:

- a task with dependencies goes where most of their bytes already are, ties to the
  least loaded worker (``_decide_worker``);
- root tasks wait in a queue and go out, best priority first, to workers with a free
  slot (``_schedule_queued``), so no worker is flooded;
- ``_add_processing``/``_remove_processing`` keep each worker's processing set,
  occupancy, resources in use and the set of free workers in step.
- A task released while it was processing (cancelled, or no longer needed) may still
  run on its worker's thread: that thread counts as busy (``_drain``) until the worker
  says it is free (``ComputeReleased``: the thread ended, seceded, or took the task up
  again for a new ComputeTask; ``_drained``). A worker whose every thread is draining
  gets no queued task, and a task with dependencies goes there only if no other worker
  can take it.

Restrictions (``Client.submit(workers=, allow_other_workers=, resources=)``), with Dask's
meaning:

- ``workers``: addresses, names or hosts. The task runs only on a worker that matches
  one of them; with ``allow_other_workers`` on any worker while no connected worker
  that matches can run it (a preference: Dask's loose restrictions).
- ``resources``: the task runs only on a worker that declared at least that much of
  each in total, and only while that much is free there (the scheduler counts what the
  tasks processing on each worker hold). Never loosened: a task that needs a GPU does
  not run without one.

A restricted task never enters the root-task queue, where it could stop at the head
and starve the rest. Once ready it is queued with the tasks of the same restrictions
(one shared :class:`Restrictions`) and goes out at the end of the event, best priority
first, to the best valid worker with room for its resources. Without one it waits (it is
not an error) until a worker joins or leaves or resources are released. As in Dask, a
restricted task does not wait for a free thread: ``workers=`` alone sends every task to
its workers at once, and ``resources=`` bounds how many run.

The tasks of a P2P shuffle are restricted to its participants but are "slotted": they
go out only to a free thread, and only when no root task in the queue comes first by
priority. Else every unpack would land on its owner at once, and run before the root
tasks that come first in the graph's order (e.g. the other side of a merge), holding
all of their outputs in memory.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.model import TaskState, WorkerRecord, min_slots
from shoal.core.scheduler.rank_queue import RankQueue
from shoal.core.story import StoryLog
from shoal.protocol.messages import Key, TaskRestrictions

MAX_SET_ASIDE = 1000  # walltime: queued tasks passed over per round, that fit only busy workers
QUEUE_HORIZON = 0.02  # seconds of expected work a worker may hold beyond its slots
MAX_PER_THREAD = 1000  # hard cap on tasks processing per thread
BANDWIDTH = 100e6  # bytes/s assumed for moving a dependency between workers
SLACK = 1e-9  # float sums of resource amounts may miss a total by rounding


class Restrictions:
    """Where the tasks submitted with the same restrictions may run; one object shared
    by all of them (interned), which also queues those of them waiting for a worker."""

    __slots__ = ("workers", "loose", "resources", "slotted", "queue", "nqueued", "__weakref__")

    def __init__(
        self,
        workers: frozenset[str],
        loose: bool,
        resources: dict[str, float],
        slotted: bool = False,
    ):
        self.workers = workers  # addresses, names or hosts; empty: any worker
        self.loose = loose and bool(workers)  # may run elsewhere if none of them can
        self.resources = resources  # held on the worker while a task runs
        self.slotted = slotted  # waits for a free thread, in priority with root tasks
        self.queue: list[TaskState] = []  # heap by rank, lazily pruned
        self.nqueued = 0  # tasks in state "queued" with these restrictions

    def matches(self, ws: WorkerRecord) -> bool:
        """``ws`` is one of the workers named (by address, name or host)."""
        return not self.workers.isdisjoint(ws.aliases)

    def capable(self, ws: WorkerRecord) -> bool:
        """``ws`` has declared enough of every resource to ever run such a task."""
        totals = ws.resources
        return all(k in totals and totals[k] >= need for k, need in self.resources.items())

    def has_room(self, ws: WorkerRecord) -> bool:
        """Enough of every resource is free on ``ws`` now (it is capable)."""
        totals, used = ws.resources, ws.used_resources
        return all(totals[k] - used[k] >= need - SLACK for k, need in self.resources.items())

    def __repr__(self) -> str:
        loose = " loose" if self.loose else ""
        slotted = " slotted" if self.slotted else ""
        return (
            f"<Restrictions workers={sorted(self.workers)}{loose}{slotted} "
            f"resources={self.resources}>"
        )


class Placement:
    """Placement methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    workers: dict[str, WorkerRecord]
    log: StoryLog
    transition_counter: int
    _record_transition: Callable[[tuple[Any, ...]], None]
    # sibling packing (core/scheduler/packing.py)
    transfer_latency: float
    packed: int
    # ahead placement (core/scheduler/ahead.py)
    ahead_per_thread: int
    _ahead_from: list[TaskState]
    # walltime (core/scheduler/walltime.py)
    nlimited: int
    limits_version: int
    parked: dict[TaskState, None]
    _recheck_parked: bool
    # lanes (core/scheduler/lanes.py)
    lanes_of_worker: dict[str, Any]

    if TYPE_CHECKING:

        def _fitting(
            self, ts: TaskState, workers: Iterable[WorkerRecord]
        ) -> list[WorkerRecord]: ...
        def _fits(self, ws: WorkerRecord, duration: float) -> bool: ...
        def _time_left(self, ws: WorkerRecord) -> float: ...
        def expected_duration(self, ts: TaskState) -> float: ...
        def _park_if_unfit(self, ts: TaskState, stimulus_id: str) -> bool: ...
        def _valid_fitting(self, ts: TaskState, r: Restrictions) -> list[WorkerRecord]: ...
        def _forget_parked(self, ts: TaskState) -> None: ...
        def _close_worker_lanes(self, address: str, reason: str) -> None: ...
        def _joins_sibling(
            self,
            ts: TaskState,
            sibling: TaskState,
            ws: WorkerRecord,
            least_loaded: WorkerRecord | None,
        ) -> bool: ...

        def _transition_queued_processing(
            self, ts: TaskState, stimulus_id: str, ws: WorkerRecord | None = None
        ) -> dict[TaskState, str]: ...

    def _init_placement(self) -> None:
        # Root tasks by rank, lazily pruned (core/scheduler/rank_queue.py).
        self.queue = RankQueue()
        self.nqueued = 0  # tasks in that queue (restricted ones wait in their Restrictions)
        self.free_workers: set[WorkerRecord] = set()  # workers that may take queued tasks
        # Workers that may be given new tasks: not paused, not retiring. The indexes
        # below hold only these.
        self.runnable: dict[str, WorkerRecord] = {}
        self.by_alias: dict[str, set[WorkerRecord]] = {}  # address, name, host -> workers
        self.by_resource: dict[str, set[WorkerRecord]] = {}  # resource -> workers with some
        self.restricted: dict[Restrictions, None] = {}  # those with queued tasks, in order
        self._retry_restricted = False  # something changed that may let one of them go
        self.nslotted = 0  # queued tasks with slotted restrictions (they wait for slots)
        self._interned: weakref.WeakValueDictionary[tuple[object, ...], Restrictions] = (
            weakref.WeakValueDictionary()
        )

    # ------------------------------------------------------------------ workers

    def _index_worker(self, ws: WorkerRecord) -> None:
        """``ws`` may be given new tasks (it joined, or resumed)."""
        self.runnable[ws.address] = ws
        for alias in ws.aliases:
            self.by_alias.setdefault(alias, set()).add(ws)
        for resource in ws.resources:
            self.by_resource.setdefault(resource, set()).add(ws)
        if self._is_free(ws):
            self.free_workers.add(ws)
        self._retry_restricted = True  # room, perhaps the first valid worker
        if ws.deadline is not None or ws.budget is not None:
            self.nlimited += 1
        self.limits_version += 1  # the longest time left may change
        if self.parked:
            self._recheck_parked = True  # time left, perhaps, for a task that waits

    def _unindex_worker(self, ws: WorkerRecord) -> None:
        """``ws`` gets no new tasks (it left, paused or is retiring)."""
        del self.runnable[ws.address]
        if ws.address in self.lanes_of_worker:  # nor direct ones (lanes.py)
            gone = ws.address not in self.workers
            why = "left" if gone else "takes no new tasks"
            self._close_worker_lanes(ws.address, f"worker {ws.address} {why}")
        for index, names in ((self.by_alias, ws.aliases), (self.by_resource, ws.resources)):
            for name in names:
                holders = index[name]
                holders.discard(ws)
                if not holders:
                    del index[name]
        self.free_workers.discard(ws)
        self._retry_restricted = True  # loose tasks may now run on any worker
        if ws.deadline is not None or ws.budget is not None:
            self.nlimited -= 1
        self.limits_version += 1  # the longest time left may change

    def _is_free(self, ws: WorkerRecord) -> bool:
        if ws.budget is not None and ws.assigned >= ws.budget:
            return False  # its task budget is spent (walltime)
        n = len(ws.processing) - len(ws.long_running) - len(ws.ahead)
        if n < ws.min_slots:
            return True
        threads = ws.slot_threads  # nthreads less the draining ones
        return ws.occupancy < threads * QUEUE_HORIZON and n < threads * MAX_PER_THREAD

    def _drain(self, ws: WorkerRecord, key: Key) -> None:
        """A thread of ``ws`` may still run ``key``, which was released while it
        processed there: count that thread busy until the worker answers."""
        ws.draining[key] = ws.draining.get(key, 0) + 1
        ws.ndraining += 1
        self._set_slots(ws)

    def _drained(self, ws: WorkerRecord, key: Key) -> bool:
        """The worker says a thread that ran released ``key`` is free; False if no such
        thread was counted (an answer the scheduler never asked for is ignored)."""
        n = ws.draining.get(key, 0)
        if not n:
            return False
        if n == 1:
            del ws.draining[key]
        else:
            ws.draining[key] = n - 1
        ws.ndraining -= 1
        self._set_slots(ws)
        return True

    def _set_slots(self, ws: WorkerRecord) -> None:
        ws.slot_threads = threads = max(0, ws.nthreads - ws.ndraining)
        ws.min_slots = min_slots(threads)
        if ws.address in self.runnable and self._is_free(ws):
            self.free_workers.add(ws)
        else:
            self.free_workers.discard(ws)

    def _add_processing(self, ts: TaskState, ws: WorkerRecord) -> None:
        ts.processing_on = ws
        ws.processing.add(ts)
        if ts.waiting_on:
            ws.ahead.add(ts)  # sent ahead of dependencies still computing there
        elif self.ahead_per_thread:
            self._ahead_from.append(ts)  # its waiting dependents may follow it there
        ts.estimate = est = self.expected_duration(ts)  # the hint, if any
        ws.occupancy += est
        if ws.budget is not None:
            ws.assigned += 1  # never given back: the worker counts its ComputeTasks too
            self.limits_version += 1
        r = ts.restrictions
        if r is not None and r.resources:
            used = ws.used_resources
            for resource, need in r.resources.items():
                used[resource] += need
        if not self._is_free(ws):
            self.free_workers.discard(ws)

    def _remove_processing(self, ts: TaskState) -> WorkerRecord | None:
        ws = ts.processing_on
        if ws is None:
            return None
        ts.processing_on = None
        ws.processing.discard(ts)
        ws.long_running.discard(ts)
        ws.ahead.discard(ts)
        ws.occupancy -= ts.estimate
        r = ts.restrictions
        if r is not None and r.resources:
            used = ws.used_resources
            for resource, need in r.resources.items():
                used[resource] -= need
            self._retry_restricted = True
        elif ws.deadline is not None and self.restricted:
            self._retry_restricted = True  # less work ahead: one may now end in time
        if not ws.processing:
            ws.occupancy = 0.0  # no drift from float sums
            for resource in ws.used_resources:
                ws.used_resources[resource] = 0.0
        # (already free: no need to check; a task's end never makes a worker less free)
        if ws not in self.free_workers and ws.address in self.runnable and self._is_free(ws):
            self.free_workers.add(ws)
        return ws

    def _decide_worker(self, ts: TaskState) -> WorkerRecord | None:
        """Where the most dependency bytes already are; ties go to the least loaded.
        Idle workers compete too, paying for the bytes they would have to fetch.
        A restricted task only considers valid workers with room for its resources."""
        r = ts.restrictions
        if r is not None:
            # (with walltime limits: those it fits, which a loose restriction widens)
            valid = self._valid_fitting(ts, r) if self.nlimited else self._valid_workers(r)
            allowed = [ws for ws in valid if r.has_room(ws)]
            if r.slotted:
                allowed = [ws for ws in allowed if ws in self.free_workers]
            if not allowed:
                return None
            if len(allowed) > 1:  # rather not where every thread is draining
                allowed = [ws for ws in allowed if ws.min_slots] or allowed
        elif not self.runnable:
            return None
        local: dict[WorkerRecord, int] = {}
        total = 0
        for dts in ts.dependencies:
            nbytes = dts.nbytes
            total += nbytes
            for ws in dts.who_has:
                local[ws] = local.get(ws, 0) + nbytes
        if r is not None:
            candidates: Collection[WorkerRecord] = allowed
        else:
            # (min_slots is 0 only while every thread of the worker is draining)
            candidates = {ws for ws in local if ws.min_slots and ws.address in self.runnable}
            candidates.update(self.free_workers)
            if self.nlimited:
                candidates = set(self._fitting(ts, candidates))
            if not candidates:
                runnable: Collection[WorkerRecord] = self.runnable.values()
                if self.nlimited:
                    runnable = self._fitting(ts, runnable)
                    if not runnable:
                        return None  # no worker has the time or budget left for it
                candidates = {ws for ws in runnable if ws.min_slots} or set(runnable)
        best = None
        best_cost: tuple[float, int, str] | None = None
        latency = self.transfer_latency  # a worker lacking inputs waits for a fetch
        for ws in candidates:
            have = local.get(ws, 0)
            cost = (
                (total - have) / BANDWIDTH
                + (latency if have < total else 0.0)
                + ws.occupancy / ws.nthreads,
                -have,
                ws.address,
            )
            if best_cost is None or cost < best_cost:
                best, best_cost = ws, cost
        return best

    def _schedule_queued(self, stimulus_id: str) -> None:
        """Hand root tasks from the queue to workers with free capacity, best first."""
        if self.nlimited:
            self._schedule_queued_walltime(stimulus_id)
            return
        queue = self.queue
        # One task at a time to the least loaded free worker, so idle threads on other
        # workers are used before any worker gets its extra slot.
        # A root that shares a dependent with the one placed before it may follow it
        # to its worker (core/scheduler/packing.py): that worker stays out of the heap
        # while it is the one to follow.
        free = [(len(w.processing) / w.nthreads, w.address, w) for w in self.free_workers]
        heapq.heapify(free)
        follow: WorkerRecord | None = None  # free, where ``last`` went
        last: TaskState | None = None
        while queue and (free or follow is not None):
            ts = queue.pop()
            if ts._state != "queued":
                continue  # released while queued: a stale entry
            ws = None
            if follow is not None and last is not None:
                if self._joins_sibling(ts, last, follow, free[0][2] if free else None):
                    ws = follow
                    self.packed += 1
                else:
                    heapq.heappush(free, (len(follow.processing) / follow.nthreads, follow.address, follow))
                    follow = None
            if ws is None:
                ws = heapq.heappop(free)[2]
            self._record_transition((ts.key, "queued", "processing", stimulus_id))
            self.transition_counter += 1
            self._transition_queued_processing(ts, stimulus_id, ws)
            follow = None
            if ws in self.free_workers:  # (_add_processing just took it out if not free)
                if self.transfer_latency:
                    follow, last = ws, ts
                else:
                    heapq.heappush(free, (len(ws.processing) / ws.nthreads, ws.address, ws))

    def _schedule_queued_walltime(self, stimulus_id: str) -> None:
        """``_schedule_queued`` when some workers have a deadline or budget: each task
        goes to the least loaded free worker it fits. One that fits no free worker is
        passed over (it waits for a busy worker it fits: at most MAX_SET_ASIDE per
        round), or parked if it fits no worker at all."""
        queue, parked = self.queue, self.parked
        free = [(len(w.processing) / w.nthreads, w.address, w) for w in self.free_workers]
        heapq.heapify(free)
        # Fitting is monotone in the duration: a task no shorter than one that fit no
        # free worker fits none either (budgets do not depend on the duration).
        shortest_unfit = float("inf")
        aside: list[TaskState] = []
        while queue and free and len(aside) < MAX_SET_ASIDE:
            ts = queue.pop()
            if ts.state != "queued" or ts in parked:
                continue  # stale, or waiting for a worker with time (re-queued then)
            duration = self.expected_duration(ts)
            ws = None
            if duration < shortest_unfit:
                passed = []
                while free:
                    candidate = heapq.heappop(free)
                    if self._fits(candidate[2], duration):
                        ws = candidate[2]
                        break
                    passed.append(candidate)
                for candidate in passed:
                    heapq.heappush(free, candidate)
            if ws is None:
                shortest_unfit = min(shortest_unfit, duration)
                if not self._park_if_unfit(ts, stimulus_id):
                    aside.append(ts)
                continue
            self.log.append((ts.key, "queued", "processing", stimulus_id))
            self.transition_counter += 1
            self._transition_queued_processing(ts, stimulus_id, ws=ws)
            if self._is_free(ws):
                heapq.heappush(free, (len(ws.processing) / ws.nthreads, ws.address, ws))
        for ts in aside:
            queue.push(ts)

    # ------------------------------------------------------------------ restrictions

    def _restrictions(self, spec: TaskRestrictions, slotted: bool = False) -> Restrictions | None:
        """The shared Restrictions for a task's wire restrictions (None: unrestricted)."""
        workers = frozenset(spec.workers)
        resources = tuple(sorted(spec.resources.items()))
        if not workers and not resources:
            return None
        loose = spec.allow_other_workers and bool(workers)
        ident = (workers, loose, resources, slotted)
        r = self._interned.get(ident)
        if r is None:
            r = self._interned[ident] = Restrictions(workers, loose, dict(resources), slotted)
        return r

    def _capable_workers(self, r: Restrictions) -> Collection[WorkerRecord]:
        """The connected workers with enough of every resource ``r`` needs."""
        if r.resources:
            some = self.by_resource.get(next(iter(r.resources)), ())
            return [ws for ws in some if r.capable(ws)]
        return self.runnable.values()

    def _valid_workers(self, r: Restrictions) -> Collection[WorkerRecord]:
        """The connected workers that may ever run a task with restrictions ``r``."""
        capable = self._capable_workers(r)
        if not r.workers:
            return capable
        by_alias = self.by_alias
        named = {ws for name in r.workers for ws in by_alias.get(name, ()) if r.capable(ws)}
        if named or not r.loose:
            return named
        return capable

    def _enqueue(self, ts: TaskState) -> None:
        """``ts`` enters state "queued": the root-task queue, or its restrictions' own."""
        r = ts.restrictions
        if r is None:
            self.queue.push(ts)
            self.nqueued += 1
            return
        queue = r.queue
        heapq.heappush(queue, ts)
        r.nqueued += 1
        self.nslotted += r.slotted
        if len(queue) > 2 * r.nqueued + 1024:  # drop stale entries now and then
            queue[:] = [e for e in queue if e.state == "queued"]
            heapq.heapify(queue)
        self.restricted[r] = None
        self._retry_restricted = True

    def _dequeue(self, ts: TaskState) -> None:
        """``ts`` leaves state "queued"; its heap entry goes stale (skipped later)."""
        if self.parked and ts in self.parked:
            self._forget_parked(ts)
        r = ts.restrictions
        if r is None:
            self.nqueued -= 1
            return
        r.nqueued -= 1
        self.nslotted -= r.slotted
        if not r.nqueued:
            del self.restricted[r]
            r.queue.clear()  # only stale entries left; they would keep tasks alive

    def _schedule_restricted(self, stimulus_id: str) -> None:
        """Send queued restricted tasks to valid workers with room, best priority first
        across all restrictions. Tasks sharing restrictions have the same valid workers,
        so once the best of them finds no room, the rest need not be tried."""
        self._retry_restricted = False
        root = self._root_top()
        tops: list[tuple[int, int, Restrictions]] = []
        for i, r in enumerate(self.restricted):
            top = _live_top(r, self.parked)
            if top is not None:
                tops.append((top.rank, i, r))
        heapq.heapify(tops)
        while tops:
            _, i, r = tops[0]
            ts = r.queue[0]
            if r.slotted and root is not None and root.rank < ts.rank:
                heapq.heappop(tops)  # a root task comes first
                continue
            ws = self._decide_worker(ts)
            if ws is None:
                if self.nlimited and self._park_if_unfit(ts, stimulus_id):
                    heapq.heappop(r.queue)  # out of the way of the tasks behind it
                    top = _live_top(r, self.parked)
                    if top is None:
                        heapq.heappop(tops)
                    else:
                        heapq.heapreplace(tops, (top.rank, i, r))
                    continue
                heapq.heappop(tops)
                continue
            heapq.heappop(r.queue)
            self._record_transition((ts.key, "queued", "processing", stimulus_id))
            self.transition_counter += 1
            self._transition_queued_processing(ts, stimulus_id, ws=ws)
            top = _live_top(r, self.parked)
            if top is None:
                heapq.heappop(tops)
            else:
                heapq.heapreplace(tops, (top.rank, i, r))

    def _root_top(self) -> TaskState | None:
        """The best task of the root-task queue, dropping stale entries on the way."""
        queue, parked = self.queue, self.parked
        while queue:
            ts = queue.peek()
            if ts.state == "queued" and not (parked and ts in parked):
                return ts
            queue.pop()
        return None


def _live_top(r: Restrictions, parked: dict[TaskState, None]) -> TaskState | None:
    """The best queued task of ``r``, dropping stale entries (and parked tasks: queued
    again when they fit a worker) on the way."""
    queue = r.queue
    while queue and (queue[0].state != "queued" or (parked and queue[0] in parked)):
        heapq.heappop(queue)
    return queue[0] if queue else None
