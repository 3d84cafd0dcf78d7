"""Scale and adapt, as the scheduler decides them: a mixin of
:class:`~shoal.core.scheduler.SchedulerState`, as membership and placement are.

A cluster sends ``ScaleRequest`` with the names of the workers it runs (joined or still
starting), and either a number (``scale(n)``) or the adaptive policy's settings. The
core counts the cluster's workers (those retiring are leaving already: not counted
again), asks the policy (:mod:`shoal.core.scheduler.adaptive`) for a target, and carries it out:

- up: first cancel retirements that scaling started and that are not done (those
  workers go back to work), then tell the cluster how many workers to start;
- down: first the cluster's workers that have not joined yet (the cluster stops them),
  then ``workers_to_close``: idle ones first, then those holding the least data; never
  a pinned worker nor one already retiring, and never so many that the data they hold
  would have nowhere to go. Those are retired (data copied first, nothing counted as
  a failure) and close themselves.

Every decision and what was done goes to the ``"adaptive"`` event log with its reason.
Per request the cost is O(prefixes + workers), whatever the number of tasks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.comm import Comm
from shoal.core.scheduler.adaptive import (
    AdaptivePolicy,
    Decision,
    PrefixLoad,
    Snapshot,
    WorkerLoad,
)
from shoal.core.scheduler.model import ClientRecord, TaskPrefix, WorkerRecord
from shoal.protocol import messages as m

EVENT_TOPIC = "adaptive"


class AdaptiveSession:
    """One client's adaptive loop, as the core remembers it between requests."""

    __slots__ = ("name", "policy", "last_logged")

    def __init__(self, name: str, policy: AdaptivePolicy):
        self.name = name
        self.policy = policy
        self.last_logged: tuple[str, int, int] | None = None  # (action, current, target)


