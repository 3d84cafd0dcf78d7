"""Clients' graphs and wants: the ingestion half of
:class:`~shoal.core.scheduler.SchedulerState` (a mixin, like placement).

- ``SubmitTasks`` adds new tasks (a graph may come in parts, ``more``: nothing runs
  until its last part); a task that depends on a key that exists nowhere, names a
  function its client never sent, or is on or after a dependency cycle errs at once.
  A released task resubmitted with its payload is computed again.
- A client *wants* keys (``wanted``, ``WantKeys``): it is told when each is in memory
  or erred; ``ReleaseKeys`` and ``CancelKeys`` (with everything built on the keys) let
  go of them, and tasks nobody wants or waits on are released or forgotten.
- ``ScatterDone``: data a client put on a worker is a task in memory there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.comm import Comm
from shoal.core.errors import error_payload
from shoal.core.scheduler.model import (
    ClientRecord,
    TaskGroup,
    TaskState,
    WorkerRecord,
    added,
    discarded,
    task_rank,
)
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

Recs = dict[TaskState, str]
START_SLICE = 4096  # tasks of a graph in parts started per batch of recommendations


def _task_functions(spec: m.TaskSpec, shared: dict[Any, Any]) -> str | tuple[str, ...]:
    """The function id a task calls, or a tuple of it and the ids its payload uses (a
    plain str for the common single-function task keeps the record small). Ids and
    tuples are the scheduler's shared copies, not one per task."""
    if not spec.funcs:
        return shared.get(spec.func, spec.func)
    ids = tuple(dict.fromkeys(shared.get(f, f) for f in (spec.func, *spec.funcs)))
    return shared.setdefault(ids, ids)


def _downstream(tasks: Iterable[TaskState]) -> set[TaskState]:
    """``tasks`` and every task that depends on them, directly or not."""
    seen = set(tasks)
    stack = list(seen)
    while stack:
        for dts in stack.pop().dependents:
            if dts not in seen:
                seen.add(dts)
                stack.append(dts)
    return seen


def _fids_of(func: str | tuple[str, ...]) -> tuple[str, ...]:
    if type(func) is str:
        return (func,) if func else ()
    return func  # type: ignore[return-value]


