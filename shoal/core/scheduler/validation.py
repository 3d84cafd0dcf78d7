"""The scheduler's invariants, checked after every batch of events when
``validate=True`` (always in tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shoal.core.scheduler.model import FINISHED, SMALL, TaskState, min_slots
from shoal.core.scheduler.placement import SLACK, Restrictions
from shoal.core.story import InvalidState

if TYPE_CHECKING:
    from shoal.core.scheduler.progress import ProgressWatch
    from shoal.core.scheduler.state import SchedulerState


def validate_scheduler_state(state: SchedulerState) -> None:
    """Every invariant of the scheduler's records; raises InvalidState naming the
    first one broken, with the key's recent story."""

    def check(cond: bool, what: str, ts: TaskState | None = None) -> None:
        if not cond:
            story = state.log.story(ts.key)[-10:] if ts is not None else []
            raise InvalidState(f"{what}: {ts!r}\n{story}")

    long_deps: dict[TaskState, set[TaskState]] = {}

    def depends_on(ts: TaskState, dts: TaskState) -> bool:
        deps = ts.dependencies
        if len(deps) < 32:
            return dts in deps
        found = long_deps.get(ts)  # a long tuple is scanned once, not once per dependency
        if found is None:
            found = long_deps[ts] = set(deps)
        return dts in found

    counts: dict[str, dict[str, int]] = {}
    nqueued = 0
    # Tasks of graphs still arriving in parts wait, released, for the rest.
    arriving = {
        ts for cs in state.clients.values() if cs.partial for part in cs.partial for ts in part
    }
    restricted: dict[Restrictions, list[TaskState]] = {}  # queued tasks by restrictions
    for key, ts in state.tasks.items():
        check(ts.key == key, "task filed under another key", ts)
        st = ts.state
        check(st != "forgotten", "forgotten task still held", ts)
        c = counts.setdefault(ts.group.name, {})
        c[st] = c.get(st, 0) + 1
        deps = ts.dependencies
        check(type(deps) is tuple, "dependencies not a tuple", ts)
        if len(deps) > 1:
            check(len(set(deps)) == len(deps), "a dependency listed twice", ts)
        for members in (ts.dependents, ts.waiting_on, ts.waiters, ts.who_wants, ts.who_has):
            if type(members) is tuple:
                n = len(members)
                check(n <= SMALL, "a tuple of members past SMALL", ts)
                check(n < 2 or len(set(members)) == n, "a member listed twice", ts)
            else:
                ok = type(members) is set and bool(members)
                check(ok, "members neither a tuple nor a non-empty set", ts)
        for dts in ts.dependencies:
            check(ts in dts.dependents, "dependency does not list its dependent", ts)
            check(dts.key in state.tasks, "dependency was forgotten", ts)
        for dts in ts.dependents:
            check(depends_on(dts, ts), "dependent does not list its dependency", ts)
        for dts in ts.waiters:
            check(depends_on(dts, ts), "waiter is not a dependent", ts)
            check(dts.state in ("waiting", "queued", "processing"), "idle waiter", dts)
        if st in ("waiting", "queued", "processing"):
            for dts in ts.dependencies:
                check(ts in dts.waiters, "dependency does not know it is needed", ts)
        check((ts.processing_on is not None) == (st == "processing"), "processing_on", ts)
        if st == "processing":
            assert ts.processing_on is not None
            check(ts in ts.processing_on.processing, "not in its worker's processing", ts)
            check(ts.processing_on.address in state.workers, "processing on a gone worker", ts)
            r = ts.restrictions
            if r is not None:
                ws = ts.processing_on
                check(r.capable(ws), "processing on a worker without its resources", ts)
                check(
                    r.loose or not r.workers or r.matches(ws),
                    "processing on a worker not named",
                    ts,
                )
        if st == "queued":
            check(all(d.state == "memory" for d in ts.dependencies), "dependency missing", ts)
        if st == "processing":
            # sent ahead (core/scheduler/ahead.py): what it waits on computes on its
            # worker, for real (not ahead itself)
            for dts in ts.waiting_on:
                check(dts.state == "processing", "waits ahead on a task not processing", ts)
                check(dts.processing_on is ts.processing_on, "waits ahead on another worker", ts)
                check(not dts.waiting_on, "waits ahead on a task waiting ahead", ts)
            assert ts.processing_on is not None
            check((ts in ts.processing_on.ahead) == bool(ts.waiting_on), "ahead set", ts)
        if st == "waiting" or st == "processing":
            check(st == "processing" or bool(ts.waiting_on), "waiting on nothing", ts)
            for dts in ts.dependencies:
                check((dts in ts.waiting_on) == (dts.state != "memory"), "waiting_on", ts)
        else:
            check(not ts.waiting_on, "waiting_on outside waiting", ts)
        check(bool(ts.who_has) == (st == "memory"), "who_has vs memory", ts)
        for ws in ts.who_has:
            check(ts in ws.has_what, "holder does not list the key", ts)
            check(ws.address in state.workers, "held by a gone worker", ts)
        if st == "erred":
            check(ts.exception is not None, "no error to report", ts)
        if st == "queued":
            if ts.restrictions is None:
                nqueued += 1
            else:
                restricted.setdefault(ts.restrictions, []).append(ts)
        for cs in ts.who_wants:
            known = cs.id in state.clients or cs is state.coordination_holder
            check(ts in cs.wants and known, "who_wants vs client", ts)
        if st in ("released", "erred") and not ts.dependents:
            check(
                bool(ts.who_wants or ts.waiters) or st == "erred" or ts in arriving,
                "released task should be forgotten",
                ts,
            )
    check(nqueued == state.nqueued, f"queue count {state.nqueued} != {nqueued}")
    check(set(state.restricted) == set(restricted), "restrictions listed with queued tasks")
    slotted = sum(len(queued) for r, queued in restricted.items() if r.slotted)
    check(slotted == state.nslotted, f"slotted count {state.nslotted} != {slotted}")
    for r, queued in restricted.items():
        check(r.nqueued == len(queued), f"queue count {r.nqueued} != {len(queued)} of {r}")
        entries = {id(t) for t in r.queue}
        for ts in queued:
            check(
                id(ts) in entries or ts in state.parked,
                "queued task missing from its restrictions' queue",
                ts,
            )
        # Placement runs at the end of every event: a task that could go should have.
        best = min(queued, key=lambda t: t.rank)
        where = state._decide_worker(best)
        check(where is None, f"queued although {where!r} may run it", best)
    totals: dict[str, int] = {}
    for ts in state.tasks.values():
        totals[ts.state] = totals.get(ts.state, 0) + 1
    live = {s: n for s, n in state.task_counts.items() if n and s != "forgotten"}
    check(live == totals, f"task counts {live} != {totals}")
    for name, tg in state.groups.items():
        got = {s: n for s, n in tg.states.items() if n and s != "forgotten"}
        check(got == counts.get(name, {}), f"group {name} counters {got} != {counts.get(name)}")
    for tp in state.prefixes.values():
        check(all(tg.prefix is tp for tg in tp.groups.values()), f"groups of prefix {tp.name}")
        check(all(state.groups.get(n) is tg for n, tg in tp.groups.items()), f"prefix {tp.name}")
        # what placement packs by (core/scheduler/packing.py): known once measured
        measured = tp.duration_count > 0
        check((tp.recent_duration is not None) == measured, f"recent duration of {tp.name}")
    check(sum(tp.ngroups for tp in state.prefixes.values()) == len(state.groups), "groups")
    for cs in state.clients.values():
        for ts in cs.wants:
            check(cs in ts.who_wants and ts.key in state.tasks, "client wants a lost task", ts)
    for ws in state.workers.values():
        for ts in ws.processing:
            check(ts.processing_on is ws, "worker processing a task placed elsewhere", ts)
        check(ws.ahead <= ws.processing, f"ahead tasks not processing on {ws.address}")
        for ts in ws.long_running:  # seceded: still processing, no slot, no estimate
            check(ts in ws.processing and ts.estimate == 0.0, "long-running", ts)
        for ts in ws.has_what:
            check(ws in ts.who_has, "worker holds a key the task does not know", ts)
        check(ws.nbytes == sum(t.nbytes for t in ws.has_what), f"nbytes of {ws.address}")
        check(
            abs(ws.occupancy - sum(t.estimate for t in ws.processing)) < 1e-6,
            f"occupancy of {ws.address}",
        )
        # Threads still running tasks released while they processed here: counted busy.
        check(all(n > 0 for n in ws.draining.values()), f"draining counts of {ws.address}")
        check(ws.ndraining == sum(ws.draining.values()), f"ndraining of {ws.address}")
        threads = max(0, ws.nthreads - ws.ndraining)
        check(ws.slot_threads == threads, f"slot threads of {ws.address}")
        check(ws.min_slots == min_slots(threads), f"min_slots of {ws.address}")
        runnable = ws.status == "running"
        check((ws.address in state.runnable) == runnable, f"runnable: {ws.address} {ws.status}")
        check(
            (ws in state.free_workers) == (runnable and state._is_free(ws)),
            f"free set: {ws.address}",
        )
        check((ws.address in state.retiring) == (ws.status == "retiring"), f"{ws.address} retiring")
        held = dict.fromkeys(ws.resources, 0.0)
        for ts in ws.processing:
            if ts.restrictions is not None:
                for resource, need in ts.restrictions.resources.items():
                    held[resource] = held.get(resource, 0.0) + need
        used = ws.used_resources
        check(
            used.keys() == held.keys() and all(abs(used[k] - held[k]) < 1e-6 for k in held),
            f"resources in use on {ws.address}: {used} != {held} held by its tasks",
        )
        check(
            all(used[k] <= total + SLACK for k, total in ws.resources.items()),
            f"more resources in use on {ws.address} than it has: {used} > {ws.resources}",
        )
        for alias in ws.aliases:
            indexed = ws in state.by_alias.get(alias, ())
            check(indexed == runnable, f"alias {alias} of {ws.address}")
        for resource in ws.resources:
            indexed = ws in state.by_resource.get(resource, ())
            check(indexed == runnable, f"{resource} of {ws.address}")
        if ws.budget is not None:  # walltime: never more tasks than its budget
            check(ws.assigned <= ws.budget, f"{ws.address} given more than its task budget")
    for ts, move in state.moves.items():  # rebalance: a move only while it can finish
        check(move.ts is ts and state.tasks.get(ts.key) is ts, "move of a gone key", ts)
        check(ts.state == "memory" and move.sender in ts.who_has, "move of a lost copy", ts)
        check(move.recipient.address in state.runnable, "move to an unrunnable worker", ts)
        check(move.request.pending > 0, "move of an answered rebalance", ts)
    limited = [
        ws for ws in state.runnable.values() if ws.deadline is not None or ws.budget is not None
    ]
    check(state.nlimited == len(limited), f"nlimited {state.nlimited} != {len(limited)}")
    for ts in state.parked:
        check(ts.state == "queued" and ts.key in state.tasks, "parked task not queued", ts)
    parked: dict[str, int] = {}
    for ts in state.parked:
        parked[ts.prefix.name] = parked.get(ts.prefix.name, 0) + 1
    check(parked == state.parked_prefixes, f"parked prefixes {state.parked_prefixes} != {parked}")
    for name, holders in state.by_alias.items():
        check(all(name in ws.aliases and ws.address in state.runnable for ws in holders), name)
    check(all(state.workers.get(a) is ws for a, ws in state.runnable.items()), "runnable index")
    check(all(ts.key in state.tasks for ts in state.suspicious), "suspicious forgotten task")
    for resource, holders in state.by_resource.items():
        check(all(resource in ws.resources for ws in holders), f"resource index: {resource}")
    _check_watches(state, check)
    _check_pins(state, check)
    _check_lanes(state, check)
    _check_coordination(state, check)
    workers = state.workers.values()
    check(state.total_nbytes == sum(ws.nbytes for ws in workers), "total nbytes")
    check(state.total_threads == sum(ws.nthreads for ws in workers), "total threads")
    check(state.total_memory == sum(ws.memory_limit for ws in workers), "total memory")


