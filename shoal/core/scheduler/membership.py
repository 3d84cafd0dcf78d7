"""Workers joining, pausing, going silent, dying and retiring: the membership half of
:class:`~shoal.core.scheduler.SchedulerState` (a mixin, like placement).

- A worker that dies (its connection drops, its nanny reports it, or its heartbeats
  stop for longer than the TTL) is removed: its running tasks go back to be placed
  elsewhere, keys only it held are recomputed (or err, if they cannot be). A task that
  was running on ``allowed_failures + 1`` workers that died errs with KilledWorker.
- A paused worker (memory over its pause fraction) and a retiring one keep their data
  and finish what they run, but are given nothing new.
- Retirement (``RetireWorkers``) copies every key only the retiring worker holds to
  another worker, waits for its running tasks, then closes it; nothing counts as a
  failure. It is refused, and the worker keeps working, when no other worker can
  take its data.
- A worker that leaves on its own (``WorkerLeaving``: SIGTERM, a restart it wants)
  gives up its running tasks at once (they go elsewhere), and, with ``retire``, has
  the keys only it holds copied off first (when no other worker is left to take them,
  they are lost with it: recomputed). Then it is told ``CloseWorker``. Its removal,
  however it comes (that message, its connection closing, its nanny's report), is
  expected: nothing counts against ``allowed_failures``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from shoal.core.comm import Comm
from shoal.core.errors import error_payload
from shoal.core.scheduler.model import ClientRecord, TaskState, WorkerRecord, discarded
from shoal.core.story import StoryLog
from shoal.protocol import messages as m
from shoal.protocol.errors import KilledWorker
from shoal.protocol.messages import Key
from shoal.protocol.serialize import SerializationError

Recs = dict[TaskState, str]

DEFAULT_ALLOWED_FAILURES = 3
DEFAULT_WORKER_TTL = 300.0  # seconds without a heartbeat before a worker is removed
DEFAULT_SCHEDULER_TIMEOUT = 120.0  # seconds a worker or client waits for a heartbeat reply
COPY_RETRY = 10.0  # seconds before a copy off a retiring worker is asked for again
MAX_DEATH_REASONS = 10_000


def heartbeat_interval(n_workers: int) -> float:
    """How often each worker beats: every 0.5 s in small clusters, then slower, so that
    the scheduler answers about 50 heartbeats a second however many workers there are
    (at 100 workers every 2 s, as Dask; at 1,000 every 20 s). Nothing urgent waits for
    a heartbeat: a worker reports a pause at once, and enforces its memory limits
    itself; busy workers prove they are alive with every message."""
    return max(0.5, n_workers / 50)


class Retirement:
    """One ``RetireWorkers`` request, answered once all of its workers are gone."""

    __slots__ = ("client_id", "request_id", "pending", "retired", "refused", "close")

    def __init__(self, client_id: str, request_id: int, close: bool):
        self.client_id = client_id
        self.request_id = request_id
        self.close = close
        self.pending: set[str] = set()
        self.retired: list[str] = []
        self.refused: dict[str, str] = {}


class Membership:
    """Membership methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    tasks: dict[Key, TaskState]
    workers: dict[str, WorkerRecord]
    runnable: dict[str, WorkerRecord]
    version: int
    total_nbytes: int
    clients: dict[str, ClientRecord]
    comm: Comm
    log: StoryLog
    wall_time: float

    if TYPE_CHECKING:

        def _index_worker(self, ws: WorkerRecord) -> None: ...
        def _unindex_worker(self, ws: WorkerRecord) -> None: ...
        def _remove_processing(self, ts: TaskState) -> WorkerRecord | None: ...
        def _remove_replica(self, ts: TaskState, ws: WorkerRecord) -> None: ...
        def _transition(self, ts: TaskState, finish: str, stimulus_id: str) -> Recs: ...
        def _transitions(self, recs: Recs, stimulus_id: str) -> None: ...
        def _done(self, stimulus_id: str) -> None: ...
        def _let_waiting_leave(self) -> None: ...

        moves: dict[TaskState, Any]

        waiting_to_leave: dict[str, Any]
        def _unpin_worker(self, ws: WorkerRecord, stimulus_id: str, why: str) -> None: ...
        closed_lanes: dict[str, Any]
        def _lanes_worker_removed(self, address: str) -> None: ...
        def pinned_why(self, ws: WorkerRecord) -> str: ...
        def _shuffle_worker_removed(self, address: str, reason: str, stimulus_id: str) -> None: ...

        shuffles: dict[str, Any]

    def _init_membership(self, allowed_failures: int, worker_ttl: float) -> None:
        self.allowed_failures = allowed_failures
        self.worker_ttl = worker_ttl
        # Tasks that were running on a worker that died -> those workers (cleared when
        # the task is forgotten); only such tasks have an entry.
        self.suspicious: dict[TaskState, list[str]] = {}
        self.retiring: dict[str, Retirement] = {}  # worker address -> its request
        self.leaving: dict[str, str] = {}  # workers that said they go (WorkerLeaving) -> why
        # Why workers died, when it was known (a nanny's report: "killed for memory..."),
        # for KilledWorker's message; the oldest are dropped past MAX_DEATH_REASONS.
        self.death_reasons: dict[str, str] = {}
        self._copies: dict[TaskState, tuple[WorkerRecord, float]] = {}  # key -> to, when
        self._now = 0.0  # the latest time an event carried
        self.heartbeats = 0  # worker heartbeats applied: their telemetry changed
        self.total_threads = 0  # over the workers, kept as they come and go
        self.total_memory = 0
        self.total_nbytes = 0  # results held, over the workers
        # Retirements that scale/adapt started (no client waits for them): a scale-up
        # may cancel them while their worker is still there. Address -> the status
        # ("running" or "paused") the worker goes back to then, as it last reported.
        self.scaling_down: dict[str, str] = {}
        # Told ("add" or "remove", address, stimulus_id) of every worker that joins or
        # is removed, however it goes (plugins' add_worker / remove_worker hooks).
        self._worker_watch: Callable[[tuple[str, str, str]], None] | None = None

    def watch_workers(self, sink: Callable[[tuple[str, str, str]], None] | None) -> None:
        self._worker_watch = sink

    # ------------------------------------------------------------------ joining and leaving

    def add_worker(
        self,
        address: str,
        name: str,
        nthreads: int,
        memory_limit: int,
        stimulus_id: str,
        resources: Mapping[str, float] | None = None,
        pid: int = 0,
        now: float = 0.0,
        lifetime: float | None = None,
        max_tasks: int | None = None,
        http_address: str = "",
    ) -> WorkerRecord:
        """``lifetime``: seconds it has left (its deadline is that much past the latest
        ``tick``); ``max_tasks``: how many tasks it may be given (walltime.py);
        ``http_address``: where it serves ``/metrics``, if anywhere."""
        if address in self.workers:
            raise ValueError(f"a worker at {address} is already registered")
        if lifetime is not None and not lifetime >= 0:
            raise ValueError(f"a worker's remaining lifetime is >= 0 seconds, not {lifetime}")
        if max_tasks is not None and max_tasks < 0:
            raise ValueError(f"a worker's task budget is >= 0, not {max_tasks}")
        self._now = max(self._now, now)
        deadline = None if lifetime is None else self.wall_time + lifetime
        ws = WorkerRecord(
            address, name, nthreads, memory_limit, resources, pid, now, deadline, max_tasks
        )
        ws.http_address = http_address
        self.workers[address] = ws
        self.total_threads += nthreads
        self.total_memory += memory_limit
        self.version += 1
        self._index_worker(ws)
        self.log.append(("worker-added", address, stimulus_id))
        if self._worker_watch is not None:
            self._worker_watch(("add", address, stimulus_id))
        if self.waiting_to_leave:  # walltime leavers may hand it their results now
            self._let_waiting_leave()
        # Tasks that could not be placed without workers may go now.
        self._done(stimulus_id)
        return ws

    def remove_worker(
        self, address: str, stimulus_id: str, reason: str = "", expected: bool = False
    ) -> None:
        """``address`` is gone. Unless ``expected`` (it retired), the tasks it was
        running count it as a death: past ``allowed_failures`` they err with
        KilledWorker instead of running a further time."""
        ws = self.workers.pop(address, None)
        if ws is None:
            return
        if self.leaving.pop(address, None) is not None:
            expected = True  # it said it was going: its tasks did not kill it
        self.total_threads -= ws.nthreads
        self.total_memory -= ws.memory_limit
        self.version += 1
        if address in self.runnable:
            self._unindex_worker(ws)
        self.log.append(("worker-removed", address, reason or "", stimulus_id))
        if self._worker_watch is not None:
            self._worker_watch(("remove", address, stimulus_id))
        if ws.pins:
            self._unpin_worker(ws, stimulus_id, reason or "removed")
        if address in self.closed_lanes:  # (its open lanes closed as it was unindexed)
            self._lanes_worker_removed(address)
        self.scaling_down.pop(address, None)
        self.waiting_to_leave.pop(address, None)
        retirement = self.retiring.pop(address, None)
        if retirement is not None:
            self._retirement_over(retirement, address, None if expected else reason or "it died")
        if reason and not expected and ws.processing:
            self.death_reasons[address] = reason
            while len(self.death_reasons) > MAX_DEATH_REASONS:
                del self.death_reasons[next(iter(self.death_reasons))]
        recs: Recs = {}
        for ts in sorted(ws.processing, key=_by_priority):
            self._remove_processing(ts)  # first, so no FreeKeys goes to the gone worker
            # (a task waiting ahead never ran there: no suspicion)
            if not expected and not ts.waiting_on and self._killed_too_often(ts, address):
                recs[ts] = "erred"
            else:
                recs.update(self._transition(ts, "released", stimulus_id))
        lost = []
        for ts in ws.has_what:
            ts.who_has = discarded(ts.who_has, ws)
            if not ts.who_has and ts.state == "memory":
                lost.append(ts)
        ws.has_what = set()
        self.total_nbytes -= ws.nbytes
        ws.nbytes = 0
        # Every lost key is released before anything is placed again: a recommendation
        # could otherwise send a task off with a dependency still "in memory" nowhere.
        for ts in lost:
            recs.update(self._transition(ts, "released", stimulus_id))
        self._transitions(recs, stimulus_id)
        if self.shuffles:  # shuffles it took part in restart (before anything is placed)
            self._shuffle_worker_removed(address, reason, stimulus_id)
        self._done(stimulus_id)

    def _killed_too_often(self, ts: TaskState, address: str) -> bool:
        """Count one more death under ``ts``; if it is one too many, set its error."""
        died_on = self.suspicious.setdefault(ts, [])
        died_on.append(address)
        if len(died_on) <= self.allowed_failures:
            return False
        reasons = {a: self.death_reasons[a] for a in died_on if a in self.death_reasons}
        exc = KilledWorker(ts.key, died_on, self.allowed_failures, reasons)
        ts.exception = error_payload(exc)
        ts.traceback = ""
        ts.exception_blame = None
        return True

    # ------------------------------------------------------------------ status and liveness

    def _worker_status(self, ws: WorkerRecord, msg: m.WorkerStatus) -> None:
        if msg.status not in ("paused", "running"):
            raise TypeError(f"unknown worker status {msg.status!r}")
        self.log.append(("worker-status", ws.address, msg.status, msg.stimulus_id))
        self.version += 1
        if ws.status == "retiring":
            if ws.address in self.scaling_down:
                self.scaling_down[ws.address] = msg.status  # if its retirement is cancelled
            return  # stays out of placement until it is gone
        if msg.status == "paused" and ws.status == "running":
            ws.status = "paused"
            self._unindex_worker(ws)
        elif msg.status == "running" and ws.status == "paused":
            ws.status = "running"
            self._index_worker(ws)  # queued work may go to it again at the end of the batch

    def heartbeat(self, address: str, msg: m.Heartbeat, now: float) -> float:
        """A worker is alive; returns the interval at which it should beat."""
        self._now = max(self._now, now)
        ws = self.workers.get(address)
        if ws is not None:
            self.heartbeats += 1
            ws.last_seen = now
            ws.memory = msg.memory
            ws.spilled = msg.spilled
            ws.transferred_in = msg.transferred_in
            ws.transferred_out = msg.transferred_out
            ws.cpu = msg.cpu
            ws.net_in = msg.net_in
            ws.net_out = msg.net_out
            ws.memory_pause = msg.memory_pause
            ws.memory_terminate = msg.memory_terminate
            ws.history.append((now, msg.memory, msg.cpu, msg.spilled))
            if address in self.retiring:
                self._retry_copies(ws)
                self._done(f"heartbeat-{address}")
            elif self.moves:  # rebalance moves past their time are given up
                self._done(f"heartbeat-{address}")
        return heartbeat_interval(len(self.workers))

    def worker_ttl_now(self) -> float:
        """The TTL in force: the configured one, but at least a few heartbeats long."""
        return max(self.worker_ttl, 4 * heartbeat_interval(len(self.workers)))

    def check_heartbeats(self, now: float, stimulus_id: str) -> list[str]:
        """Remove every worker silent for longer than the TTL; return their addresses."""
        self._now = max(self._now, now)
        ttl = self.worker_ttl_now()
        silent = [ws for ws in self.workers.values() if now - ws.last_seen > ttl]
        for ws in silent:
            seconds = now - ws.last_seen
            reason = f"no heartbeat for {seconds:.1f}s (TTL {ttl:.1f}s)"
            self.remove_worker(ws.address, stimulus_id, reason)
        return [ws.address for ws in silent]

    # ------------------------------------------------------------------ unusable results

    def _key_unserializable(self, ws: WorkerRecord, msg: m.KeyUnserializable) -> None:
        """``ws`` could not pickle a result (to send or spill it) and dropped it: the
        task errs with the reason, unless another worker holds a copy."""
        ts = self.tasks.get(msg.key)
        if ts is None or ws not in ts.who_has:
            return
        self._remove_replica(ts, ws)
        if ts.who_has or ts.state != "memory":
            return
        exc = SerializationError(f"the result of {ts.key!r} cannot be pickled: {msg.reason}")
        ts.exception = error_payload(exc)
        ts.traceback = ""
        ts.exception_blame = None
        self._transitions(self._transition(ts, "erred", msg.stimulus_id), msg.stimulus_id)

    # ------------------------------------------------------------------ retirement

    def _retire_workers(self, cs: ClientRecord, msg: m.RetireWorkers) -> None:
        sid = f"retire-{cs.id}-{msg.request_id}"
        req = Retirement(cs.id, msg.request_id, msg.close)
        chosen: dict[str, WorkerRecord] = {}
        for name in msg.workers:
            ws = self._find_worker(name)
            if ws is None:
                req.refused[name] = "no such worker"
            elif ws.address in self.retiring:
                req.refused[name] = "already retiring"
            elif ws.pins and not msg.ignore_pins:
                req.refused[name] = self.pinned_why(ws)
            else:
                chosen[ws.address] = ws
        stay = [ws for ws in self.runnable.values() if ws.address not in chosen]
        if chosen and not stay:
            for address in chosen:
                req.refused[address] = "no other running worker could take its data"
            chosen = {}
        if chosen:
            unique = sum(ts.nbytes for ws in chosen.values() for ts in _only_here(ws))
            room = sum(max(0, ws.memory_limit - ws.nbytes) for ws in stay)
            if unique > room and all(ws.memory_limit for ws in stay):
                why = f"the other workers have room for {room} of the {unique} bytes only it holds"
                for address in chosen:
                    req.refused[address] = why
                chosen = {}
        for address, ws in chosen.items():
            self.log.append(("worker-retiring", address, sid))
            if ws.pins:  # retired although pinned (ignore_pins): it leaves its pins now
                self._unpin_worker(ws, sid, "retired ignoring pins")
            if ws.status != "paused":
                self._unindex_worker(ws)
            ws.status = "retiring"
            self.version += 1
            self.retiring[address] = req
            req.pending.add(address)
        if not req.pending:
            self._reply_retirement(req)
        self._advance_retirements(sid)

    def _worker_leaving(self, ws: WorkerRecord, msg: m.WorkerLeaving) -> None:
        """``ws`` goes away on its own: its running tasks go elsewhere now; with
        ``retire`` its unique keys are copied off first; then it is told to close."""
        sid = msg.stimulus_id
        address = ws.address
        self.log.append(("worker-leaving", address, msg.reason, msg.retire, sid))
        self.leaving[address] = msg.reason
        if ws.status != "retiring":
            if address in self.runnable:
                self._unindex_worker(ws)
            if msg.retire:
                ws.status = "retiring"
                req = Retirement("", 0, close=True)  # nobody to answer
                req.pending.add(address)
                self.retiring[address] = req
            self.version += 1
        recs: Recs = {}
        for ts in sorted(ws.processing, key=_by_priority):
            recs.update(self._transition(ts, "released", sid))  # FreeKeys to it too
        self._transitions(recs, sid)
        if msg.retire:
            self._advance_retirements(sid)
        else:
            close = m.CloseWorker(f"removed as it asked: {msg.reason}", sid)
            self.comm.send_worker(address, close)
            self.remove_worker(address, sid, f"left: {msg.reason}", expected=True)

    def _find_worker(self, name: str) -> WorkerRecord | None:
        ws = self.workers.get(name)
        if ws is not None:
            return ws
        for ws in self.workers.values():
            if name == ws.name or name == ws.address.split("://", 1)[-1]:
                return ws
        return None

    def _advance_retirements(self, stimulus_id: str) -> None:
        """Copy what only a retiring worker holds; close it once nothing is left."""
        for ts in [ts for ts in self._copies if ts.state != "memory" or len(ts.who_has) != 1]:
            del self._copies[ts]  # arrived, or no longer needed
        for address in list(self.retiring):
            ws = self.workers.get(address)
            if ws is None or address not in self.retiring:
                continue  # retired by a nested call meanwhile
            pending = [ts for ts in _only_here(ws) if ts not in self._copies]
            if pending:
                self._copy_off(ws, pending, stimulus_id)
            # A worker leaving on its own goes even when nobody is left to take its keys.
            lost = address in self.leaving and not self._copy_targets()
            if lost or (not ws.processing and not any(True for _ in _only_here(ws))):
                req = self.retiring[address]
                if req.close:
                    self.comm.send_worker(address, m.CloseWorker("retired", stimulus_id))
                self.remove_worker(address, stimulus_id, "retired", expected=True)
        if not self.retiring:
            self._copies.clear()

    def _copy_off(self, ws: WorkerRecord, keys: Iterable[TaskState], stimulus_id: str) -> None:
        """Ask other workers to fetch ``keys`` from ``ws``: each to the one with the
        fewest bytes (counting what it is asked for here)."""
        stay = self._copy_targets()
        if not stay:  # they all left meanwhile: the keys will be lost with it
            return
        load = {w: w.nbytes for w in stay}
        asks: dict[WorkerRecord, list[m.DepInfo]] = {}
        for ts in keys:
            to = min(stay, key=lambda w: (load[w], w.address))
            load[to] += ts.nbytes
            asks.setdefault(to, []).append(m.DepInfo(ts.key, ts.nbytes, [ws.address]))
            self._copies[ts] = (to, self._now)
        for to, deps in asks.items():
            self.comm.send_worker(to.address, m.CopyKeys(deps, stimulus_id))

    def _copy_targets(self) -> list[WorkerRecord]:
        return [w for w in self.runnable.values() if w.address not in self.retiring]

    def _retry_copies(self, ws: WorkerRecord) -> None:
        """Forget copies whose recipient left or that took too long: asked again."""
        for ts in _only_here(ws):
            entry = self._copies.get(ts)
            if entry is not None:
                to, when = entry
                if to.address not in self.runnable or self._now - when > COPY_RETRY:
                    del self._copies[ts]

    # ------------------------------------------------------------------ retirement for scaling

    def retire_for_scaling(self, workers: Iterable[WorkerRecord], stimulus_id: str) -> None:
        """Retire ``workers`` (chosen by ``workers_to_close``: they may go) as a
        ``RetireWorkers`` would, with nobody to answer; until each is closed, a
        scale-up may cancel its retirement (``cancel_retirement``)."""
        req = Retirement("", 0, close=True)
        for ws in workers:
            if ws.address in self.retiring or self.workers.get(ws.address) is not ws:
                continue
            self.log.append(("worker-retiring", ws.address, stimulus_id))
            self.scaling_down[ws.address] = "paused" if ws.status == "paused" else "running"
            if ws.status == "running":
                self._unindex_worker(ws)
            ws.status = "retiring"
            self.version += 1
            self.retiring[ws.address] = req
            req.pending.add(ws.address)
        self._advance_retirements(stimulus_id)

    def cancel_retirement(self, address: str, stimulus_id: str) -> bool:
        """A scale-up wants the retiring worker ``address`` after all: if scaling
        started its retirement and it is still there, it goes back to work (what was
        already copied off stays as replicas). False if it cannot be cancelled."""
        status = self.scaling_down.get(address)
        ws = self.workers.get(address)
        if status is None or ws is None or address in self.leaving:
            return False
        del self.scaling_down[address]
        req = self.retiring.pop(address)
        req.pending.discard(address)
        for ts in ws.has_what:
            self._copies.pop(ts, None)  # asked of others from here: no longer waited for
        self.log.append(("worker-retirement-cancelled", address, stimulus_id))
        ws.status = status
        self.version += 1
        if status == "running":
            self._index_worker(ws)
        self._done(stimulus_id)
        return True

    def _retirement_over(self, req: Retirement, address: str, failure: str | None) -> None:
        req.pending.discard(address)
        if failure is None:
            req.retired.append(address)
        else:
            req.refused[address] = f"it left before retiring: {failure}"
        if not req.pending:
            self._reply_retirement(req)

    def _reply_retirement(self, req: Retirement) -> None:
        if req.client_id in self.clients:
            msg = m.RetireReply(req.request_id, req.retired, req.refused)
            self.comm.send_client(req.client_id, msg)


def _only_here(ws: WorkerRecord) -> Iterable[TaskState]:
    """The keys in memory that no other worker holds."""
    for ts in ws.has_what:
        if ts.state == "memory" and len(ts.who_has) == 1:
            yield ts


def _by_priority(ts: TaskState) -> Any:
    return ts.rank
