"""Dependencies fetched from peers: the transfer half of
:class:`~shoal.core.worker.state.WorkerState` (a mixin, as the release half).

- ``_ensure_communicating`` asks peers for the keys in ``fetch``, one GatherDep per
  peer at a time, at most ``transfer_limit`` peers, and no further transfer while the
  bytes on their way reach a tenth of the memory limit (they count against memory
  before they land). A dependency larger than the memory limit is never asked for.
- A GatherDep ends in ``GatherSuccess`` (values, keys the peer lacks, keys whose data
  cannot be had for good) or ``GatherFailure`` (the peer could not be reached).
- Data that cannot be had for good (the holder cannot pickle it, we cannot unpickle
  it, it is too large for us) is never stood in for, and never reported missing (the
  scheduler would recompute it, and it would fail to come again): the tasks here that
  need it err once, blamed on it.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from shoal.core.errors import error_payload
from shoal.core.worker.events import (
    GatherDep,
    GatherFailure,
    GatherSuccess,
    Instruction,
    SendMessage,
    TransferError,
)
from shoal.protocol import messages as m
from shoal.protocol.messages import ComputeTask, Key

if TYPE_CHECKING:
    from shoal.core.worker.state import WTask


def _order(ts: WTask) -> tuple[tuple[int, ...], str]:
    """A deterministic order for the rare paths that iterate a set of tasks."""
    return ts.priority, repr(ts.key)


def _unindex(index: dict[str, dict[WTask, None]], worker: str, ts: WTask) -> None:
    tasks = index[worker]
    del tasks[ts]
    if not tasks:
        del index[worker]


class Fetching:
    """Transfer methods of :class:`WorkerState`."""

    address: str
    tasks: dict[Key, WTask]
    data: MutableMapping[Key, Any]
    paused: bool
    memory_limit: int
    transfer_limit: int
    transfer_bytes_limit: int
    transfer_incoming_limit: int
    _out: list[Instruction]
    _to_release: list[WTask]
    _data_needed: dict[str, dict[WTask, None]]
    _has_what: dict[str, dict[WTask, None]]
    _in_flight: dict[str, list[WTask]]
    _in_flight_bytes: dict[str, int]
    _log: Callable[[tuple[Any, ...]], None]  # the story's append

    if TYPE_CHECKING:

        def _transition(self, ts: WTask, finish: str, sid: str) -> None: ...
        def _release(self, ts: WTask, sid: str) -> None: ...
        def _forget_cancelled(self, ts: WTask, sid: str) -> None: ...
        def _handle_compute(self, ev: ComputeTask, sid: str = "") -> None: ...
        def _add_who_has(self, ts: WTask, workers: list[str]) -> None: ...

    @property
    def incoming_bytes(self) -> int:
        """Bytes of dependencies asked of peers and not yet arrived (by their sizes as
        the scheduler knows them): memory this worker is about to use."""
        return sum(self._in_flight_bytes.values())

    def _handle_gather_success(self, ev: GatherSuccess) -> None:
        worker, sid, data = ev.worker, ev.stimulus_id, ev.data
        keys: list[Key] = []
        nbytes: list[int] = []
        lost: list[WTask] = []
        self._in_flight_bytes.pop(worker, None)
        for ts in self._in_flight.pop(worker, ()):
            if ts.coming_from != worker:
                continue  # scattered or forgotten meanwhile
            key = ts.key
            self._log((key, "GatherSuccess", sid))
            failure = ev.failed.get(key) if ev.failed else None
            if failure is not None:
                if ts.state == "cancelled":
                    self._forget_cancelled(ts, sid)
                else:
                    self._transfer_failed(ts, worker, failure, sid)
            elif key not in data:
                if worker in ts.who_has:
                    ts.who_has.discard(worker)
                    _unindex(self._has_what, worker, ts)
                _missed(ts, worker)
                self._gather_missed(ts, sid, lost)
            elif ts.state == "cancelled":
                self._forget_cancelled(ts, sid)
            else:
                self.data[key] = data[key]
                nb = ts.nbytes = ev.nbytes.get(key, ts.nbytes)
                resume, ts.resume = ts.resume, None
                ts.wanted = True  # the scheduler learns of it below
                self._transition(ts, "memory", sid)
                if resume is not None:  # it was asked to compute it: report it done
                    msg = m.TaskFinished(key, nb, 0.0, 0.0, stimulus_id=sid, run_id=resume.run_id)
                    self._out.append(SendMessage(msg, sid))
                else:
                    keys.append(key)
                    nbytes.append(nb)
        if keys:
            self._out.append(SendMessage(m.AddKeys(keys, nbytes, sid), sid))
        self._lost(lost, sid)

    def _handle_gather_failure(self, ev: GatherFailure) -> None:
        worker, sid = ev.worker, ev.stimulus_id
        lost: list[WTask] = []
        self._in_flight_bytes.pop(worker, None)
        self._data_needed.pop(worker, None)
        for ts in self._has_what.pop(worker, ()):  # the peer is gone for every task
            ts.who_has.discard(worker)
            _missed(ts, worker)
            if ts.state == "fetch" and not ts.who_has:
                self._log((ts.key, "GatherFailure", sid))
                self._transition(ts, "released", sid)
                lost.append(ts)
        for ts in self._in_flight.pop(worker, ()):
            if ts.coming_from == worker:
                self._log((ts.key, "GatherFailure", sid))
                _missed(ts, worker)
                self._gather_missed(ts, sid, lost)
        self._lost(lost, sid)

    def _gather_missed(self, ts: WTask, sid: str, lost: list[WTask]) -> None:
        """``ts`` (in flight or cancelled) did not come from the peer asked."""
        if ts.state == "cancelled":
            self._forget_cancelled(ts, sid)
        elif ts.resume is not None:  # the scheduler asked us to compute it: do so
            ev, ts.resume = ts.resume, None
            self._transition(ts, "released", sid)
            self._handle_compute(ev, sid)
        elif ts.who_has:
            self._transition(ts, "fetch", sid)
        else:
            self._transition(ts, "released", sid)
            lost.append(ts)

    def _transfer_failed(self, ts: WTask, holder: str, failure: TransferError, sid: str) -> None:
        """The data of ``ts`` (in fetch or flight) cannot be had here, for good. Nothing
        stands in for it, and it is not reported missing (the scheduler would recompute
        it, and it would fail to come again): the tasks here that need it err once, with
        the exception, blamed on it. Asked to compute it meanwhile, we do. (A holder that
        cannot pickle it tells the scheduler itself, which errs the key.)"""
        self._log((ts.key, "TransferError", failure.reason, sid))
        if ts.resume is not None:
            ev, ts.resume = ts.resume, None
            self._transition(ts, "released", sid)
            self._handle_compute(ev, sid)
            return
        dependents = sorted(ts.dependents, key=_order)
        ts.wanted = False  # a copy asked for (CopyKeys) that cannot be had
        self._transition(ts, "released", sid)
        for dependent in dependents:
            if dependent.state != "waiting":
                continue
            self._transition(dependent, "error", sid)
            if dependent.wanted:
                err = m.TaskErred(
                    dependent.key,
                    failure.exception,
                    "",
                    stimulus_id=sid,
                    blamed=ts.key,
                    run_id=dependent.run_id,
                )
                self._out.append(SendMessage(err, sid))
        self._to_release.append(ts)

    def _lost(self, lost: list[WTask], sid: str) -> None:
        """No peer holds these (released) keys: give up their dependents."""
        by_dependent: dict[WTask, list[WTask]] = {}
        for ts in lost:
            for dependent in sorted(ts.dependents, key=_order):
                by_dependent.setdefault(dependent, []).append(ts)
            ts.wanted = False  # a copy asked for (CopyKeys) that could not be had
            self._to_release.append(ts)
        for dependent, deps in by_dependent.items():
            keys = [d.key for d in deps]
            tried = [list(d.missed_on) for d in deps]
            msg = m.MissingData(dependent.key, keys, sid, tried)
            self._out.append(SendMessage(msg, sid))
            dependent.wanted = False  # the scheduler reschedules it
            dependent.resume = None
            self._release(dependent, sid)
        for ts in lost:
            ts.missed_on = ()  # reported

    def _ensure_communicating(self, sid: str) -> None:
        if self.paused:  # fetched data would add to the memory that paused us
            return
        needed, in_flight = self._data_needed, self._in_flight
        while needed and len(in_flight) < self.transfer_limit and not self._incoming_full():
            # the first idle peer with wanted keys; at most transfer_limit are busy
            worker = next((w for w in needed if w not in in_flight), None)
            if worker is None:
                return
            batch: list[WTask] = []
            too_big: list[WTask] = []
            total = 0
            limit = self.memory_limit
            for ts in needed[worker]:
                if limit and ts.nbytes > limit:
                    too_big.append(ts)
                    continue
                if batch and total + ts.nbytes > self.transfer_bytes_limit:
                    break
                batch.append(ts)
                total += ts.nbytes
            for ts in too_big:
                self._refuse_too_big(ts, worker, sid)
            if not batch:
                continue
            in_flight[worker] = batch
            self._in_flight_bytes[worker] = total
            for ts in batch:
                ts.coming_from = worker
                self._transition(ts, "flight", sid)
            self._out.append(GatherDep(worker, [ts.key for ts in batch], total, sid))

    def _incoming_full(self) -> bool:
        """Enough bytes are on their way: start no further transfer until some land."""
        limit = self.transfer_incoming_limit
        return bool(limit and self._in_flight and self.incoming_bytes >= limit)

    def _refuse_too_big(self, ts: WTask, holder: str, sid: str) -> None:
        what = f"the data of {ts.key!r} ({ts.nbytes} bytes, on {holder})"
        exc = MemoryError(
            f"{what} is larger than the memory limit of worker {self.address} "
            f"({self.memory_limit} bytes): it cannot be fetched there"
        )
        reason = f"{ts.nbytes} bytes, over the memory limit of {self.memory_limit} bytes"
        self._transfer_failed(ts, holder, TransferError(reason, error_payload(exc)), sid)


def _missed(ts: WTask, worker: str) -> None:
    """``worker`` was asked for ``ts`` and did not deliver it."""
    if worker not in ts.missed_on:
        ts.missed_on += (worker,)