def _check_watches(state: SchedulerState, check: Callable[..., None]) -> None:
    """Every open watch is marked on exactly as many unfinished tasks as it waits for."""
    marked: dict[ProgressWatch, int] = {}
    for ts in state.tasks.values():
        for watch in ts.watches:
            check(ts.state not in FINISHED, "a finished task still marked for a watch", ts)
            marked[watch] = marked.get(watch, 0) + 1
    for cs in state.clients.values():
        for watch_id, watch in cs.watches.items():
            what = f"progress watch {cs.id}/{watch_id}"
            check(watch.id == watch_id and watch.client == cs.id and not watch.closed, what)
            check(watch.left == marked.get(watch, 0), f"{what}: {watch.left} left")
            done = sum(c[1] + c[2] for c in watch.counts.values()) + watch.forgotten
            total = sum(c[0] for c in watch.counts.values())
            check(done + watch.left == total, f"{what}: counts {watch.counts}")


def _check_coordination(state: SchedulerState, check: Callable[..., None]) -> None:
    """Every key a primitive holds is wanted by the primitives' holder; no lease or
    subscription outlives its client."""
    holder = state.coordination_holder
    check(
        set(holder.wants) == {state.tasks.get(k) for k in state.coordination.key_refs},
        "keys held by primitives vs the holder's wants",
    )
    for (kind, name), sem in state.coordination.semaphores.items():
        check(len(sem.leases) <= sem.max_leases, f"{kind} {name!r}: too many leases")
        for token, client in sem.leases.items():
            check(client in state.clients, f"{kind} {name!r}: lease {token} outlived {client}")
    for token, sub in state.coordination.subscriptions.items():
        check(sub.client in state.clients, f"subscription {token} outlived {sub.client}")


