"""What workers report about tasks (finished, erred, seceded, data they hold or could
not fetch, threads of released tasks now free): the worker-event half of
:class:`~shoal.core.scheduler.SchedulerState` (a mixin, as placement and membership).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shoal.core.comm import Comm
from shoal.core.scheduler.membership import Membership
from shoal.core.scheduler.model import TaskState, WorkerRecord
from shoal.core.scheduler.walltime import Walltime
from shoal.core.story import StoryLog
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

Recs = dict[TaskState, str]


class WorkerReports:
    """Handlers of the messages workers send about tasks."""

    tasks: dict[Key, TaskState]
    runnable: dict[str, WorkerRecord]
    free_workers: set[WorkerRecord]
    comm: Comm
    log: StoryLog

    if TYPE_CHECKING:

        def _transition(
            self, ts: TaskState, finish: str, stimulus_id: str, **kwargs: Any
        ) -> Recs: ...
        def _transitions(self, recs: Recs, stimulus_id: str) -> None: ...
        def _transition_processing_memory(
            self, ts: TaskState, stimulus_id: str, msg: m.TaskFinished
        ) -> Recs: ...
        def _record_transition(self, entry: tuple[Any, ...]) -> None: ...

        _actor_ids: dict[Key, str]
        transition_counter: int

        def _is_free(self, ws: WorkerRecord) -> bool: ...
        def _drained(self, ws: WorkerRecord, key: Key) -> bool: ...
        def _add_replica(self, ts: TaskState, ws: WorkerRecord, nbytes: int) -> None: ...
        def _remove_replica(self, ts: TaskState, ws: WorkerRecord) -> None: ...
        def _moves_arrived(self, ws: WorkerRecord, keys: list[Key], stimulus_id: str) -> None: ...

        moves: dict[TaskState, Any]

    def _task_finished(self, ws: WorkerRecord, msg: m.TaskFinished) -> None:
        ts = self.tasks.get(msg.key)
        run_id = msg.run_id
        if ts is not None and run_id != 0 and run_id != ts.run_id:  # _earlier_run, inlined
            return
        if ts is None or ts.processing_on is not ws:
            self._stale_result(ws, ts, msg.key, msg.nbytes, msg.stimulus_id)
            return
        if ts.waiting_on:
            # Sent ahead and its dependencies not reported yet: a worker runs it only
            # after them, and reports in order, so this result was not made from them.
            self.log.append((ts.key, "early-result", ws.address, msg.stimulus_id))
            return
        sid = msg.stimulus_id
        if self._actor_ids:
            recs = self._transition(ts, "memory", sid, msg=msg)
        else:  # processing on ``ws``, so "processing": _transition's work, without its dispatch
            self._record_transition((ts.key, "processing", "memory", sid))
            self.transition_counter += 1
            recs = self._transition_processing_memory(ts, sid, msg)
        self._transitions(recs, sid)

    def _task_seceded(self, ws: WorkerRecord, msg: m.TaskSeceded) -> None:
        """The task waits on others: its thread slot and expected time no longer count
        (its resources do: the worker keeps them held)."""
        ts = self.tasks.get(msg.key)
        if ts is None or ts.processing_on is not ws or ts in ws.long_running:
            return  # done, moved or told already
        ws.long_running.add(ts)
        ws.occupancy -= ts.estimate
        ts.estimate = 0.0
        if ws.address in self.runnable and self._is_free(ws):
            self.free_workers.add(ws)

    def _stale_result(
        self, ws: WorkerRecord, ts: TaskState | None, key: Key, nbytes: int, stimulus_id: str
    ) -> None:
        if ts is not None and ts.state == "memory":
            self._add_replica(ts, ws, nbytes)
        else:
            self.comm.send_worker(ws.address, m.FreeKeys([key], stimulus_id))

    def _task_erred(self, ws: WorkerRecord, msg: m.TaskErred) -> None:
        ts = self.tasks.get(msg.key)
        if ts is not None and _earlier_run(ts, msg.run_id):
            return
        if ts is None or ts.processing_on is not ws:
            self.comm.send_worker(ws.address, m.FreeKeys([msg.key], msg.stimulus_id))
            return
        if ts.retries > 0:
            ts.retries -= 1
            # its thread has ended: nothing to drain
            recs = self._transition(ts, "released", msg.stimulus_id, drain=False)
        else:
            recs = self._transition(ts, "erred", msg.stimulus_id, msg=msg)
        self._transitions(recs, msg.stimulus_id)

    def _add_keys(self, ws: WorkerRecord, msg: m.AddKeys) -> None:
        for key, nbytes in zip(msg.keys, msg.nbytes):
            ts = self.tasks.get(key)
            if ts is not None and ts.processing_on is ws:
                # Lost elsewhere and given to ``ws`` to compute while its copy was on the
                # way here: the worker answers that ComputeTask with TaskFinished, and a
                # FreeKeys now would reach it after, leaving a copy said to be there.
                continue
            self._stale_result(ws, ts, key, nbytes, msg.stimulus_id)
        if self.moves:  # copies a rebalance asked for: their senders may drop theirs
            self._moves_arrived(ws, msg.keys, msg.stimulus_id)

    def _missing_data(self, ws: WorkerRecord, msg: m.MissingData) -> None:
        """``ws`` could not fetch ``msg.missing`` from the holders it asked: treat those
        copies as lost (the holders are told to drop them), recompute what has no copy
        left, and run the task again (with the copies made since, if any)."""
        lost = []
        tried_by_key = msg.tried if msg.tried and len(msg.tried) == len(msg.missing) else None
        for i, key in enumerate(msg.missing):
            dts = self.tasks.get(key)
            if dts is None or dts.state != "memory":
                continue
            tried = None if tried_by_key is None else set(tried_by_key[i])
            for holder in list(dts.who_has):
                if holder is not ws and (tried is None or holder.address in tried):
                    self._remove_replica(dts, holder)
                    self.comm.send_worker(holder.address, m.FreeKeys([key], msg.stimulus_id))
            if not dts.who_has:
                lost.append(dts)
        # Lost keys are released first, so nothing is placed with a dependency held
        # nowhere (as in remove_worker); then the task runs again once they are back.
        recs: Recs = {}
        for dts in lost:
            recs.update(self._transition(dts, "released", msg.stimulus_id))
        ts = self.tasks.get(msg.key)
        if ts is not None and ts.processing_on is ws:  # the worker never started it
            recs.update(self._transition(ts, "released", msg.stimulus_id, drain=False))
        self._transitions(recs, msg.stimulus_id)

    def _compute_released(self, ws: WorkerRecord, msg: m.ComputeReleased) -> None:
        """A thread that ran a task released while it processed here is free."""
        if self._drained(ws, msg.key):
            self.log.append((msg.key, "drained", ws.address, msg.stimulus_id))

    _worker_handlers: dict[type, Callable[..., None]] = {
        m.TaskFinished: _task_finished,
        m.TaskSeceded: _task_seceded,
        m.TaskErred: _task_erred,
        m.AddKeys: _add_keys,
        m.MissingData: _missing_data,
        m.ComputeReleased: _compute_released,
        m.WorkerStatus: Membership._worker_status,
        m.KeyUnserializable: Membership._key_unserializable,
        m.WorkerLeaving: Walltime._walltime_leaving,
    }


def _earlier_run(ts: TaskState, run_id: int) -> bool:
    """The answer to an assignment of ``ts`` released since (a worker's result that
    crossed the FreeKeys sent for it, which the worker then drops): not a copy, nor a
    failure, of the current one."""
    return run_id != 0 and run_id != ts.run_id
