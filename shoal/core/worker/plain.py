"""The worker state machine's shortcut for plain tasks, the bulk of a large graph.

A *plain* ComputeTask is for a key this worker does not know yet, needs no resources,
and has its dependencies (if any) in memory here; a plain ExecuteSuccess ends a
counted execution of such a task while no thread is owed a drain, interrupted or
rejoined. For those the general handlers of :class:`~shoal.core.worker.state.WorkerState`
take many branches that cannot apply (missing dependencies, transfers, resumes, cancelled
runs, resources); these do the same transitions with the same story records, counts
and instructions in one straight pass, and leave every other case to the general
handlers. ``WorkerState.plain_shortcuts = False`` turns them off (the tests compare both).
FreeKeys forgets a result no local task needs without the general release's detour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.core.worker.events import ExecuteSuccess, SendMessage
from shoal.protocol import messages as m
from shoal.protocol.messages import ComputeTask, FreeKeys

if TYPE_CHECKING:
    from shoal.core.worker.state import WorkerState, WTask


def handle_compute(state: WorkerState, ev: ComputeTask) -> None:
    """The ComputeTask handler: the shortcut when ``ev`` is plain, else the general one."""
    if not (state.plain_shortcuts and _compute_plain(state, ev)):
        state._handle_compute(ev)


def handle_execute_success(state: WorkerState, ev: ExecuteSuccess) -> None:
    """The ExecuteSuccess handler: the shortcut when ``ev`` is plain, else the general one."""
    if not (state.plain_shortcuts and _finish_plain(state, ev)):
        state._handle_execute_success(ev)


def handle_free_keys(state: WorkerState, ev: FreeKeys) -> None:
    """The FreeKeys handler: a result no local task needs, and no thread still writes,
    is forgotten at once (as ``_release`` would); any other key as ``_handle_free_keys``."""
    if not state.plain_shortcuts:
        state._handle_free_keys(ev)
        return
    tasks, log, sid = state.tasks, state._log, ev.stimulus_id
    for key in ev.keys:
        ts = tasks.get(key)
        if ts is None:
            continue
        log((key, "FreeKeys", sid))
        ts.wanted = False
        ts.resume = None
        if ts.dependents:
            continue  # kept until its dependents are done
        if ts.state == "memory" and not state._running(ts):
            state._forget_result(ts, sid)
        else:
            state._release(ts, sid)


def _compute_plain(state: WorkerState, ev: ComputeTask) -> bool:
    """``released -> ready`` for a new key whose dependencies are all in memory here, as
    ``_handle_compute`` and ``_link`` do it; False (nothing done) for any other case."""
    key = ev.key
    tasks = state.tasks
    if key in tasks or ev.resources:
        return False
    deps = ev.deps
    local: list[WTask] = []
    for d in deps:
        dts = tasks.get(d.key)
        if dts is None or dts.state != "memory" or d.key == key:
            return False  # to fetch, to wait for, or odd: the general path
        local.append(dts)
    sid = ev.stimulus_id
    state._log((key, "ComputeTask", sid))
    ts = tasks[key] = worker_state.WTask(key)
    ts.run_spec = (ev.func, ev.payload)
    ts.run_id = ev.run_id
    ts.priority = ev.priority
    ts.wanted = True
    if local:
        ts.dependencies = set(local)
        ts.waiting_for_data = set()
        for dts in local:
            if dts.dependents is worker_state._NO_SET:
                dts.dependents = set()
            dts.dependents.add(ts)
    state._record_transition((key, "released", "ready", sid))
    state._transition_released_ready(ts, sid)
    _moved(state, "released", "ready")
    return True


def _finish_plain(state: WorkerState, ev: ExecuteSuccess) -> bool:
    """``executing -> memory`` for a counted execution with nothing else to settle, as
    ``_finished`` and ``_handle_execute_success`` do it; False (nothing done) otherwise."""
    ts = state.tasks.get(ev.key)
    if (
        ts is None
        or ts.state != "executing"
        or ts.resources is not None
        or state._drains
        or state._interrupted
        or state._rejoined
        or ts not in state._executing  # (a seceded execution: the general path)
    ):
        return False
    sid = ev.stimulus_id
    state._log((ev.key, "ExecuteSuccess", sid))
    state._executing.discard(ts)
    state._note_duration(ev.stop - ev.start)
    ts.start = ev.start
    ts.stop = ev.stop
    state._store_result(ev)
    ts.nbytes = ev.nbytes
    ts.type_name = ev.type_name
    state._record_transition((ev.key, "executing", "memory", sid))
    state._transition_released_memory(ts, sid)
    _moved(state, "executing", "memory")
    if ts.wanted:
        msg = m.TaskFinished(
            ev.key, ev.nbytes, ev.start, ev.stop, ev.inline, ev.type_name, sid, ts.run_id
        )
        state._out.append(SendMessage(msg, sid))
    return True


def _moved(state: WorkerState, start: str, finish: str) -> None:
    """What ``WorkerState._transition`` counts for one move."""
    moves = state._moves
    moves[start] = moves.get(start, 0) - 1
    moves[finish] = moves.get(finish, 0) + 1


# Last: state.py imports this module for its handler table, and this one needs WTask.
from shoal.core.worker import state as worker_state  # noqa: E402