def _check_pins(state: SchedulerState, check: Callable[..., None]) -> None:
    """Pins and the workers' lists of them agree; no pin holds a gone worker, holds
    none, or outlives its owner."""
    owned: dict[str, set[int]] = {}
    for pin_id, pin in state.pins.items():
        what = f"pin {pin_id} {pin.workers} of {pin.owner}"
        check(pin.id == pin_id and bool(pin.workers), f"{what}: no workers, or misfiled")
        check(len(set(pin.workers)) == len(pin.workers), f"{what}: a worker twice")
        for address in pin.workers:
            ws = state.workers.get(address)
            check(ws is not None, f"{what}: holds a gone worker {address}")
            assert ws is not None
            check(pin_id in ws.pins, f"{what}: {address} does not list it")
        kind, _, ident = pin.owner.partition(":")
        alive = state.pin_owner_kinds.get(kind)
        check(alive is None or alive(ident), f"{what}: outlived its owner")
        check((pin.lease is None) == (pin.expires is None), f"{what}: lease and expiry")
        if pin.expires is not None:
            check(pin.expires >= state._next_pin_expiry, f"{what}: expiry not tracked")
        owned.setdefault(pin.owner, set()).add(pin_id)
    check(owned == state._pins_by_owner, "pins by owner")
    for ws in state.workers.values():
        for pin_id in ws.pins:
            held = state.pins.get(pin_id)
            check(held is not None, f"{ws.address} lists pin {pin_id}, which is gone")
            assert held is not None
            check(ws.address in held.workers, f"{ws.address} lists pin {pin_id}, not holding it")


