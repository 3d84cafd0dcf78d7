"""Lanes: which client may send one-task gets straight to which worker (a mixin of
:class:`~shoal.core.scheduler.SchedulerState`). The design is in ``shoal/lanes``.

A lane is granted to a client that asks (``LaneRequest``), on a worker that takes new
tasks (in ``runnable``: running, not paused, not retiring) with no walltime or task
budget (a direct task is placed without the scheduler, so nothing could keep it off
a worker about to leave). The worker with the fewest lanes, then the least occupied,
gets it. A client holds one lane at most.

No lane outlives what made it valid: it is closed, and both its client and its worker
told (``LaneClosed``), when its worker stops taking new tasks (pause, retirement,
removal: all pass through ``_unindex_worker``; a walltime leaver that waits for a home
for its results is closed where it is given no more tasks), when its client leaves,
and when lanes are turned off (a scheduler plugin watches transitions or graphs, which
direct tasks would bypass). A closed lane's runs are declined by the worker, so the
client then submits through the scheduler: a lane only ever changes the path, never
the result.

A run may still be under way on a lane that closed (the worker paused, say): its
client keeps waiting for the answer, unless the worker leaves the cluster. So the
client of a lane is told ``gone`` when its worker is removed, whenever its lane was
closed: at once if still open, else by a second ``LaneClosed`` (the last closed lane of
each client per worker is kept for this until the worker goes or the client leaves).

What a worker reports of a lane's run (``LaneRan``) feeds the task stream and the
prefix's durations only: direct tasks have no task record, no future on the
scheduler, and nothing to recompute. A worker takes a run only when idle, and a tiny
one is over in microseconds; one that goes on is announced (``LaneBusy``) and counts a
thread of its worker busy, as a thread still running a released task does (placement's
draining count), until its ``LaneRan``: placement and stealing then see the thread as
taken, and the worker gets no more queued work than its other threads can take.

A worker takes a client's small graph whole only when the prefixes' recent durations
say it is short (``shoal/core/worker/lanes.py``), and only the scheduler measures every
prefix. So a worker is sent them all when its first lane opens (``LaneDurations``), and
then, every ``DURATIONS_INTERVAL`` while it has lanes, those that changed by more than
``DURATIONS_CHANGE``: a periodic look at the prefixes, nothing per task. Every worker
with lanes then holds the same values (``_shared_durations``), each within
DURATIONS_CHANGE of the prefix's own after every share.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from shoal.core.comm import Comm
from shoal.core.scheduler.model import (
    ClientRecord,
    TaskPrefix,
    WorkerRecord,
    group_name,
    key_split,
)
from shoal.core.scheduler.task_stream import TaskStream
from shoal.core.story import StoryLog
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

_RUN_MARK = "shoal-lane-run"
DURATIONS_INTERVAL = 0.5  # seconds between the server's share_lane_durations calls
DURATIONS_CHANGE = 0.1  # a prefix's duration is shared again when it moved this much
DURATIONS_SHARED = 10_000  # at most this many prefixes (the newest) in a worker's first


def _run_marker(lane: str, key: Key) -> Key:
    """What a lane's run busy on a worker is counted under in its draining threads
    (beside released tasks' keys, which never take this shape)."""
    return (_RUN_MARK, lane, repr(key))


def is_lane_run(key: Key) -> bool:
    """Whether a draining thread's key is a lane's run (not a released task)."""
    return type(key) is tuple and len(key) == 3 and key[0] == _RUN_MARK


class LaneRecord:
    __slots__ = ("id", "client", "worker")

    def __init__(self, lane_id: str, client: str, worker: str):
        self.id = lane_id
        self.client = client
        self.worker = worker

    def __repr__(self) -> str:
        return f"<Lane {self.id} {self.client} -> {self.worker}>"


class Lanes:
    comm: Comm
    log: StoryLog
    clients: dict[str, ClientRecord]
    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]
    prefixes: dict[str, TaskPrefix]
    task_stream: TaskStream

    if TYPE_CHECKING:

        def _drain(self, ws: WorkerRecord, key: Key) -> None: ...
        def _drained(self, ws: WorkerRecord, key: Key) -> bool: ...

    def _init_lanes(self) -> None:
        self.lanes: dict[str, LaneRecord] = {}
        self.lane_of_client: dict[str, LaneRecord] = {}
        self.lanes_of_worker: dict[str, dict[str, LaneRecord]] = {}
        self.lanes_enabled = True
        self.lanes_off_reason = ""
        self.lane_runs = 0  # runs workers reported (LaneRan)
        # worker -> {client: its last lane there closed while the worker stayed}: told
        # ``gone`` when that worker is removed (a run may still wait on it)
        self.closed_lanes: dict[str, dict[str, str]] = {}
        self._lane_ids = itertools.count(1)
        self._shared_durations: dict[str, float] = {}  # prefix -> as last shared

    # ------------------------------------------------------------------ granting

    def _lane_request(self, cs: ClientRecord, msg: m.LaneRequest) -> None:
        old = self.lane_of_client.get(cs.id)
        if old is not None:  # it asks again: its lane is of no use to it any more
            self._close_lane(old, "its client asked for another", tell_client=False)
        worker, reason = self._lane_worker()
        if worker is None:
            self.comm.send_client(cs.id, m.LaneGrant(msg.request_id, reason=reason))
            return
        lane = LaneRecord(f"lane-{next(self._lane_ids)}", cs.id, worker.address)
        if worker.address not in self.lanes_of_worker:
            self._first_lane_durations(worker.address)
        self.lanes[lane.id] = lane
        self.lane_of_client[cs.id] = lane
        self.lanes_of_worker.setdefault(worker.address, {})[lane.id] = lane
        self.log.append(("lane-open", lane.id, cs.id, worker.address))
        # The worker first: the grant may reach the client before the worker hears of
        # the lane (two connections), and the worker then declines; nothing is lost.
        self.comm.send_worker(worker.address, m.LaneOpen(lane.id, cs.id))
        self.comm.send_client(cs.id, m.LaneGrant(msg.request_id, lane.id, worker.address))

    def _lane_worker(self) -> tuple[WorkerRecord | None, str]:
        """The worker to open a lane on, or None and why there is none."""
        if not self.lanes_enabled:
            return None, self.lanes_off_reason
        best: WorkerRecord | None = None
        best_rank: tuple[int, float, str] | None = None
        for ws in self.runnable.values():
            if ws.deadline is not None or ws.budget is not None or ws.nthreads < 1:
                continue
            rank = (len(self.lanes_of_worker.get(ws.address, ())), ws.occupancy, ws.address)
            if best_rank is None or rank < best_rank:
                best, best_rank = ws, rank
        if best is None:
            return None, "no running worker without a walltime or task budget"
        return best, ""

    # ------------------------------------------------------------------ closing

    def _close_lane(self, lane: LaneRecord, reason: str, tell_client: bool = True) -> None:
        del self.lanes[lane.id]
        if self.lane_of_client.get(lane.client) is lane:
            del self.lane_of_client[lane.client]
        of_worker = self.lanes_of_worker.get(lane.worker)
        if of_worker is not None:
            of_worker.pop(lane.id, None)
            if not of_worker:
                del self.lanes_of_worker[lane.worker]
        self.log.append(("lane-closed", lane.id, reason))
        gone = lane.worker not in self.workers
        closed = m.LaneClosed(lane.id, reason, gone)
        if not gone:
            self.comm.send_worker(lane.worker, closed)
        if tell_client and lane.client in self.clients:
            self.comm.send_client(lane.client, closed)
        if not gone and lane.client in self.clients:
            self.closed_lanes.setdefault(lane.worker, {})[lane.client] = lane.id

    def _close_worker_lanes(self, address: str, reason: str) -> None:
        """``address`` takes no new tasks: its lanes close (called by _unindex_worker)."""
        for lane in list(self.lanes_of_worker.get(address, {}).values()):
            self._close_lane(lane, reason)

    def _close_client_lane(self, client_id: str) -> None:
        """``client_id`` left (it is no longer in ``clients``)."""
        lane = self.lane_of_client.get(client_id)
        if lane is not None:
            self._close_lane(lane, "its client left", tell_client=False)
        for address in [a for a, c in self.closed_lanes.items() if client_id in c]:
            closed = self.closed_lanes[address]
            del closed[client_id]
            if not closed:
                del self.closed_lanes[address]

    def _lanes_worker_removed(self, address: str) -> None:
        """``address`` was removed (its open lanes closed already, ``gone``): the
        clients of its lanes closed before are told it is gone."""
        reason = f"worker {address} left"
        for client_id, lane_id in self.closed_lanes.pop(address, {}).items():
            if client_id in self.clients:
                self.comm.send_client(client_id, m.LaneClosed(lane_id, reason, True))

    def set_lanes_enabled(self, enabled: bool, reason: str = "") -> None:
        """Turn lanes on or off; off closes every lane (``reason`` says why to both
        sides, and to a client that asks meanwhile)."""
        self.lanes_enabled = enabled
        self.lanes_off_reason = "" if enabled else reason or "lanes are turned off"
        if not enabled:
            for lane in list(self.lanes.values()):
                self._close_lane(lane, self.lanes_off_reason)

    # ------------------------------------------------------------------ durations

    def share_lane_durations(self) -> None:
        """Send the workers that have lanes the prefixes' durations that changed since
        the last share (by DURATIONS_CHANGE, relative) or were first measured: they all
        then hold what ``_shared_durations`` says."""
        if self.lanes_of_worker:
            self._send_durations(self._durations_changed())

    def _durations_changed(self) -> dict[str, float]:
        shared = self._shared_durations
        changed: dict[str, float] = {}
        for name, prefix in self.prefixes.items():
            now = prefix.recent_duration
            if now is None:
                continue
            before = shared.get(name)
            if before is None or abs(now - before) > DURATIONS_CHANGE * before:
                changed[name] = shared[name] = now
        if len(shared) > 2 * len(self.prefixes) + 1000:  # prefixes forgotten since
            self._shared_durations = {n: d for n, d in shared.items() if n in self.prefixes}
        return changed

    def _send_durations(self, changed: dict[str, float]) -> None:
        if changed:
            msg = m.LaneDurations(changed)
            for address in self.lanes_of_worker:
                self.comm.send_worker(address, msg)

    def _first_lane_durations(self, address: str) -> None:
        """``address`` gets its first lane: the workers with lanes are brought up to
        date, then it is sent all they know (the newest DURATIONS_SHARED prefixes)."""
        self._send_durations(self._durations_changed())
        known = list(self._shared_durations.items())[-DURATIONS_SHARED:]
        self.comm.send_worker(address, m.LaneDurations(dict(known)))

    # ------------------------------------------------------------------ runs reported

    def _lane_busy(self, ws: WorkerRecord, msg: m.LaneBusy) -> None:
        self._drain(ws, _run_marker(msg.lane, msg.key))

    def _lane_ran(self, ws: WorkerRecord, msg: m.LaneRan) -> None:
        """Bookkeeping only: the task stream, and the prefix's durations if the prefix
        is known (a run creates no group or prefix of its own)."""
        if msg.status not in ("memory", "erred"):
            raise TypeError(f"unknown lane run status {msg.status!r}")
        self.lane_runs += 1
        self._drained(ws, _run_marker(msg.lane, msg.key))  # (if announced busy)
        group = group_name(msg.key)
        prefix_name = key_split(group)
        prefix = self.prefixes.get(prefix_name)
        if prefix is not None and msg.status == "memory" and msg.stop >= msg.start:
            prefix.add_duration(msg.stop - msg.start)
        self.task_stream.add(
            m.TaskStreamRecord(
                msg.key,
                prefix_name,
                group,
                ws.address,
                msg.start,
                msg.stop,
                msg.status,
                msg.nbytes,
            )
        )
