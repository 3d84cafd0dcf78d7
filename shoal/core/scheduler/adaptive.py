"""The adaptive policy: how many workers the outstanding work needs. Pure: the
scheduler hands it a :class:`Snapshot` and the time; it never sees tasks one by one.

- The work is the queued and processing tasks of each task prefix times that prefix's
  measured mean duration (``default_task_duration`` for a prefix never measured). The
  threads that would finish it in about ``target_duration`` are ``ceil(work /
  target_duration)``, but never more than there are tasks (a few long tasks do not ask
  for many threads); workers are threads over the threads per worker.
- Each paused or spilling worker (process memory over ``memory_target_fraction`` of its
  limit) asks for one worker more than there are.
- The proposal is clamped to ``[minimum, maximum]``. More workers are asked for at once;
  fewer only after ``wait_count`` lower proposals in a row, and then the largest of
  those (so a constant proposal is reached exactly, and a falling one never
  undershoots what the last ``wait_count`` looks asked for).

Per call the cost is O(prefixes with work + workers), whatever the number of tasks.
Which workers to close is the scheduler's (``SchedulerState.workers_to_close``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TARGET_DURATION = 5.0
DEFAULT_WAIT_COUNT = 3
DEFAULT_TASK_DURATION = 0.5  # seconds for a prefix never measured (as Dask)
DEFAULT_MEMORY_TARGET_FRACTION = 0.6  # past this much of its limit a worker spills


@dataclass(frozen=True, slots=True)
class PrefixLoad:
    """The outstanding tasks of one prefix."""

    name: str
    tasks: int  # queued + processing
    mean_duration: float | None  # None: never measured


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What the policy needs of one worker."""

    name: str
    nthreads: int
    processing: int = 0
    nbytes: int = 0  # results it holds
    memory: int = 0  # process memory at its last heartbeat
    memory_limit: int = 0  # 0: none
    paused: bool = False
    retiring: bool = False  # already leaving: not counted


@dataclass(frozen=True, slots=True)
class Snapshot:
    prefixes: Sequence[PrefixLoad]
    workers: Sequence[WorkerLoad]
    launching: int = 0  # workers started and not yet joined: they count as there
    threads_per_worker: int = 1  # of a worker yet to start, while none has joined


@dataclass(frozen=True, slots=True)
class Decision:
    time: float
    action: str  # "up", "down", "wait" (lower, but not yet wait_count times), "same"
    current: int  # workers there or starting, less those retiring
    proposed: int  # what the work asks for, before clamping
    target: int  # what to scale to now
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def as_event(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "current": self.current,
            "proposed": self.proposed,
            "target": self.target,
            "reason": self.reason,
            **self.numbers,
        }


