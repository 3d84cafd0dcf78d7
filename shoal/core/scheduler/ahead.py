"""Placing a task ahead of its dependencies: a mixin of
:class:`~shoal.core.scheduler.SchedulerState`, as placement.

Every level of a graph used to cost a round trip: the worker reports TaskFinished, the
scheduler decides, and a ComputeTask travels back before the next level starts. A task
whose dependencies are all on one worker W, being computed there (or already in
memory there), need not wait for that: it is sent to W at once, *ahead*. The worker
holds it in ``waiting`` until its local dependencies are in memory and starts it the
moment they finish, with no message in between. Dependencies already in memory on
other workers, up to what moves within the transfer latency, do not keep a task from
going ahead: W fetches them while the rest compute (a reduction's aggregate, its
inputs on two workers, then starts as its last local input is done, not a round trip
and a fetch later). Nor do more of them, for a task nothing depends on, while W's
queue is short, if no other worker would need less moved once the rest is done (a
compute's final concatenation of partitions, half of them on each worker).

A task is considered for going ahead at the end of the event in which a dependency
started processing for real, one came into memory, or the task itself arrived while
everything it waits on was processing already (``y = submit(g, x)`` while ``x`` runs:
a submission apart from its dependency's, as Dask users write them).

An ahead task is in state ``processing`` on W with a non-empty ``waiting_on`` (the
dependencies still processing on W), and is in ``W.ahead``. It holds no thread: it does
not count against W's slots (``_is_free``), is never stolen, and releasing it owes no
``ComputeReleased``. It becomes an ordinary processing task when its last dependency
reports TaskFinished from W. Anything else that happens to a dependency takes it back
(processing -> released, and so waiting again, or erred), in the same event:

- a dependency errs: its dependents err, the ahead one too (the worker is told to drop it);
- a dependency is released (its client let go, its worker died or left, it was taken
  back): the ahead task is released and placed again once its dependencies are back;
- a dependency in memory elsewhere is lost: as for every processing task;
- a dependency is not stolen while something waits on it ahead, and a dependency with
  a steal request out is not waited on ahead.

Bounded run-ahead, so that a large graph's frontier is not pinned to one worker: only
one level ahead (a task waiting ahead is not itself waited on ahead), at most
:data:`AHEAD_PER_THREAD` tasks ahead per thread of a worker (up to
:data:`TINY_AHEAD_PER_THREAD` while their measured work stays within the transfer
latency: ``_tiny_ahead``), only unrestricted tasks
that are neither a shuffle's nor an actor, only on a worker that takes new tasks, and
not while workers have walltime limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.model import TaskState, WorkerRecord, discarded
from shoal.core.scheduler.placement import BANDWIDTH

AHEAD_PER_THREAD = 2  # tasks a worker may hold ahead, per thread
# ... or up to this many, while their measured work is within the transfer latency
# (core/scheduler/packing.py) per thread: a tree of tiny tasks packed on one worker
# (16 roots, 4 partial sums) then has every partial waiting there, not half of them
# waiting for a round trip through the scheduler.
TINY_AHEAD_PER_THREAD = 16


class PlaceAhead:
    """Ahead placement methods and state of :class:`SchedulerState`."""

    runnable: dict[str, WorkerRecord]
    transfer_latency: float
    steals: dict[TaskState, Any]
    free_workers: set[WorkerRecord]
    nlimited: int
    shuffle_tasks: dict[TaskState, Any]
    _actor_ids: dict[Any, str]
    transition_counter: int
    _record_transition: Callable[[tuple[Any, ...]], None]

    if TYPE_CHECKING:

        def _add_processing(self, ts: TaskState, ws: WorkerRecord) -> None: ...
        def _send_compute(self, ts: TaskState, ws: WorkerRecord, stimulus_id: str) -> None: ...
        def _is_free(self, ws: WorkerRecord) -> bool: ...
        def expected_duration(self, ts: TaskState) -> float: ...

    def _init_ahead(self) -> None:
        self.ahead_per_thread = AHEAD_PER_THREAD  # 0: never place ahead
        # False: only with what moves within the transfer latency elsewhere (the rule
        # before _least_fetch_elsewhere; benchmarks/packing_ab.py --rule ahead-data)
        self.ahead_beyond_latency = True
        # Tasks that started processing for real in this event (placed with every
        # dependency in memory, or whose last ahead dependency finished): their waiting
        # dependents are considered at the end of the event.
        self._ahead_from: list[TaskState] = []
        self.placed_ahead = 0  # tasks ever placed ahead (a counter for tests and stats)

    def _dependency_done_ahead(self, done: TaskState, waiter: TaskState) -> None:
        """``done``, a dependency ``waiter`` waits on ahead, is in memory: one less to
        wait for; with none left, ``waiter`` holds a slot like any processing task."""
        waiting = waiter.waiting_on
        if done not in waiting:
            return
        waiter.waiting_on = waiting = discarded(waiting, done)
        if waiting:
            return
        ws = waiter.processing_on
        assert ws is not None
        ws.ahead.discard(waiter)
        if not self._is_free(ws):
            self.free_workers.discard(ws)
        if self.ahead_per_thread:
            self._ahead_from.append(waiter)

    def _place_ahead(self, stimulus_id: str) -> None:
        """End of an event: send the waiting dependents of tasks that started
        processing in it ahead to their worker, where they qualify; and tasks a
        dependency of which came into memory in it, where what they still wait on
        computes on a free worker."""
        started, self._ahead_from = self._ahead_from, []
        for dts in started:
            if dts.state == "waiting":
                self._place_waiting_ahead(dts, stimulus_id)
                continue
            ws = dts.processing_on
            if ws is None or dts.waiting_on or not self._takes_ahead(ws):
                continue
            for ts in list(dts.waiters):
                if not self._room_ahead(ts, ws):
                    break
                if ts.state == "waiting" and self._may_wait_ahead(ts, ws):
                    self._send_ahead(ts, ws, stimulus_id)

    def _place_waiting_ahead(self, ts: TaskState, stimulus_id: str) -> None:
        """``ts`` waits, one of its dependencies just came into memory: ahead to the
        worker computing the rest, if that worker is free (a graph keeping the workers
        busy gains nothing from it) and ``ts`` qualifies."""
        if not ts.waiting_on:
            return
        ws = next(iter(ts.waiting_on)).processing_on
        if (
            ws is not None
            and self._is_free(ws)  # its queue holds no more than a moment's work
            and self._takes_ahead(ws)
            and self._room_ahead(ts, ws)
            and self._may_wait_ahead(ts, ws)
        ):
            self._send_ahead(ts, ws, stimulus_id)

    def _takes_ahead(self, ws: WorkerRecord) -> bool:
        """``ws`` takes tasks ahead: it takes new tasks, and no worker has a walltime
        limit."""
        return not self.nlimited and ws.address in self.runnable and bool(ws.min_slots)

    def _room_ahead(self, ts: TaskState, ws: WorkerRecord) -> bool:
        """``ws`` holds fewer tasks ahead than its limit, or ``ts`` fits as a tiny one."""
        return len(ws.ahead) < self.ahead_per_thread * ws.nthreads or self._tiny_ahead(ts, ws)

    def _send_ahead(self, ts: TaskState, ws: WorkerRecord, stimulus_id: str) -> None:
        self._record_transition((ts.key, "waiting", "processing", stimulus_id))
        self.transition_counter += 1
        ts.state = "processing"
        self._add_processing(ts, ws)  # into ws.ahead: it waits on some
        self._send_compute(ts, ws, stimulus_id)
        self.placed_ahead += 1

    def _tiny_ahead(self, ts: TaskState, ws: WorkerRecord) -> bool:
        """``ts`` may wait ahead on ``ws`` beyond the count limit: the work held there
        ahead, with it, is measured and within the transfer latency per thread (so
        pinning it to ``ws`` can delay it no more than a fetch would), and the tasks
        ahead are at most :data:`TINY_AHEAD_PER_THREAD` per thread."""
        latency = self.transfer_latency
        if not latency or len(ws.ahead) >= TINY_AHEAD_PER_THREAD * ws.nthreads:
            return False
        budget = latency * ws.nthreads - self.expected_duration(ts)
        for waiting in ws.ahead:
            budget -= waiting.estimate
            if budget < 0:
                return False
        return budget >= 0

    def _may_wait_ahead(self, ts: TaskState, ws: WorkerRecord) -> bool:
        """Every dependency of ``ts`` still computing is processing on ``ws`` for real
        (not ahead, no steal request out), and those in memory are there too, or
        elsewhere in at most what moves within the transfer latency
        (:meth:`_ahead_fetch_bytes`): ``ws`` fetches them while the others compute,
        where placing ``ts`` once ready would have fetched them after (the aggregate of
        a reduction over two workers: ``x.T @ x``, ``df.b.sum()``). More data elsewhere
        goes ahead too if nothing depends on ``ts``, ``ws``'s queue is short and no
        other worker would need less moved once the rest is done
        (:meth:`_least_fetch_elsewhere`: a compute's final concatenation of a
        dataframe's partitions, half of them on each worker). Otherwise ``ts`` is
        placed as usual, once ready: another worker may then be better.
        ``ts`` itself is unrestricted and recomputable, and not a task the scheduler
        coordinates (a shuffle's, an actor)."""
        if ts.restrictions is not None or ts.payload is None or not ts.waiting_on:
            return False
        if (self.shuffle_tasks and ts in self.shuffle_tasks) or ts.key in self._actor_ids:
            return False
        steals = self.steals
        waiting_on = ts.waiting_on
        remote = 0  # what ws would fetch from other workers
        for dts in ts.dependencies:
            if dts not in waiting_on:  # in memory: here, or fetched while the rest compute
                if ws not in dts.who_has:
                    remote += dts.nbytes
            elif (
                dts.processing_on is not ws
                or dts.state != "processing"
                or dts.waiting_on
                or dts in steals
            ):
                return False
        if remote <= self._ahead_fetch_bytes():
            return True
        # More than moves in a moment: still ahead for an end of the graph (nothing
        # depends on it: a compute's final concatenation), if no other worker would be
        # sent less once the rest is done, and ws's queue is short (what it fetches is
        # used soon). ws then fetches while it computes what it had to anyway. A task
        # with dependents is placed once ready: pinned early, it would take away the
        # choice of a less loaded worker from the work after it (measured on
        # ``(x + x.T).sum()`` over 8 MB chunks: PROFILE-interactive.md, section 8).
        return (
            self.ahead_beyond_latency
            and not ts.dependents
            and self._is_free(ws)
            and remote <= self._least_fetch_elsewhere(ts, ws)
        )

    def _least_fetch_elsewhere(self, ts: TaskState, ws: WorkerRecord) -> float:
        """The fewest bytes ``ts`` would need moved to a worker other than ``ws`` once
        its dependencies computing on ``ws`` are done: its dependencies in memory that
        worker does not hold, and those computing, each estimated at its group's mean
        result size (0 while none of the group is in memory)."""
        waiting_on = ts.waiting_on
        total = 0
        held: dict[WorkerRecord, int] = {}
        for dts in ts.dependencies:
            if dts in waiting_on:
                group = dts.group
                in_memory = group.states["memory"]
                if in_memory:
                    total += group.nbytes // in_memory
                continue
            nbytes = dts.nbytes
            total += nbytes
            for holder in dts.who_has:
                if holder is not ws:
                    held[holder] = held.get(holder, 0) + nbytes
        return total - max(held.values(), default=0)

    def _ahead_fetch_bytes(self) -> float:
        """The most data a task sent ahead may need from other workers: what moves
        within the transfer latency at the assumed bandwidth (0 with no latency term:
        only data on its worker)."""
        return self.transfer_latency * BANDWIDTH

    def _waited_on_ahead(self, ts: TaskState) -> list[TaskState]:
        """The tasks waiting ahead on ``ts``'s result."""
        return [d for d in ts.waiters if d.state == "processing" and ts in d.waiting_on]
