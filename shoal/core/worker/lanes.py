"""Whether a worker takes a client's run under a lane (``shoal/lanes``): a pure rule
over the worker's state and a few facts the shell knows, so that it is decided, and
tested, in one place with no network.

A lane's task runs apart from the state machine, so the rule keeps it off a worker
that has anything else to do, and off one whose tasks someone watches: the scheduler's
tasks never wait behind it nor it behind them, and at most one runs at a time.

A small graph run whole holds one thread for the sum of its tasks' times, where the
scheduler would have spread them over the cluster. So the worker takes one only when
the prefixes' recent durations (``LaneDurations``, and its own runs) add up to at most
``GraphLimits.expected``; a graph with a prefix never measured goes through the
scheduler, which measures it. What the estimate misses is bounded while the graph runs
(:func:`graph_stop_reason`): past ``stop_after`` seconds, or past ``max_bytes`` of
results held at once, the run stops between two tasks and the client submits the
graph through the scheduler (tasks are pure: running some twice changes no result).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from shoal.core.scheduler.model import prefix_name
from shoal.core.worker.state import WorkerState
from shoal.protocol.messages import Key, TaskSpec

GRAPH_TASKS = 64  # at most this many tasks in a graph run by lane


class LaneFacts(NamedTuple):
    """What the shell knows of its worker for these rules. ``running``: lane runs not
    answered yet; ``leaving``: closing or retiring; ``limited``: a lifetime or task
    budget; ``watched``: a worker plugin watches transitions (which a lane's task would
    bypass)."""

    lane: str  # the lane a run names
    lane_open: bool
    running: int
    leaving: bool
    limited: bool
    watched: bool


class GraphLimits(NamedTuple):
    """``shoal.worker.lane-graphs``: how long and how large a graph run by lane may be."""

    expected: float = 0.02  # seconds its prefixes' durations may add up to
    stop_after: float = 0.1  # seconds after which its run stops between two tasks
    max_bytes: int = 256 * 2**20  # results it may hold at once before it stops


def lane_decline_reason(state: WorkerState | None, task: TaskSpec, facts: LaneFacts) -> str:
    """Why the run of ``task`` under ``facts.lane`` is declined; "" if the worker takes
    it."""
    address = state.address if state is not None else ""
    if not facts.lane_open:
        return f"lane {facts.lane} is not open on {address}"
    if task.deps or not _plain(task):
        return "a lane runs only a plain task with no dependencies, retries or restrictions"
    return _worker_reason(state, address, facts)


def graph_decline_reason(
    state: WorkerState | None,
    tasks: list[TaskSpec],
    keys: list[Key],
    durations: Mapping[str, float],
    limits: GraphLimits,
    facts: LaneFacts,
) -> str:
    """Why the run of the graph ``tasks`` (for the values of ``keys``) under
    ``facts.lane`` is declined; "" if the worker takes it. ``durations``: recent seconds
    per task prefix."""
    address = state.address if state is not None else ""
    if not facts.lane_open:
        return f"lane {facts.lane} is not open on {address}"
    if not tasks or len(tasks) > GRAPH_TASKS:
        return f"a lane runs graphs of 1 to {GRAPH_TASKS} tasks, not {len(tasks)}"
    seen: set[Key] = set()
    for task in tasks:
        if not _plain(task):
            return "a lane runs only plain tasks, with no retries or restrictions"
        for dep in task.deps:
            if dep not in seen:
                return f"{task.key!r} depends on {dep!r}, which does not run before it"
        if task.key in seen:
            return f"{task.key!r} appears twice in the graph"
        seen.add(task.key)
    missing = [k for k in keys if k not in seen]
    if missing or not keys:
        return f"the keys asked for are not in the graph: {missing[:3]!r}"
    reason = _worker_reason(state, address, facts)
    if reason:
        return reason
    expected = 0.0
    for task in tasks:
        prefix = task_prefix(task)
        seconds = durations.get(prefix)
        if seconds is None:
            return f"no duration is known for {prefix!r} yet"
        expected += seconds
    if expected > limits.expected:
        return f"the graph is expected to take {expected:.3f}s, past {limits.expected}s"
    return ""


def graph_stop_reason(limits: GraphLimits, elapsed: float, held_bytes: int) -> str:
    """Why a graph's run stops before its next task ("" if it goes on): it has run for
    longer than ``limits.stop_after``, or holds more than ``limits.max_bytes``."""
    if elapsed > limits.stop_after:
        return f"the graph ran past {limits.stop_after}s"
    if held_bytes > limits.max_bytes:
        return f"the graph held {held_bytes} bytes of results, past {limits.max_bytes}"
    return ""


def task_prefix(task: TaskSpec) -> str:
    """The prefix the scheduler counts ``task``'s durations under."""
    return prefix_name(task.group or task.key)


def _plain(task: TaskSpec) -> bool:
    return not (
        task.retries
        or task.restrictions is not None
        or task.shuffle is not None
        or task.duration is not None
        or not task.func
    )


def _worker_reason(state: WorkerState | None, address: str, facts: LaneFacts) -> str:
    if facts.leaving or state is None:
        return f"worker {address} is leaving"
    if facts.limited:
        return f"worker {address} has a lifetime or task budget"
    if state.paused:
        return f"worker {address} is paused"
    if facts.watched:
        return "a worker plugin watches transitions"
    if facts.running:
        return f"worker {address} runs another lane task"
    if state.executing_count or state.seceded_count or state.ready_count:
        return f"worker {address} is busy"
    return ""