class Submission:
    """Submission and client-want methods of :class:`~shoal.core.scheduler.SchedulerState`."""

    tasks: dict[Key, TaskState]
    workers: dict[str, WorkerRecord]
    functions: dict[str, bytes]
    _function_ids: dict[Any, Any]
    _generation: Any
    _interrupting: bool
    hints: dict[TaskState, float]
    comm: Comm

    if TYPE_CHECKING:
        from shoal.core.scheduler.placement import Restrictions
        from shoal.protocol.messages import ShuffleMark, TaskRestrictions

        def _group(self, name: Any) -> TaskGroup: ...
        def _restrictions(
            self, spec: TaskRestrictions, slotted: bool = False
        ) -> Restrictions | None: ...
        def _shuffle_task_added(self, ts: TaskState, mark: ShuffleMark) -> None: ...
        def _transitions(self, recs: Recs, stimulus_id: str) -> None: ...
        def _report_erred(
            self, ts: TaskState, clients: Iterable[ClientRecord], stimulus_id: str
        ) -> None: ...
        def _lost_data_error(self, ts: TaskState, stimulus_id: str) -> None: ...
        def _add_replica(self, ts: TaskState, ws: WorkerRecord, nbytes: int) -> None: ...
        def _set_memory(self, ts: TaskState, stimulus_id: str) -> None: ...

    def _submit_tasks(self, cs: ClientRecord, msg: m.SubmitTasks) -> None:
        stimulus_id = msg.stimulus_id
        self.functions.update(msg.functions)
        fids = self._function_ids
        for fid in msg.functions:
            fids.setdefault(fid, fid)
        generation = next(self._generation)
        tasks = self.tasks
        new: list[tuple[TaskState, list[Key]]] = []
        # Equal payloads are one object: a layer's tasks often carry the same bytes (its
        # function and arguments, with no per-task value), ~500 bytes each. Per message,
        # so the table never outlives the part it deduplicates.
        payloads: dict[m.Payload, m.Payload] = {}
        # A layer's tasks call the same functions: resolved once per run of equal specs.
        last_func: tuple[str, list[str]] | None = None
        func: str | tuple[str, ...] = ""
        for i, spec in enumerate(msg.tasks):
            key = spec.key
            ts = tasks.get(key)
            if ts is None:
                group = self._group(spec.group or key)
                if group.owner is None:
                    group.owner = cs  # whose tasks' output it is (core/scheduler/output.py)
                if type(key) is tuple and key and key[0] == group.name:
                    # The group's copy of the name, not one per key (~90 bytes each).
                    key = (group.name, *key[1:])
                if last_func is None or spec.func != last_func[0] or spec.funcs != last_func[1]:
                    func, last_func = _task_functions(spec, fids), (spec.func, spec.funcs)
                ts = TaskState(
                    key,
                    func,
                    payloads.setdefault(spec.payload, spec.payload),
                    group,
                    task_rank(spec.priority, generation, i),
                    spec.retries,
                )
                if spec.restrictions is not None:
                    ts.restrictions = self._restrictions(spec.restrictions)
                if spec.duration is not None:
                    self.hints[ts] = spec.duration
                if spec.shuffle is not None:
                    self._shuffle_task_added(ts, spec.shuffle)
                tasks[key] = ts
                new.append((ts, spec.deps))
            elif ts.payload is None and ts.state == "released":
                ts.func, ts.payload = _task_functions(spec, fids), spec.payload
                if spec.restrictions is not None:
                    ts.restrictions = self._restrictions(spec.restrictions)
        recs: Recs = {}
        errs: Recs = {}
        unsent_of: dict[int, list[str]] = {}  # by id of the shared function ids
        linked = False  # whether any new task depends on another task
        for ts, deps in new:
            missing = []
            if deps:
                linked = True
                found = []
                for dk in deps:
                    dts = tasks.get(dk)
                    if dts is None:
                        missing.append(dk)
                    else:
                        found.append(dts)
                # A key named twice is one dependency.
                ts.dependencies = tuple(dict.fromkeys(found) if len(found) > 1 else found)
                only = None  # (ts,): one tuple for every dependency it is the only dependent of
                for dts in ts.dependencies:
                    if dts.dependents:
                        dts.dependents = added(dts.dependents, ts)
                    else:
                        if only is None:
                            only = (ts,)
                        dts.dependents = only
            unsent = unsent_of.get(id(ts.func))
            if unsent is None:
                unsent = [fid for fid in _fids_of(ts.func) if fid not in self.functions]
                unsent_of[id(ts.func)] = unsent
            if missing or unsent:
                if missing:
                    problem = f"depends on keys that exist nowhere: {missing!r}"
                else:
                    problem = f"names function {unsent[0]!r}, which its client never sent"
                ts.exception = ts.refused = error_payload(
                    ValueError(f"task {ts.key!r} {problem}")
                )
                errs[ts] = "erred"
            else:
                recs[ts] = "waiting"
        if linked:  # (a cycle needs dependencies: independent tasks, often one, have none)
            self._refuse_cycles([ts for ts, _ in new], recs, errs)
        del new
        if cs.partial is None and not msg.more:  # a graph in one message
            self._want_submitted(cs, msg.wanted, recs, errs, stimulus_id)
            return
        # A graph in parts: until its last part, its new tasks to wait are a list (8
        # bytes a task, where a dict of recommendations would cost ~42 and double in
        # size at the peak); every recommendation of a part is "waiting".
        if cs.partial is None:
            cs.partial = ([], {})
        arriving, all_errs = cs.partial
        arriving.extend(recs)  # extended in place: no copy per part
        all_errs.update(errs)
        del recs, errs
        if msg.more:
            return
        cs.partial = None
        if not msg.wanted:  # the client gave up on the graph
            self._transitions(dict.fromkeys([*arriving, *all_errs], "forgotten"), stimulus_id)
            return
        self._want_submitted(cs, msg.wanted, {}, all_errs, stimulus_id, arriving)

    def _want_submitted(
        self,
        cs: ClientRecord,
        wanted: list[Key],
        recs: Recs,
        errs: Recs,
        stimulus_id: str,
        arriving: list[TaskState] | None = None,
    ) -> None:
        """The end of a submission: its client wants ``wanted``; the new tasks start
        (``recs``, and ``arriving``: those of the earlier parts of a graph in parts)."""
        tasks = self.tasks
        for key in wanted:
            ts = tasks.get(key)
            if ts is None:
                self.comm.send_client(cs.id, m.KeyCancelled(key, "not submitted", stimulus_id))
                continue
            self._want(cs, ts, stimulus_id)
            if ts.state == "released" and ts not in recs and ts not in errs:
                # Known but released: compute it again. Named in ``arriving`` too, it is
                # started once: a task no longer released is skipped below.
                recs[ts] = "waiting"
        # Errors first: a dependent's "waiting" would otherwise overwrite its dependency's
        # "erred" and run it; dependents of failed tasks then are erred, not started.
        # Nobody wants them, they are released again at once, their error forgotten:
        # so they, and what they err, are kept from starting here ("doomed").
        doomed = _downstream(errs) if errs else None
        self._transitions(errs, stimulus_id)
        for ts in [ts for ts in recs if ts.state != "released" or (doomed and ts in doomed)]:
            del recs[ts]  # in place: the graph's tasks are not copied at the peak
        self._transitions(recs, stimulus_id)
        # The earlier parts' tasks, a slice at a time from the end (the order one dict
        # of them all would be popped in), so their recommendations never are all held
        # at once. A task already started through a dependent's recommendation (one in
        # a later slice) is skipped.
        while arriving:
            start = max(0, len(arriving) - START_SLICE)
            batch = {
                ts: "waiting"
                for ts in arriving[start:]
                if ts.state == "released" and not (doomed and ts in doomed)
            }
            del arriving[start:]
            self._transitions(batch, stimulus_id)

    def _refuse_cycles(self, new: list[TaskState], recs: Recs, errs: Recs) -> None:
        """Err every new task on, or downstream of, a dependency cycle.

        Only new tasks can form a cycle (older ones cannot depend on them). Kahn's
        algorithm over the new tasks: whatever never becomes free is cyclic. Their
        links to each other are cut, so they can be forgotten like any erred task."""
        if not new:
            return
        pending = {ts: 0 for ts in new}
        for ts in new:
            for dts in ts.dependencies:
                if dts in pending:
                    pending[ts] += 1
        free = [ts for ts, n in pending.items() if n == 0]
        while free:
            ts = free.pop()
            del pending[ts]
            for dts in ts.dependents:
                if dts in pending:
                    pending[dts] -= 1
                    if pending[dts] == 0:
                        free.append(dts)
        if not pending:
            return
        keys = sorted(repr(ts.key) for ts in pending)
        shown = ", ".join(keys[:20]) + (", ..." if len(keys) > 20 else "")
        for ts in pending:
            cut = [dts for dts in ts.dependencies if dts in pending]
            if cut:
                ts.dependencies = tuple(d for d in ts.dependencies if d not in pending)
                for dts in cut:
                    dts.dependents = discarded(dts.dependents, ts)
        for ts in pending:
            problem = f"is on or after a dependency cycle among the keys {shown}"
            ts.exception = ts.refused = error_payload(ValueError(f"task {ts.key!r} {problem}"))
            recs.pop(ts, None)
            errs[ts] = "erred"

    def _want(self, cs: ClientRecord, ts: TaskState, stimulus_id: str) -> None:
        ts.who_wants = added(ts.who_wants, cs)
        cs.wants.add(ts)
        if ts.state == "memory":
            self.comm.send_client(
                cs.id,
                m.KeyInMemory(
                    ts.key,
                    None,
                    ts.type_name,
                    stimulus_id=stimulus_id,
                    who_has=[ws.address for ws in ts.who_has],
                ),
            )
        elif ts.state == "erred":
            self._report_erred(ts, [cs], stimulus_id)

    def _want_keys(self, cs: ClientRecord, msg: m.WantKeys) -> None:
        recs: Recs = {}
        for key in msg.keys:
            ts = self.tasks.get(key)
            if ts is None:
                self.comm.send_client(
                    cs.id, m.KeyCancelled(key, "unknown to the scheduler", msg.stimulus_id)
                )
                continue
            self._want(cs, ts, msg.stimulus_id)
            if ts.state == "released":
                recs[ts] = "waiting"
        self._transitions(recs, msg.stimulus_id)

    def _release_keys(self, cs: ClientRecord, msg: m.ReleaseKeys) -> None:
        # Only what this client wants: another's graph being submitted in parts is
        # wanted by nobody yet, and must not be forgotten under it.
        tasks = [ts for k in msg.keys if (ts := self.tasks.get(k)) is not None and ts in cs.wants]
        self._release_wants(cs, tasks, msg.stimulus_id)

    def _release_wants(
        self, cs: ClientRecord, tasks: Iterable[TaskState], stimulus_id: str
    ) -> None:
        recs: Recs = {}
        for ts in tasks:
            ts.who_wants = discarded(ts.who_wants, cs)
            cs.wants.discard(ts)
            if not ts.who_wants and not ts.waiters:
                recs[ts] = "forgotten" if not ts.dependents else "released"
        self._transitions(recs, stimulus_id)

    def _cancel_keys(self, cs: ClientRecord, msg: m.CancelKeys) -> None:
        # Cancelling a key cancels, for this client, everything built on it. With
        # ``force``, what it releases while it runs is interrupted on its worker.
        seen: set[TaskState] = set()
        stack = [self.tasks[k] for k in msg.keys if k in self.tasks]
        while stack:
            ts = stack.pop()
            if ts in seen:
                continue
            seen.add(ts)
            stack.extend(ts.dependents)
        cancelled = [ts for ts in seen if cs in ts.who_wants]
        for ts in cancelled:
            self.comm.send_client(cs.id, m.KeyCancelled(ts.key, "cancelled", msg.stimulus_id))
        self._interrupting = msg.force
        try:
            self._release_wants(cs, cancelled, msg.stimulus_id)
        finally:
            self._interrupting = False

    def _scatter_done(self, cs: ClientRecord, msg: m.ScatterDone) -> None:
        ws = self.workers.get(msg.worker)
        for key, nbytes in zip(msg.keys, msg.nbytes):
            ts = self.tasks.get(key)
            if ts is None:
                ts = TaskState(key, "", None, self._group(key))
                self.tasks[key] = ts
            if ws is None:  # the worker left meanwhile: this copy is gone
                if ts.state == "released" and ts.payload is None:  # and it was the only one
                    ts.who_wants = added(ts.who_wants, cs)
                    cs.wants.add(ts)
                    self._lost_data_error(ts, msg.stimulus_id)
                else:  # held elsewhere, or computable: as if the client just wanted it
                    self._want(cs, ts, msg.stimulus_id)
                    if ts.state == "released":
                        self._transitions({ts: "waiting"}, msg.stimulus_id)
                continue
            if ts.state in ("memory", "released"):
                self._add_replica(ts, ws, nbytes)
                if ts.state == "released":
                    self._set_memory(ts, msg.stimulus_id)
            else:  # a computed task of that key is on its way; keep the data as a replica
                self.comm.send_worker(ws.address, m.FreeKeys([key], msg.stimulus_id))
            self._want(cs, ts, msg.stimulus_id)