class AdaptivePolicy:
    """Target numbers of workers, remembering the lower proposals in a row."""

    def __init__(
        self,
        minimum: int = 0,
        maximum: int | None = None,
        target_duration: float = DEFAULT_TARGET_DURATION,
        wait_count: int = DEFAULT_WAIT_COUNT,
        default_task_duration: float = DEFAULT_TASK_DURATION,
        memory_target_fraction: float = DEFAULT_MEMORY_TARGET_FRACTION,
    ):
        check_limits(minimum, maximum)
        if not _finite(target_duration) or target_duration <= 0:
            raise ValueError(f"target_duration must be > 0 seconds, not {target_duration!r}")
        if isinstance(wait_count, bool) or not isinstance(wait_count, int) or wait_count < 1:
            raise ValueError(f"wait_count must be an integer >= 1, not {wait_count!r}")
        if not _finite(default_task_duration) or default_task_duration < 0:
            raise ValueError(
                f"default_task_duration must be >= 0 seconds, not {default_task_duration!r}"
            )
        if not _finite(memory_target_fraction) or not 0 < memory_target_fraction <= 1:
            raise ValueError(
                f"memory_target_fraction must be in (0, 1], not {memory_target_fraction!r}"
            )
        self.minimum = minimum
        self.maximum = maximum
        self.target_duration = float(target_duration)
        self.wait_count = wait_count
        self.default_task_duration = float(default_task_duration)
        self.memory_target_fraction = float(memory_target_fraction)
        self.lower: list[int] = []  # the lower proposals in a row, the latest last

    def same_settings(self, other: AdaptivePolicy) -> bool:
        return self.settings() == other.settings()

    def settings(self) -> tuple[Any, ...]:
        return (
            self.minimum,
            self.maximum,
            self.target_duration,
            self.wait_count,
            self.default_task_duration,
            self.memory_target_fraction,
        )

    def clamp(self, n: int) -> int:
        n = max(n, self.minimum)
        return n if self.maximum is None else min(n, self.maximum)

    def recommend(self, snapshot: Snapshot, now: float) -> Decision:
        tasks = 0
        work = 0.0
        unmeasured = 0
        for p in snapshot.prefixes:
            if p.tasks <= 0:
                continue
            tasks += p.tasks
            if p.mean_duration is None:
                unmeasured += p.tasks
                work += p.tasks * self.default_task_duration
            else:
                work += p.tasks * p.mean_duration
        threads = math.ceil(work / self.target_duration) if work > 0 else 0
        threads = min(threads, tasks)  # a few long tasks: one thread each, no more
        if tasks and not threads:
            threads = 1  # instant tasks still need somewhere to run
        staying = [w for w in snapshot.workers if not w.retiring]
        if staying:
            per_worker = sum(w.nthreads for w in staying) / len(staying)
        else:
            per_worker = max(1, snapshot.threads_per_worker)
        for_work = math.ceil(threads / per_worker) if threads else 0
        pressed = [w.name for w in staying if self._under_pressure(w)]
        current = len(staying) + snapshot.launching
        for_memory = current + len(pressed) if pressed else 0
        proposed = max(for_work, for_memory)
        target = self.clamp(proposed)
        numbers: dict[str, Any] = {
            "tasks": tasks,
            "unmeasured_tasks": unmeasured,
            "work_seconds": round(work, 3),
            "threads_needed": threads,
            "threads_per_worker": round(per_worker, 3),
            "for_work": for_work,
            "memory_pressure": pressed,
            "for_memory": for_memory,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "target_duration": self.target_duration,
            "launching": snapshot.launching,
        }
        why = self._explain(numbers, proposed, target)
        if target > current:
            self.lower.clear()
            action = "up"
        elif target == current:
            self.lower.clear()
            action = "same"
        else:
            self.lower.append(target)
            del self.lower[: -self.wait_count]
            numbers["lower_in_a_row"] = len(self.lower)
            numbers["wait_count"] = self.wait_count
            if len(self.lower) < self.wait_count:
                action = "wait"
                why += (
                    f"; lower {len(self.lower)} of {self.wait_count} times in a row: keep {current}"
                )
                target = current
            else:
                action = "down"
                target = max(self.lower)
                why += f"; lower {self.wait_count} times in a row: down to {target}"
                self.lower.clear()
        why = f"{action}: {why} (have {current})"
        return Decision(now, action, current, proposed, target, why, numbers)

    def _under_pressure(self, w: WorkerLoad) -> bool:
        if w.paused:
            return True
        return bool(w.memory_limit) and w.memory > self.memory_target_fraction * w.memory_limit

    def _explain(self, n: dict[str, Any], proposed: int, target: int) -> str:
        parts = [
            f"{n['tasks']} tasks ({n['work_seconds']:g}s of work"
            + (
                f", {n['unmeasured_tasks']} at the default duration"
                if n["unmeasured_tasks"]
                else ""
            )
            + f") need {n['threads_needed']} threads to finish in {self.target_duration:g}s"
            + f": {n['for_work']} workers"
        ]
        if n["memory_pressure"]:
            parts.append(
                f"{len(n['memory_pressure'])} paused or spilling workers ask for {n['for_memory']}"
            )
        text = "; ".join(parts)
        if target != proposed:
            text += f"; {proposed} clamped to [{self.minimum}, {_show(self.maximum)}]: {target}"
        return text


def check_limits(minimum: int, maximum: int | None) -> None:
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise ValueError(f"minimum must be an integer >= 0, not {minimum!r}")
    if maximum is not None:
        if isinstance(maximum, bool) or not isinstance(maximum, int) or maximum < 0:
            raise ValueError(f"maximum must be an integer >= 0 or None, not {maximum!r}")
        if minimum > maximum:
            raise ValueError(f"minimum ({minimum}) must not exceed maximum ({maximum})")


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _show(maximum: int | None) -> str:
    return "no maximum" if maximum is None else str(maximum)
