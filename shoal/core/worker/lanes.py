"""Whether a worker takes a client's run under a lane (``shoal/lanes``): a pure rule
over the worker's state and a few facts the shell knows, so that it is decided, and
tested, in one place with no network.

A lane's task runs apart from the state machine, so the rule keeps it off a worker
that has anything else to do, and off one whose tasks someone watches: the scheduler's
tasks never wait behind it nor it behind them, and at most one runs at a time.
"""

from __future__ import annotations

from shoal.core.worker.state import WorkerState
from shoal.protocol.messages import TaskSpec


def lane_decline_reason(
    state: WorkerState | None,
    task: TaskSpec,
    *,
    lane: str,
    lane_open: bool,
    running: int,
    leaving: bool,
    limited: bool,
    watched: bool,
) -> str:
    """Why the run of ``task`` under ``lane`` is declined; "" if the worker takes it.
    ``running``: lane runs not answered yet; ``leaving``: closing or retiring;
    ``limited``: a lifetime or task budget; ``watched``: a worker plugin watches
    transitions (which a lane's task would bypass)."""
    address = state.address if state is not None else ""
    if not lane_open:
        return f"lane {lane} is not open on {address}"
    if (
        task.deps
        or task.retries
        or task.restrictions is not None
        or task.shuffle is not None
        or task.duration is not None
        or not task.func
    ):
        return "a lane runs only a plain task with no dependencies, retries or restrictions"
    if leaving or state is None:
        return f"worker {address} is leaving"
    if limited:
        return f"worker {address} has a lifetime or task budget"
    if state.paused:
        return f"worker {address} is paused"
    if watched:
        return "a worker plugin watches transitions"
    if running:
        return f"worker {address} runs another lane task"
    if state.executing_count or state.seceded_count or state.ready_count:
        return f"worker {address} is busy"
    return ""
