"""``client.rebalance``: even out the managed bytes of workers by moving keys, as
Dask's ``Scheduler.rebalance`` (the choice of moves is its ``_rebalance_find_msgs``).

A move is copy-then-drop, tracked here: the recipient is asked to fetch the key
(``CopyKeys``); only once it reports holding it (``AddKeys``) is the sender told to
drop its replica (``FreeKeys``). A key's last copy is therefore never dropped: the drop
needs the confirmed copy, and still two holders at that moment. A move is given up
(the key stays where it was) when the copy takes longer than ``MOVE_TIMEOUT`` (a worker
that cannot fetch a copy reports nothing), when either worker leaves, starts retiring
or pauses (recipient), or when the key leaves memory. The client's request is answered
once every move it started is over.

Senders and recipients follow Dask's thresholds (the request carries them, from the
client's config ``shoal.worker.memory.rebalance.*`` or Dask's ``distributed.`` keys), as
fractions of each worker's memory limit (none for a worker without a limit): a sender holds at least ``half_gap`` more
than the mean and at least ``sender_min``; a recipient at least ``half_gap`` less than
the mean and below ``recipient_max``. Dask measures process memory; shoal measures what
the scheduler knows exactly, the managed bytes of the keys in memory (``ws.nbytes``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from shoal.core.scheduler.model import ClientRecord, TaskState, WorkerRecord
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

# Dask's distributed.worker.memory.rebalance.* defaults
SENDER_MIN = 0.30
RECIPIENT_MAX = 0.60
SENDER_RECIPIENT_GAP = 0.10
MOVE_TIMEOUT = 30.0  # seconds (monotonic, from heartbeats) a copy may take


class Move:
    """One key on its way from ``sender`` to ``recipient``."""

    __slots__ = ("ts", "sender", "recipient", "started", "request")

    def __init__(
        self,
        ts: TaskState,
        sender: WorkerRecord,
        recipient: WorkerRecord,
        started: float,
        request: RebalanceRun,
    ):
        self.ts = ts
        self.sender = sender
        self.recipient = recipient
        self.started = started
        self.request = request

    def __repr__(self) -> str:
        return f"<Move {self.ts.key!r} {self.sender.address} -> {self.recipient.address}>"


class RebalanceRun:
    """One ``RebalanceRequest``: answered once ``pending`` is empty."""

    __slots__ = ("client_id", "request_id", "pending", "moved", "abandoned")

    def __init__(self, client_id: str, request_id: int):
        self.client_id = client_id
        self.request_id = request_id
        self.pending = 0
        self.moved = 0
        self.abandoned = 0


def find_moves(
    keys: set[Key] | None,
    workers: list[WorkerRecord],
    sender_min: float = SENDER_MIN,
    recipient_max: float = RECIPIENT_MAX,
    gap: float = SENDER_RECIPIENT_GAP,
    busy: set[TaskState] | None = None,
) -> list[tuple[WorkerRecord, WorkerRecord, TaskState]]:
    """Dask's pairing: ``(sender, recipient, task)`` moves that bring the workers
    farthest from the mean closer to it, never past it (no key bounces back); a key in
    ``busy`` (already moving) stays."""
    if not workers:
        return []
    mean = sum(ws.nbytes for ws in workers) // len(workers)
    # Heap entries hold negative byte counts, so the farthest from the mean come first.
    senders: list[tuple[int, int, str, WorkerRecord, Iterator[TaskState]]] = []
    recipients: list[tuple[int, int, str, WorkerRecord]] = []
    for ws in workers:
        if ws.memory_limit:
            half_gap = int(gap / 2 * ws.memory_limit)
            low, high = sender_min * ws.memory_limit, recipient_max * ws.memory_limit
        else:
            half_gap, low, high = 0, 0.0, math.inf
        if ws.has_what and ws.nbytes >= mean + half_gap and ws.nbytes >= low:
            most = mean - ws.nbytes  # negative: the bytes it should lose
            # oldest first, as Dask's insertion order (and deterministic)
            held = iter(sorted(ws.has_what, key=_by_priority))
            senders.append((most, most + half_gap, ws.address, ws, held))
        elif ws.nbytes < mean - half_gap and ws.nbytes < high:
            most = ws.nbytes - mean
            recipients.append((most, most + half_gap, ws.address, ws))
    moves: list[tuple[WorkerRecord, WorkerRecord, TaskState]] = []
    heapq.heapify(senders)
    heapq.heapify(recipients)
    while senders and recipients:
        snd_max, snd_min, _, sender, held = senders[0]
        for ts in held:
            if ts.state != "memory" or (keys is not None and ts.key not in keys):
                continue
            if busy is not None and ts in busy:
                continue
            if ts.nbytes + snd_max > 0:
                continue  # the sender would fall below the mean
            skipped = []
            chosen = None
            while recipients:
                rec_max, rec_min, _, recipient = recipients[0]
                if ts.nbytes + rec_max > 0:
                    break  # the others are closer to the mean still
                if ts not in recipient.has_what:
                    chosen = recipient
                    break
                skipped.append(heapq.heappop(recipients))
            for entry in skipped:
                heapq.heappush(recipients, entry)
            if chosen is None:
                continue
            moves.append((sender, chosen, ts))
            snd_max += ts.nbytes
            snd_min += ts.nbytes
            rec_max += ts.nbytes
            rec_min += ts.nbytes
            if snd_min < 0:
                heapq.heapreplace(senders, (snd_max, snd_min, sender.address, sender, held))
            else:
                heapq.heappop(senders)
            if rec_min < 0:
                heapq.heapreplace(recipients, (rec_max, rec_min, chosen.address, chosen))
            else:
                heapq.heappop(recipients)
            break
        else:  # nothing more this sender can give
            heapq.heappop(senders)
    return moves


class Rebalance:
    tasks: dict[Key, TaskState]
    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]
    clients: dict[str, ClientRecord]
    _now: float

    if TYPE_CHECKING:
        from shoal.core.comm import Comm
        from shoal.core.scheduler.membership import Retirement
        from shoal.core.story import StoryLog

        retiring: dict[str, Retirement]
        comm: Comm
        log: StoryLog

        def _find_worker(self, name: str) -> WorkerRecord | None: ...
        def _remove_replica(self, ts: TaskState, ws: WorkerRecord) -> None: ...

    def _init_rebalance(self) -> None:
        self.moves: dict[TaskState, Move] = {}  # one move per key at a time

    def _rebalance(self, cs: ClientRecord, msg: m.RebalanceRequest) -> None:
        run = RebalanceRun(cs.id, msg.request_id)
        if msg.workers:
            found = (self._find_worker(name) for name in msg.workers)
            pool = list({w.address: w for w in found if w is not None}.values())
        else:
            pool = list(self.workers.values())
        # Retiring workers are emptied by their retirement; paused ones take nothing.
        pool = [w for w in pool if w.address in self.runnable and w.address not in self.retiring]
        keys = None if msg.keys is None else set(msg.keys)
        found_moves = find_moves(
            keys, pool, msg.sender_min, msg.recipient_max, msg.sender_recipient_gap, set(self.moves)
        )
        self.log.append(("rebalance", cs.id, len(pool), len(found_moves), msg.stimulus_id))
        asks: dict[WorkerRecord, list[m.DepInfo]] = {}
        for sender, recipient, ts in found_moves:
            self.moves[ts] = Move(ts, sender, recipient, self._now, run)
            run.pending += 1
            asks.setdefault(recipient, []).append(m.DepInfo(ts.key, ts.nbytes, [sender.address]))
        for recipient, deps in asks.items():
            self.comm.send_worker(recipient.address, m.CopyKeys(deps, msg.stimulus_id))
        if not run.pending:
            self._rebalance_reply(run)

    def _moves_arrived(self, ws: WorkerRecord, keys: list[Key], stimulus_id: str) -> None:
        """``ws`` reported holding ``keys`` (AddKeys): the moves to it are done; their
        senders drop their replicas (never the last: ``ws`` holds one now)."""
        for key in keys:
            ts = self.tasks.get(key)
            move = None if ts is None else self.moves.get(ts)
            if move is None or move.recipient is not ws:
                continue
            if _can_drop(ts, move, self):  # type: ignore[arg-type]
                self._remove_replica(ts, move.sender)  # type: ignore[arg-type]
                self.comm.send_worker(move.sender.address, m.FreeKeys([key], stimulus_id))
                self.log.append((key, "moved", move.sender.address, ws.address, stimulus_id))
                self._move_over(move, moved=True)
            else:
                self._move_over(move, moved=False)

    def _advance_moves(self, stimulus_id: str) -> None:
        """Give up the moves that can no longer finish well (see the module docstring)."""
        for move in list(self.moves.values()):
            ts = move.ts
            recipient = move.recipient
            gone = (
                ts.state != "memory"
                or move.sender not in ts.who_has
                or self.workers.get(recipient.address) is not recipient
                or recipient.address not in self.runnable
                or recipient.address in self.retiring
                or self._now - move.started > MOVE_TIMEOUT
            )
            if gone:
                self.log.append((ts.key, "move-abandoned", recipient.address, stimulus_id))
                self._move_over(move, moved=False)

    def _move_over(self, move: Move, moved: bool) -> None:
        del self.moves[move.ts]
        run = move.request
        run.pending -= 1
        if moved:
            run.moved += 1
        else:
            run.abandoned += 1
        if not run.pending:
            self._rebalance_reply(run)

    def _rebalance_reply(self, run: RebalanceRun) -> None:
        if run.client_id in self.clients:
            reply = m.RebalanceReply(run.request_id, run.moved, run.abandoned)
            self.comm.send_client(run.client_id, reply)


def _can_drop(ts: TaskState, move: Move, state: Rebalance) -> bool:
    """The sender's replica may go: the copy is confirmed and it is not the last one,
    and the recipient is still a place the key may stay (not leaving)."""
    recipient = move.recipient
    return (
        ts.state == "memory"
        and recipient in ts.who_has
        and move.sender in ts.who_has
        and len(ts.who_has) >= 2
        and recipient.address in state.runnable
        and recipient.address not in state.retiring
    )


def _by_priority(ts: TaskState) -> tuple[object, str]:
    return (ts.rank, repr(ts.key))
