"""The worker state machine's invariants, checked after every batch of events when
``validate=True`` (always in tests)."""

from __future__ import annotations

from typing import Any

from shoal.core.story import InvalidState
from shoal.core.worker.state import SLACK, STATES, WorkerState


def _check(ok: Any, what: str) -> None:
    if not ok:
        raise InvalidState(what)


def validate_worker_state(state: WorkerState) -> None:
    """Every invariant of a worker's tasks; raises InvalidState on the first one broken."""
    tasks, executing = state.tasks, state._executing
    seceded, rejoining = state._seceded, state._rejoining
    # every running thread's task, counted or not; each in exactly one of the three
    threads = [*executing, *seceded, *rejoining]
    _check(len(threads) == len(set(threads)), "a task both counted and seceded")
    running_tasks = set(threads)
    interrupted = state._interrupted  # never taken over again: see release.py
    for ts, n in state._drains.items():  # answers owed for threads still counted
        _check(n > 0 and ts in executing, f"{ts!r}: {n} ComputeReleased owed")
    ids = list(interrupted.values())
    _check(len(set(ids)) == len(ids) and all(0 < i <= state._interrupt_ids for i in ids), "ids")
    _check(state._rejoined <= executing, "a rejoined task not counted")
    for ts in interrupted:
        _check(ts in running_tasks, f"{ts!r} interrupted but not running")
    _check(not state._to_release, "releases left pending")
    live, live_constrained = (
        {seq for _, seq, ts in heap if ts.state == "ready" and ts.ready_seq == seq}
        for heap in (state._ready, state._constrained)
    )
    n_ready = n_memory = 0
    for key, ts in tasks.items():
        st, where = ts.state, repr(ts)
        _check(ts.key == key and st in STATES, where)
        for dep in ts.dependencies:
            _check(tasks.get(dep.key) is dep and ts in dep.dependents, f"{where}: {dep!r}")
        for dep in ts.dependents:
            _check(tasks.get(dep.key) is dep and ts in dep.dependencies, f"{where}: {dep!r}")
        waiting = {d for d in ts.dependencies if d.state != "memory"}
        _check(ts.waiting_for_data == waiting, f"{where}: waiting_for_data")
        running = st == "executing" or (st == "cancelled" and ts.previous == "executing")
        _check(not ts.dependencies or running or st in ("waiting", "ready"), where)
        _check(running <= (ts in running_tasks) <= (running or st == "memory"), where)
        for w in ts.who_has:
            _check(w != state.address and ts in state._has_what.get(w, ()), f"{where}: {w}")
        _check((key in state.data) == (st == "memory"), f"{where}: data")
        _check(st == "cancelled" or ts.wanted or ts.dependents, f"{where}: unwanted")
        if st == "cancelled" and ts in interrupted:  # only a ComputeTask wants it again
            _check(ts.wanted == (ts.resume is not None), f"{where}: wanted")
        _check(st == "cancelled" or ts.previous is None, f"{where}: previous")
        _check(st in ("flight", "cancelled") or ts.coming_from is None, where)
        # resume: the ComputeTask to run if a transfer fails / once an interrupted run ends
        resumable = st == "flight" or (st == "cancelled" and ts in interrupted)
        _check(ts.resume is None or (resumable and ts.wanted), f"{where}: resume")
        _check(st not in ("waiting", "ready") or ts.run_spec is not None, where)
        if st == "waiting":
            _check(ts.waiting_for_data, f"{where}: waiting for nothing")
        elif st == "ready":
            n_ready += 1
            heap_live = live if ts.resources is None else live_constrained
            _check(ts.ready_seq in heap_live, f"{where}: not in its ready heap")
        elif st == "fetch":
            _check(ts.who_has and (ts.dependents or ts.wanted), where)  # wanted: a copy
            for w in ts.who_has:
                _check(ts in state._data_needed.get(w, ()), f"{where}: data_needed")
        elif st == "flight" or (st == "cancelled" and ts.previous == "flight"):
            src = ts.coming_from or ""
            _check(any(t is ts for t in state._in_flight.get(src, ())), f"{where}: flight")
            _check(st == "cancelled" or ts.dependents or ts.wanted, where)
        elif st == "memory":
            n_memory += 1
            _check(not ts.who_has, f"{where}: who_has")
        elif st == "released":
            _check(ts.dependents and not ts.wanted and not ts.who_has, f"{where}: stub")
        elif st == "cancelled":
            _check(ts.previous in ("executing", "flight"), f"{where}: previous")
            # an interrupted run is not taken over: what needs the key waits for its end
            _check(ts in interrupted or not (ts.dependents or ts.wanted), f"{where}: needed")
    _check(n_memory == len(state.data), "data holds keys not in memory")
    scanned: dict[str, int] = {}
    for ts in tasks.values():
        scanned[ts.state] = scanned.get(ts.state, 0) + 1
    _check(state.task_counts() == scanned, f"task_counts {state.task_counts()} != {scanned}")
    _check(n_ready == state._n_ready, f"ready count {state._n_ready} != {n_ready}")
    for ts in running_tasks:
        _check(tasks.get(ts.key) is ts, f"executing {ts!r} not in tasks")
    for index in (state._has_what, state._data_needed):
        for w, holders in index.items():
            _check(holders, f"empty index entry {w}")
            for ts in holders:
                _check(tasks.get(ts.key) is ts and w in ts.who_has, f"{w}: {ts!r}")
    for w, needed in state._data_needed.items():
        _check(all(ts.state == "fetch" for ts in needed), f"data_needed[{w}]")
    _check(len(state._in_flight) <= state.transfer_limit, "too many transfers")
    _check(state._in_flight_bytes.keys() == state._in_flight.keys(), "bytes in flight by peer")
    # (no upper bound on executions: the limit shrinks when tasks get slower)
    held = dict.fromkeys(state.total_resources, 0.0)
    for ts in running_tasks:  # a seceded task keeps what it holds
        for resource, need in (ts.resources or {}).items():
            held[resource] = held.get(resource, 0.0) + need
    free = state.available_resources
    for resource, total in state.total_resources.items():
        _check(abs(free[resource] - (total - held[resource])) < 1e-6, f"{resource} in use")
    _check(held.keys() == state.total_resources.keys(), f"held {held} undeclared")
    _check(all(v >= -SLACK for v in free.values()), f"more resources in use than we have: {free}")
    entries = [e for e in state._constrained if e[1] in live_constrained]
    startable = bool(live) or bool(entries and state._fits(min(entries)[2]))
    paused = state.paused  # a paused worker starts nothing and fetches nothing
    full = len(executing) >= state.execution_limit
    _check(len(executing) >= state.nthreads or not rejoining, "a rejoining task waits idly")
    _check(paused or full or rejoining or not startable, "an idle thread")
    idle = [w for w in state._data_needed if w not in state._in_flight]
    _check(
        paused
        or len(state._in_flight) == state.transfer_limit
        or state._incoming_full()
        or not idle,
        f"idle slot: {idle}",
    )