def _check_lanes(state: SchedulerState, check: Callable[..., None]) -> None:
    """Every lane is on a worker that takes new tasks, held by a connected client (one
    lane per client), filed under both, and none is open while lanes are off."""
    check(state.lanes_enabled or not state.lanes, "a lane open while lanes are off")
    for lane_id, lane in state.lanes.items():
        check(lane.id == lane_id, f"lane {lane_id} filed under another id")
        ws = state.runnable.get(lane.worker)
        check(ws is not None, f"lane {lane_id} on {lane.worker}, which takes no new tasks")
        assert ws is not None
        check(ws.deadline is None and ws.budget is None, f"lane {lane_id} on a limited worker")
        check(lane.client in state.clients, f"lane {lane_id} outlived {lane.client}")
        check(state.lane_of_client.get(lane.client) is lane, f"lane {lane_id} not its client's")
        check(
            state.lanes_of_worker.get(lane.worker, {}).get(lane_id) is lane,
            f"lane {lane_id} not filed under its worker",
        )
    check(
        sum(len(v) for v in state.lanes_of_worker.values()) == len(state.lanes)
        and all(state.lanes_of_worker.values())
        and len(state.lane_of_client) <= len(state.lanes),
        "lane indexes out of step with the lanes",
    )
    for address, closed in state.closed_lanes.items():
        check(address in state.workers, f"closed lanes kept for {address}, which is gone")
        check(bool(closed), f"an empty record of closed lanes for {address}")
        for client_id in closed:
            check(client_id in state.clients, f"a closed lane kept for {client_id}, which left")
