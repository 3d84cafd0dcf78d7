"""A worker's walltime: its lifetime (``--lifetime``, ``--lifetime-stagger``) and task
budget (``--max-tasks``), as Dask's ``--lifetime`` and the "at most N tasks per worker"
of distributed#8491.

The worker tells the scheduler its *remaining* lifetime and budget in its Hello (clocks
differ between hosts); the scheduler places no task that would not finish in time and
never gives it more tasks than its budget (``shoal.core.scheduler.walltime``). Here the
worker only keeps count and leaves when its time is up or its budget is spent and
nothing of it runs any more: gracefully (``Worker.leave``: its results are copied to
other workers first, nothing counts as a failure), to be restarted afresh by its nanny
with ``--lifetime-restart``. A task sent beyond the budget (which the scheduler never
does) is not started: the worker leaves, and the scheduler places that task elsewhere.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.core.worker.state import WorkerState
    from shoal.protocol import messages as m
    from shoal.server.worker import Worker

logger = logging.getLogger("shoal.worker")

MIN_LIFETIME = 1.0  # seconds: a stagger never makes a lifetime shorter than this
# Worker task states in which a task sent to compute here has not ended yet.
_COMPUTING = frozenset(("waiting", "ready", "executing", "cancelled"))


class Lifetime:
    """One worker process's lifetime and task budget (both optional)."""

    __slots__ = ("seconds", "restart", "max_tasks", "assigned", "started")

    def __init__(
        self,
        lifetime: float | None = None,
        stagger: float = 0.0,
        restart: bool = False,
        max_tasks: int | None = None,
        rng: random.Random | None = None,
    ):
        if lifetime is not None and not lifetime > 0:
            raise ValueError(f"lifetime must be > 0 seconds, not {lifetime!r}")
        if not stagger >= 0:
            raise ValueError(f"lifetime_stagger must be >= 0 seconds, not {stagger!r}")
        if max_tasks is not None and max_tasks < 1:
            raise ValueError(f"max_tasks must be at least 1, not {max_tasks!r}")
        if lifetime is not None and stagger:
            # as Dask: spread the ends of workers started together over +-stagger
            draw = (rng or random).uniform(-1.0, 1.0)
            lifetime = max(MIN_LIFETIME, lifetime + draw * stagger)
        self.seconds = lifetime  # this process's lifetime, staggered; None: unlimited
        self.restart = restart
        self.max_tasks = max_tasks  # None: unlimited
        self.assigned = 0  # ComputeTasks accepted (as the scheduler counts assignments)
        self.started = 0.0  # monotonic time the lifetime runs from (set by ``start``)

    @property
    def limited(self) -> bool:
        return self.seconds is not None or self.max_tasks is not None

    def start(self, now: float) -> None:
        self.started = now

    def remaining(self, now: float) -> float | None:
        """Seconds left at ``now`` (monotonic), or None without a lifetime."""
        if self.seconds is None:
            return None
        return max(0.0, self.started + self.seconds - now)

    def accept(self) -> bool:
        """One more ComputeTask arrived: False if it is beyond the budget (not run)."""
        if self.max_tasks is not None and self.assigned >= self.max_tasks:
            return False
        self.assigned += 1
        return True

    @property
    def budget_spent(self) -> bool:
        return self.max_tasks is not None and self.assigned >= self.max_tasks


def computing(state: WorkerState) -> bool:
    """A task sent to compute here has not ended yet (it waits, runs, or its thread still
    runs after a cancel). Only asked once the budget is spent: a scan is fine."""
    if state.executing_count or state.seceded_count or state.ready_count:
        return True
    return any(ts.state in _COMPUTING or ts.resume is not None for ts in state.tasks.values())


# --- what the worker server does about it (kept here, out of worker.py) -----------------


def end_of_life(worker: Worker, reason: str) -> None:
    """Time is up or the budget spent: retire gracefully (results copied off first,
    waiting for another worker to take them: ``walltime``); with --lifetime-restart,
    exit for the nanny to start afresh."""
    if not worker._closed.is_set() and not worker.leaving:
        logger.info("worker %s: %s", worker.address, reason)
        leave = worker.leave(reason, retire=True, restart=worker.lifetime.restart, walltime=True)
        worker._spawn(leave)


def check_budget(worker: Worker) -> None:
    """(The budget is spent.) Once every task of it has ended here, leave."""
    assert worker.state is not None
    if not worker.leaving and not computing(worker.state):
        end_of_life(worker, f"it ran its {worker.lifetime.max_tasks} tasks (--max-tasks)")


def refuse(worker: Worker, msg: m.ComputeTask) -> None:
    """A task beyond the budget (the scheduler never sends one): not run; the worker
    leaves, and the scheduler then places the task elsewhere."""
    budget = worker.lifetime.max_tasks
    logger.warning(
        "worker %s refuses task %r: beyond its budget of %s tasks", worker.address, msg.key, budget
    )
    end_of_life(worker, f"it was sent more than its {budget} tasks")
