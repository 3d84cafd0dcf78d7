"""The scheduler's part of the P2P shuffle: pure, a mixin of SchedulerState (as
placement and membership), called at a few points of the task life cycle.

The client marks each task of a shuffle (``TaskSpec.shuffle``: id, role, partition);
the scheduler never opens their data. A shuffle's tasks wait under a restriction no
worker matches until the first of them is ready; then the shuffle *starts*:

- the participants are the running workers at that moment, output partition ``p``
  belongs to ``participants[p % n]`` (shoal/shuffle/_plan.py); transfers and the
  barrier may run on any participant, each unpack only on its partition's owner, so
  a worker that joins meanwhile takes no part;
- every ComputeTask of the shuffle carries the run (id, run number, participants);
- the participants are pinned (owner ``shuffle:<id>``) until the shuffle finishes
  (every unpack done), fails, or is forgotten; events go to topic "p2p".

A participant that leaves makes the shuffle restart (at most ``shuffle_max_restarts``
times, then it fails): a new run number on the remaining participants, every
transfer run again, the barrier and the unpacks not done placed again; the workers
drop the older runs' data (``ShuffleRestart``) and never mix runs. A failure errs the
barrier, and so every unpack not done, with a message saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from shoal.core.errors import error_payload
from shoal.core.scheduler.model import TaskState, WorkerRecord
from shoal.core.scheduler.placement import Restrictions
from shoal.protocol import messages as m
from shoal.shuffle._plan import owner

P2P_TOPIC = "p2p"
DEFAULT_SHUFFLE_RESTARTS = 3  # restarts after participants died, before the shuffle fails
ROLES = ("transfer", "barrier", "unpack")

Recs = dict[TaskState, str]


class ShuffleRecord:
    """One shuffle as the scheduler sees it."""

    __slots__ = (
        "id",
        "transfers",
        "barrier",
        "unpacks",
        "run",
        "running",
        "participants",
        "restarts",
        "done",
        "pending",
        "info",
        "sent",
        "spilled",
    )

    def __init__(self, shuffle_id: str):
        self.id = shuffle_id
        self.transfers: dict[int, TaskState] = {}  # input partition -> task
        self.barrier: TaskState | None = None
        self.unpacks: dict[int, TaskState] = {}  # output partition -> task
        self.run = 0  # 0: never started; run numbers grow over all shuffles
        self.running = False
        self.participants: tuple[str, ...] = ()
        self.restarts = 0  # since it last started from scratch
        self.done: set[int] = set()  # output partitions whose unpack is in memory
        # Where its tasks wait while it does not run: a restriction no worker matches.
        self.pending = Restrictions(frozenset({f"shuffle-not-started:{shuffle_id}"}), False, {})
        self.info: m.ShuffleRun | None = None  # what its ComputeTasks carry
        self.sent = 0  # bytes moved and spilled, as the workers reported
        self.spilled = 0

    @property
    def owner(self) -> str:
        return f"shuffle:{self.id}"

    def tasks(self) -> Iterator[TaskState]:
        yield from self.transfers.values()
        if self.barrier is not None:
            yield self.barrier
        yield from self.unpacks.values()

    def __repr__(self) -> str:
        return f"<Shuffle {self.id} run={self.run} running={self.running}>"


class ShuffleCoordinator:
    """Shuffle methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    tasks: dict[Any, TaskState]
    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]

    if TYPE_CHECKING:
        from shoal.core.comm import Comm

        comm: Comm

        def _transitions(self, recs: Recs, stimulus_id: str) -> None: ...
        def _enqueue(self, ts: TaskState) -> None: ...
        def _dequeue(self, ts: TaskState) -> None: ...
        def _restrictions(
            self, spec: m.TaskRestrictions, slotted: bool = False
        ) -> Restrictions | None: ...
        def add_pin(
            self,
            workers: Iterable[str],
            reason: str,
            owner: str,
            lease: float | None,
            stimulus_id: str,
        ) -> Any: ...
        def release_pins_of(self, owner: str, stimulus_id: str, why: str) -> None: ...
        def log_event(self, topic: str, data: dict[str, Any]) -> None: ...
        def workers_with_time(self) -> list[str]: ...

        pin_owner_kinds: dict[str, Callable[[str], bool]]

    def _init_shuffles(self, max_restarts: int = DEFAULT_SHUFFLE_RESTARTS) -> None:
        self.shuffles: dict[str, ShuffleRecord] = {}
        # Every task of a shuffle -> (its shuffle, role, partition); empty without
        # shuffles, so the hooks cost one falsy check per transition then.
        self.shuffle_tasks: dict[TaskState, tuple[ShuffleRecord, str, int]] = {}
        self.shuffle_max_restarts = max_restarts
        # Run numbers grow over every shuffle: a shuffle forgotten and submitted again
        # (the same id) never reuses the number of a run whose data workers refused.
        self.shuffle_last_run = 0
        self.pin_owner_kinds["shuffle"] = self._shuffle_alive  # its pins live while it runs

    def _shuffle_alive(self, shuffle_id: str) -> bool:
        """A shuffle's pins may live while it runs (an id this coordinator does not
        know is not its business: a pin made through the API directly)."""
        rec = self.shuffles.get(shuffle_id)
        return rec is None or rec.running

    # ------------------------------------------------------------------ hooks

    def _shuffle_task_added(self, ts: TaskState, mark: m.ShuffleMark) -> None:
        """A new task of shuffle ``mark.id`` (from ``_submit_tasks``)."""
        if mark.role not in ROLES:
            raise ValueError(f"task {ts.key!r}: unknown shuffle role {mark.role!r}")
        rec = self.shuffles.get(mark.id)
        if rec is None:
            rec = self.shuffles[mark.id] = ShuffleRecord(mark.id)
        if mark.role == "transfer":
            rec.transfers[mark.partition] = ts
        elif mark.role == "barrier":
            rec.barrier = ts
        else:
            rec.unpacks[mark.partition] = ts
        self.shuffle_tasks[ts] = (rec, mark.role, mark.partition)
        ts.restrictions = self._shuffle_place_of(rec, mark.role, mark.partition)

    def _shuffle_run_of(self, ts: TaskState) -> m.ShuffleRun | None:
        """What the ComputeTask of ``ts`` carries (from ``_send_compute``)."""
        entry = self.shuffle_tasks.get(ts)
        return entry[0].info if entry is not None else None

    def _shuffles_check(self, stimulus_id: str) -> None:
        """Start the shuffles whose tasks are ready (from ``_done``, before placing)."""
        if not self.runnable:
            return
        for rec in list(self.shuffles.values()):
            if not rec.running and rec.pending.nqueued:
                self._shuffle_start(rec, stimulus_id)

    def _shuffle_task_done(self, ts: TaskState, stimulus_id: str) -> None:
        """``ts`` reached memory (from ``_transition_processing_memory``)."""
        entry = self.shuffle_tasks.get(ts)
        if entry is None or entry[1] != "unpack":
            return
        rec = entry[0]
        if rec.running:
            rec.done.add(entry[2])
            if len(rec.done) == len(rec.unpacks):
                self._shuffle_finish(rec, stimulus_id)

    def _shuffle_task_erred(self, ts: TaskState, stimulus_id: str) -> None:
        """``ts`` erred (from ``_set_erred``): a shuffle that runs is over."""
        entry = self.shuffle_tasks.get(ts)
        if entry is None or not entry[0].running:
            return
        rec = entry[0]
        blame = ts.exception_blame.key if ts.exception_blame is not None else ts.key
        self._shuffle_stop(rec, stimulus_id, "failed")
        self._shuffle_event(
            {"action": "failed", "id": rec.id, "run": rec.run, "why": f"task {blame!r} erred"}
        )

    def _shuffle_task_forgotten(self, ts: TaskState, stimulus_id: str) -> None:
        """``ts`` is forgotten (from ``_transition_released_forgotten``)."""
        entry = self.shuffle_tasks.pop(ts, None)
        if entry is None:
            return
        rec, role, partition = entry
        if role == "transfer" and rec.transfers.get(partition) is ts:
            del rec.transfers[partition]
        elif role == "barrier" and rec.barrier is ts:
            rec.barrier = None
        elif role == "unpack" and rec.unpacks.get(partition) is ts:
            del rec.unpacks[partition]
            rec.done.discard(partition)
        if not rec.transfers and rec.barrier is None and not rec.unpacks:
            del self.shuffles[rec.id]
            if rec.running:
                self._shuffle_stop(rec, stimulus_id, "forgotten")
                self._shuffle_event({"action": "forgotten", "id": rec.id, "run": rec.run})
        elif rec.running and role == "unpack" and rec.unpacks and len(rec.done) == len(rec.unpacks):
            self._shuffle_finish(rec, stimulus_id)

    def _shuffle_worker_removed(self, address: str, reason: str, stimulus_id: str) -> None:
        """Worker ``address`` is gone (from ``remove_worker``, before placing again)."""
        for rec in list(self.shuffles.values()):
            if not rec.running or address not in rec.participants:
                continue
            why = f"participant {address} left" + (f" ({reason})" if reason else "")
            if rec.restarts >= self.shuffle_max_restarts:
                self.shuffle_fail(
                    rec,
                    f"{why}; it had restarted {rec.restarts} times already "
                    f"(at most {self.shuffle_max_restarts})",
                    stimulus_id,
                )
            else:
                self._shuffle_restart(rec, why, stimulus_id)

    def _shuffle_stats(self, ws: WorkerRecord, msg: m.ShuffleStats) -> None:
        rec = self.shuffles.get(msg.id)
        if rec is not None:
            rec.sent += msg.sent
            rec.spilled += msg.spilled

    # ------------------------------------------------------------------ life cycle

    def _next_shuffle_run(self) -> int:
        self.shuffle_last_run += 1
        return self.shuffle_last_run

    def _shuffle_start(self, rec: ShuffleRecord, stimulus_id: str) -> None:
        rec.run = self._next_shuffle_run()
        rec.running = True
        rec.participants = tuple(sorted(self.workers_with_time()))
        # (started again: an unpack's result was lost, say) what is done is what is held
        rec.done = {p for p, ts in rec.unpacks.items() if ts.state == "memory"}
        self._shuffle_begin_run(rec, stimulus_id)
        self._shuffle_event(
            {
                "action": "start",
                "id": rec.id,
                "run": rec.run,
                "participants": list(rec.participants),
                "partitions": len(rec.unpacks),
                "inputs": len(rec.transfers),
            }
        )

    def _shuffle_begin_run(self, rec: ShuffleRecord, stimulus_id: str) -> None:
        """Tell tasks where the run ``rec.run`` places them, and pin its participants."""
        rec.info = m.ShuffleRun(rec.id, rec.run, list(rec.participants))
        for ts in rec.tasks():
            role, partition = self.shuffle_tasks[ts][1:]
            self._shuffle_restrict(ts, self._shuffle_place_of(rec, role, partition))
        reason = f"P2P shuffle {rec.id} (run {rec.run})"
        self.add_pin(list(rec.participants), reason, rec.owner, None, stimulus_id)

    def _shuffle_restart(self, rec: ShuffleRecord, why: str, stimulus_id: str) -> None:
        rec.restarts += 1
        old = rec.participants
        self._shuffle_unpin(rec, stimulus_id, f"restarting: {why}")
        rec.run = self._next_shuffle_run()
        for address in old:  # the survivors drop the older runs' data
            if address in self.workers:
                self.comm.send_worker(address, m.ShuffleRestart(rec.id, rec.run, stimulus_id))
        rec.participants = tuple(a for a in old if a in self.runnable) or tuple(
            sorted(self.workers_with_time())
        )
        rec.done = {p for p in rec.done if rec.unpacks[p].state == "memory"}
        self._shuffle_event(
            {
                "action": "restart",
                "id": rec.id,
                "run": rec.run,
                "why": why,
                "participants": list(rec.participants),
            }
        )
        if rec.participants:
            self._shuffle_begin_run(rec, stimulus_id)
        else:  # nobody left: it starts afresh once a worker comes
            rec.running = False
            for ts in rec.tasks():
                self._shuffle_restrict(ts, rec.pending)
        # Every transfer runs again (its pieces went to the older run), then the barrier
        # and the unpacks not done; what runs now is released (its result discarded).
        again = [ts for ts in rec.transfers.values() if ts.state in ("memory", "processing")]
        self._transitions(dict.fromkeys(again, "released"), stimulus_id)
        barrier = rec.barrier
        if barrier is not None and barrier.state in ("memory", "processing"):
            self._transitions({barrier: "released"}, stimulus_id)
        running = [ts for ts in rec.unpacks.values() if ts.state == "processing"]
        self._transitions(dict.fromkeys(running, "released"), stimulus_id)

    def shuffle_fail(self, rec: ShuffleRecord, why: str, stimulus_id: str) -> None:
        """Give up on ``rec``: every unpack not done errs, saying ``why``."""
        self._shuffle_stop(rec, stimulus_id, f"failed: {why}")
        self._shuffle_event({"action": "failed", "id": rec.id, "run": rec.run, "why": why})
        barrier = rec.barrier
        if barrier is not None and barrier.state not in ("erred", "forgotten"):
            exc = RuntimeError(f"P2P shuffle {rec.id} failed: {why}")
            barrier.exception = error_payload(exc)
            barrier.traceback = ""
            barrier.exception_blame = None
            self._transitions({barrier: "erred"}, stimulus_id)

    def _shuffle_finish(self, rec: ShuffleRecord, stimulus_id: str) -> None:
        self._shuffle_stop(rec, stimulus_id, "finished")
        self._shuffle_event(
            {
                "action": "finish",
                "id": rec.id,
                "run": rec.run,
                "participants": list(rec.participants),
                "partitions": len(rec.unpacks),
                "restarts": rec.restarts,
                "bytes_moved": rec.sent,
                "bytes_spilled": rec.spilled,
            }
        )
        rec.restarts = 0
        rec.sent = rec.spilled = 0

    def _shuffle_stop(self, rec: ShuffleRecord, stimulus_id: str, why: str) -> None:
        """``rec`` no longer runs: unpin, tell its workers to drop its data, and park its
        tasks (should any run again, e.g. an unpack whose result was lost, it starts
        afresh)."""
        rec.running = False
        self._shuffle_unpin(rec, stimulus_id, why)
        for address in rec.participants:
            if address in self.workers:
                self.comm.send_worker(address, m.ShuffleForget(rec.id, rec.run, stimulus_id))
        for ts in rec.tasks():
            self._shuffle_restrict(ts, rec.pending)

    # ------------------------------------------------------------------ helpers

    def _shuffle_place_of(self, rec: ShuffleRecord, role: str, partition: int) -> Restrictions:
        if not rec.running:
            return rec.pending
        if role == "unpack":
            workers = [owner(partition, rec.participants)]
        else:
            workers = list(rec.participants)
        r = self._restrictions(m.TaskRestrictions(workers=workers), slotted=True)
        assert r is not None
        return r

    def _shuffle_restrict(self, ts: TaskState, r: Restrictions) -> None:
        if ts.restrictions is r:
            return
        if ts.state == "queued":  # it moves to the queue of its new restrictions
            self._dequeue(ts)
            ts.restrictions = r
            self._enqueue(ts)
        else:
            ts.restrictions = r

    def _shuffle_unpin(self, rec: ShuffleRecord, stimulus_id: str, why: str) -> None:
        self.release_pins_of(rec.owner, stimulus_id, why)

    def _shuffle_event(self, data: dict[str, Any]) -> None:
        self.log_event(P2P_TOPIC, data)