class Scaling:
    """``ScaleRequest`` and ``workers_to_close``."""

    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]
    prefixes: dict[str, TaskPrefix]
    clients: dict[str, ClientRecord]
    retiring: dict[str, Any]
    scaling_down: dict[str, str]
    comm: Comm

    wall_time: float

    if TYPE_CHECKING:

        def retire_for_scaling(self, workers: Iterable[WorkerRecord], stimulus_id: str) -> None: ...
        def cancel_retirement(self, address: str, stimulus_id: str) -> bool: ...
        def log_event(self, topic: str, data: dict[str, Any]) -> None: ...
        def is_pinned(self, address: str) -> bool: ...

    def _init_scaling(self) -> None:
        self.adaptive_sessions: dict[str, AdaptiveSession] = {}  # client id -> its loop
        # Per client: names of its workers scaling closed (or told it to stop) that it
        # still lists (their processes are exiting): neither counted nor starting.
        self.scaled_away: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ choosing

    def workers_to_close(
        self, n: int, among: Iterable[WorkerRecord] | None = None
    ) -> list[WorkerRecord]:
        """Up to ``n`` workers (of ``among``, default all) that may be retired: idle
        ones first, then those holding the least data, the newest first among equals.
        Never a pinned or retiring worker; and only while the running workers that
        stay have memory for the data the closed ones hold (their ``nbytes``, an upper
        bound of what must be copied), with at least one staying to take it."""
        if n <= 0:
            return []
        pool = list(self.workers.values() if among is None else among)
        order = {ws.address: i for i, ws in enumerate(self.workers.values())}
        candidates = [
            ws
            for ws in pool
            if ws.status != "retiring"
            and self.workers.get(ws.address) is ws
            and not self.is_pinned(ws.address)
        ]
        candidates.sort(key=lambda ws: (bool(ws.processing), ws.nbytes, -order[ws.address]))
        # Where the data can go: running workers that stay (as the retirement copies).
        stay = {a for a in self.runnable if a not in self.retiring}
        staying = [self.workers[a] for a in stay]
        unlimited = sum(1 for w in staying if not w.memory_limit)  # room for anything
        room = sum(max(0, w.memory_limit - w.nbytes) for w in staying)
        moving = 0
        chosen: list[WorkerRecord] = []
        for ws in candidates:
            if len(chosen) == n:
                break
            leaves_stay = ws.address in stay
            left = len(stay) - leaves_stay
            own_room = max(0, ws.memory_limit - ws.nbytes) if leaves_stay else 0
            left_unlimited = unlimited - int(leaves_stay and not ws.memory_limit)
            if (ws.nbytes or ws.processing) and not left:
                continue  # its data (or its running tasks' results) would have nowhere to go
            if ws.nbytes and not left_unlimited and moving + ws.nbytes > room - own_room:
                continue  # the others have no room for it
            chosen.append(ws)
            if leaves_stay:
                stay.discard(ws.address)
            room -= own_room
            unlimited = left_unlimited
            moving += ws.nbytes
        return chosen

    def adaptive_snapshot(
        self, workers: Iterable[WorkerRecord], launching: int, threads_per_worker: int
    ) -> Snapshot:
        """What the policy looks at: outstanding tasks per prefix (from the prefix
        counters) and ``workers`` (the cluster's)."""
        prefixes = []
        for tp in self.prefixes.values():
            states = tp.states
            n = states["queued"] + states["processing"]
            if n:
                mean = tp.duration_sum / tp.duration_count if tp.duration_count else None
                prefixes.append(PrefixLoad(tp.name, n, mean))
        loads = [
            WorkerLoad(
                ws.name,
                ws.nthreads,
                len(ws.processing),
                ws.nbytes,
                ws.memory,
                ws.memory_limit,
                ws.status == "paused",
                ws.status == "retiring",
            )
            for ws in workers
        ]
        return Snapshot(prefixes, loads, launching, threads_per_worker)

    # ------------------------------------------------------------------ the request

    def _scale_request(self, cs: ClientRecord, msg: m.ScaleRequest) -> None:
        sid = f"scale-{cs.id}-{msg.request_id}"
        for client_id in [c for c in self.adaptive_sessions if c not in self.clients]:
            del self.adaptive_sessions[client_id]  # its cluster went away
        for client_id in [c for c in self.scaled_away if c not in self.clients]:
            del self.scaled_away[client_id]
        names = list(dict.fromkeys(msg.workers))
        away = self.scaled_away.setdefault(cs.id, set())
        away.intersection_update(names)  # the rest have exited: forgotten
        by_name = {ws.name: ws for ws in self.workers.values()}
        joined = [by_name[n] for n in names if n in by_name]
        # Retiring or told to stop (the rest of ``away``) are leaving: not counted again;
        # nor are those whose lifetime ends within ``replace_ahead`` (they leave on their
        # own, and their replacements should be up by then).
        expiring = self._expiring(joined, msg.replace_ahead)
        staying = [
            ws
            for ws in joined
            if ws.status != "retiring" and ws.name not in away and ws.name not in expiring
        ]
        launching = [n for n in names if n not in by_name and n not in away]
        current = len(staying) + len(launching)
        if msg.n >= 0:
            self.adaptive_sessions.pop(cs.id, None)  # scale() ends adapt
            decision = Decision(
                self.wall_time,
                "up" if msg.n > current else "down" if msg.n < current else "same",
                current,
                msg.n,
                msg.n,
                f"scale({msg.n}) asked by the cluster (have {current}"
                + (
                    f"; {len(expiring)} ending within {msg.replace_ahead:g}s not counted)"
                    if expiring
                    else ")"
                ),
            )
            session_name = ""
        else:
            try:
                session = self._session(cs, msg)
            except ValueError as e:
                self.comm.send_client(cs.id, m.ScaleReply(msg.request_id, error=str(e)))
                return
            snapshot = self.adaptive_snapshot(staying, len(launching), msg.threads_per_worker)
            decision = session.policy.recommend(snapshot, self.wall_time)
            session_name = session.name
        reply = m.ScaleReply(
            msg.request_id, decision.target, decision.action, reason=decision.reason
        )
        if decision.action == "up":
            self._scale_up(decision.target - current, joined, reply, sid)
        elif decision.action == "down":
            self._scale_down(current - decision.target, staying, launching, reply, sid)
        away.difference_update(reply.resumed)
        away.update(reply.stop)
        away.update(reply.closing)
        self._log_decision(cs.id, session_name, decision, reply)
        self.comm.send_client(cs.id, reply)

    def _expiring(self, joined: list[WorkerRecord], ahead: float) -> set[str]:
        """The names of ``joined`` workers whose lifetime ends within ``ahead`` seconds."""
        if ahead <= 0:
            return set()
        end = self.wall_time + ahead
        return {ws.name for ws in joined if ws.deadline is not None and ws.deadline <= end}

    def _session(self, cs: ClientRecord, msg: m.ScaleRequest) -> AdaptiveSession:
        policy = AdaptivePolicy(
            msg.minimum,
            None if msg.maximum < 0 else msg.maximum,
            msg.target_duration,
            msg.wait_count,
            msg.default_task_duration,
        )
        session = self.adaptive_sessions.get(cs.id)
        if (
            session is None
            or session.name != msg.session
            or not session.policy.same_settings(policy)
        ):
            session = self.adaptive_sessions[cs.id] = AdaptiveSession(msg.session, policy)
        return session

    def _scale_up(
        self, more: int, joined: list[WorkerRecord], reply: m.ScaleReply, sid: str
    ) -> None:
        """Cancel retirements not yet done (those with the most data still to copy
        first), then ask the cluster to start the rest."""
        retiring = [ws for ws in joined if ws.address in self.scaling_down]
        retiring.sort(key=lambda ws: -ws.nbytes)
        for ws in retiring:
            if len(reply.resumed) == more:
                break
            if self.cancel_retirement(ws.address, sid):
                reply.resumed.append(ws.name)
        reply.start = more - len(reply.resumed)

    def _scale_down(
        self,
        fewer: int,
        staying: list[WorkerRecord],
        launching: list[str],
        reply: m.ScaleReply,
        sid: str,
    ) -> None:
        """Not-yet-joined workers first (the newest), then ``workers_to_close``."""
        reply.stop = launching[::-1][:fewer]
        closing = self.workers_to_close(fewer - len(reply.stop), staying)
        reply.closing = [ws.name for ws in closing]
        if closing:
            self.retire_for_scaling(closing, sid)

    def _log_decision(
        self, client_id: str, session: str, decision: Decision, reply: m.ScaleReply
    ) -> None:
        """Every decision that does something, and a decision that does nothing only
        when it is not the one logged last for this loop (so an idle cluster's log is
        not a line per interval)."""
        done = bool(reply.start or reply.stop or reply.closing or reply.resumed)
        state = self.adaptive_sessions.get(client_id)
        key = (decision.action, decision.current, decision.target)
        if not done and state is not None and state.last_logged == key:
            return
        if state is not None:
            state.last_logged = key
        event = decision.as_event()
        event.update(
            client=client_id,
            session=session,
            start=reply.start,
            stop=list(reply.stop),
            closing=list(reply.closing),
            resumed=list(reply.resumed),
        )
        wanted = reply.start + len(reply.resumed) - len(reply.stop) - len(reply.closing)
        if decision.action == "down" and decision.current + wanted > decision.target:
            kept = decision.current + wanted - decision.target
            event["reason"] = reply.reason = (
                f"{decision.reason}; kept {kept} more: pinned, or holding data (or running "
                "tasks) the staying workers have no room for"
            )
        self.log_event(EVENT_TOPIC, event)
