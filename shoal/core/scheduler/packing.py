"""Keeping sibling tiny tasks together: a mixin of
:class:`~shoal.core.scheduler.SchedulerState`, as placement.

Spreading the inputs of one reduction over two workers buys parallelism but costs a
transfer: the task that combines them fetches the ones computed elsewhere, and goes
ahead (core/scheduler/ahead.py) only once those are done, often after a round trip
through the scheduler. For tasks of seconds that is nothing; for a small tree of tasks of
microseconds (``da.ones(...).sum()``: 16 roots of ~0.1 ms, 4 partial sums, one
aggregate) the transfer and round trip are most of the compute.

The rule is Dask's ``worker_objective`` (when would the task finish there) with a
latency term, :data:`TRANSFER_LATENCY`, for a worker that must fetch an input:

- A root task (from the queue) whose expected duration is known (measured for its
  prefix, or hinted) and tiny (with its arguments' bytes at the assumed bandwidth, under
  the latency: a partition carried in the graph is worth spreading), and which feeds a
  task that the root placed just before it also feeds (a common dependent, or a
  dependent's dependent: its sibling or cousin, in the graph's order) goes to the
  worker that one went to, while that worker is free and its work ahead, per thread,
  exceeds the least loaded free worker's by at most the latency: placed elsewhere, the
  task could start at most that much sooner, and its dependent would pay a transfer
  (``_joins_sibling``). A root that starts a new group of siblings (a cousin of the
  one before, not a sibling) follows only if its whole group's work still fits in
  that latency; else the group starts on the other worker. Switching workers between
  groups, not inside one, leaves every partial its inputs on one worker
  (``tall.T @ tall``: 10 roots of ~0.4 ms in groups of 4, 4 and 2 went 5 and 5, so
  the middle partial fetched, and waited for a round trip, on the critical path).
- A task with dependencies goes where its finish is soonest, counting for each worker
  the bytes it lacks at the assumed bandwidth plus, if it lacks any, the latency
  (``placement._decide_worker``).

Both compare work in seconds, so they change nothing when work is long: a task of a
second's measured duration never waits behind its sibling (the difference is far above
the latency), and a prefix never measured counts 0.5 s per task (unknown: as before).
Only queued root tasks are packed, so restrictions, resources, actors and shuffles
(each queued with its restrictions) and walltime limits (their own scheduling path)
are placed as before; paused and retiring workers are never free. Work stealing leaves
tasks under 5 ms where they are, so it does not undo this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.model import TaskState, WorkerRecord
from shoal.core.scheduler.placement import BANDWIDTH

# Seconds that spreading two inputs of one task over two workers costs it: a fetch
# between workers plus the round trip through the scheduler that placing it ahead
# would have saved (loopback, Python processes: ~1-2 ms measured).
TRANSFER_LATENCY = 0.002
NEAR = 8  # dependents looked at per task and level when relating two tasks (>= 1)


class Packing:
    """Sibling packing methods and state of :class:`SchedulerState`."""

    hints: dict[TaskState, float]
    _actor_ids: dict[Any, str]

    if TYPE_CHECKING:

        def _is_free(self, ws: WorkerRecord) -> bool: ...

    def _init_packing(self) -> None:
        # 0: never pack siblings, and no latency term (spread as before)
        self.transfer_latency = TRANSFER_LATENCY
        self.packed = 0  # root tasks placed with their sibling (a counter for tests, stats)

    def _known_duration(self, ts: TaskState) -> float | None:
        """``ts``'s hinted or recently measured duration; None while its prefix was
        never measured."""
        if self.hints:
            hint = self.hints.get(ts)
            if hint is not None:
                return hint
        return ts.group.prefix.recent_duration

    def _joins_sibling(
        self,
        ts: TaskState,
        sibling: TaskState,
        ws: WorkerRecord,
        least_loaded: WorkerRecord | None,
    ) -> bool:
        """Whether queued root ``ts`` should go to ``ws``, where ``sibling`` (the root
        placed just before it) went, rather than to ``least_loaded`` (None: no other
        free worker). ``ws`` is free."""
        latency = self.transfer_latency
        if not latency or not ts.dependents or ts.payload is None:
            return False
        if self._actor_ids and ts.key in self._actor_ids:
            return False  # an actor lives where it was made: placed as before
        duration = self._known_duration(ts)
        if duration is None:
            return False
        if duration + len(ts.payload.data) / BANDWIDTH > latency:
            return False  # not tiny: running it, or receiving its arguments, pays to spread
        if least_loaded is not None:
            ahead_here = ws.occupancy / ws.nthreads
            ahead_there = least_loaded.occupancy / least_loaded.nthreads
            imbalance = ahead_here - ahead_there
            if imbalance > latency:
                return False  # it would start sooner there by more than a transfer costs
            if not _shares_dependent(ts, sibling):
                # ``ts`` starts a new group of siblings: where the group starts, it
                # should end, or its dependent fetches. If the whole group cannot
                # follow here within the latency, it starts on the other worker now.
                budget = latency - imbalance
                if _group_work(ts, duration, budget) > budget:
                    return False
        return related(ts, sibling)


def _shares_dependent(ts: TaskState, other: TaskState) -> bool:
    """``ts`` and ``other`` feed one task directly (siblings), among the first few
    dependents of ``ts``."""
    theirs = other.dependents
    for i, dts in enumerate(ts.dependents):
        if i == NEAR:
            return False
        if dts in theirs:
            return True
    return False


def _group_work(ts: TaskState, duration: float, budget: float) -> float:
    """The expected work of ``ts`` and its siblings still queued (the other inputs of
    its first dependent), each taking ``duration``; counted only until it exceeds
    ``budget``, so a task of wide fan-in costs little."""
    if not ts.dependents:
        return duration
    dts = next(iter(ts.dependents))
    work = 0.0
    for sibling in dts.dependencies:
        if sibling is ts or sibling.state == "queued":
            work += duration
            if work > budget:
                break
    return work


def related(ts: TaskState, other: TaskState) -> bool:
    """``ts`` and ``other`` feed one task: a dependent of both, or of a dependent of
    each (the two levels of a tree reduction: siblings and cousins). Only the first
    few dependents at each level are looked at, so a task of wide fan-out costs little."""
    # Siblings of a reduction tree share their first dependent: no sets to build
    # (NEAR >= 1, so each one's first dependent is in its near set).
    if (
        ts.dependents
        and other.dependents
        and next(iter(ts.dependents)) is next(iter(other.dependents))
    ):
        return True
    mine = _near_dependents(ts)
    return not mine.isdisjoint(_near_dependents(other))


def _near_dependents(ts: TaskState) -> set[TaskState]:
    near: set[TaskState] = set()
    for i, dts in enumerate(ts.dependents):
        if i == NEAR:
            break
        near.add(dts)
        for j, gts in enumerate(dts.dependents):
            if j == NEAR:
                break
            near.add(gts)
    return near
