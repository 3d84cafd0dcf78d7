"""Which worker runs a task: the placement half of :class:`SchedulerState`.

A mixin, so that its methods keep their names and share the scheduler's records:

- a task with dependencies goes where most of their bytes already are, ties to the
  least loaded worker (``_decide_worker``);
- root tasks wait in a queue and go out, best priority first, to workers with a free
  slot (``_schedule_queued``), so no worker is flooded;
- ``_add_processing``/``_remove_processing`` keep each worker's processing set,
  occupancy and the set of free workers in step.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from shoal.core.scheduler_model import TaskState, WorkerRecord
from shoal.core.story import StoryLog

QUEUE_HORIZON = 0.02  # seconds of expected work a worker may hold beyond its slots
MAX_PER_THREAD = 1000  # hard cap on tasks processing per thread
BANDWIDTH = 100e6  # bytes/s assumed for moving a dependency between workers


class Placement:
    """Placement methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    workers: dict[str, WorkerRecord]
    log: StoryLog
    transition_counter: int

    if TYPE_CHECKING:

        def _transition_queued_processing(
            self, ts: TaskState, stimulus_id: str, ws: WorkerRecord | None = None
        ) -> dict[TaskState, str]: ...

    def _init_placement(self) -> None:
        self.queue: list[tuple[tuple[int, ...], TaskState]] = []  # root tasks, lazily pruned
        self.nqueued = 0
        self.free_workers: set[WorkerRecord] = set()  # workers that may take queued tasks

    def _is_free(self, ws: WorkerRecord) -> bool:
        n = len(ws.processing)
        if n < ws.min_slots:
            return True
        return ws.occupancy < ws.nthreads * QUEUE_HORIZON and n < ws.nthreads * MAX_PER_THREAD

    def _add_processing(self, ts: TaskState, ws: WorkerRecord) -> None:
        ts.processing_on = ws
        ws.processing.add(ts)
        ts.estimate = est = ts.prefix.mean_duration
        ws.occupancy += est
        if not self._is_free(ws):
            self.free_workers.discard(ws)

    def _remove_processing(self, ts: TaskState) -> WorkerRecord | None:
        ws = ts.processing_on
        if ws is None:
            return None
        ts.processing_on = None
        ws.processing.discard(ts)
        ws.occupancy -= ts.estimate
        if not ws.processing:
            ws.occupancy = 0.0  # no drift from float sums
        if ws.address in self.workers and self._is_free(ws):
            self.free_workers.add(ws)
        return ws

    def _decide_worker(self, ts: TaskState) -> WorkerRecord | None:
        """Where the most dependency bytes already are; ties go to the least loaded.
        Idle workers compete too, paying for the bytes they would have to fetch."""
        if not self.workers:
            return None
        local: dict[WorkerRecord, int] = {}
        total = 0
        for dts in ts.dependencies:
            nbytes = dts.nbytes
            total += nbytes
            for ws in dts.who_has:
                local[ws] = local.get(ws, 0) + nbytes
        candidates = set(local)
        candidates.update(self.free_workers)
        if not candidates:
            candidates = set(self.workers.values())
        best = None
        best_cost: tuple[float, int, str] | None = None
        for ws in candidates:
            have = local.get(ws, 0)
            cost = (
                (total - have) / BANDWIDTH + ws.occupancy / ws.nthreads,
                -have,
                ws.address,
            )
            if best_cost is None or cost < best_cost:
                best, best_cost = ws, cost
        return best

    def _schedule_queued(self, stimulus_id: str) -> None:
        """Hand root tasks from the queue to workers with free capacity, best first."""
        queue = self.queue
        # One task at a time to the least loaded free worker, so idle threads on other
        # workers are used before any worker gets its extra slot.
        free = [(len(w.processing) / w.nthreads, w.address, w) for w in self.free_workers]
        heapq.heapify(free)
        while queue and free:
            _, ts = heapq.heappop(queue)
            if ts.state != "queued":
                continue  # released while queued: a stale entry
            ws = heapq.heappop(free)[2]
            self.nqueued -= 1
            self.log.append((ts.key, "queued", "processing", stimulus_id))
            self.transition_counter += 1
            self._transition_queued_processing(ts, stimulus_id, ws=ws)
            if self._is_free(ws):
                heapq.heappush(free, (len(ws.processing) / ws.nthreads, ws.address, ws))
