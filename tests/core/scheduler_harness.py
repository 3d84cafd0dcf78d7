"""A small driver for :class:`SchedulerState` in tests: no network, no threads.

Shared by ``test_scheduler*.py``. Every scheduler is built with ``validate=True``, so
each event is followed by a full invariant check.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from shoal.core.comm import RecordingComm
from shoal.core.scheduler.lanes import is_lane_run
from shoal.core.scheduler.model import TaskState, WorkerRecord
from shoal.core.scheduler.state import SchedulerState
from shoal.protocol.messages import (
    AddKeys,
    CancelKeys,
    ComputeReleased,
    ComputeTask,
    FreeKeys,
    Key,
    Message,
    MissingData,
    Payload,
    ReleaseCompute,
    ReleaseKeys,
    ScatterDone,
    SubmitTasks,
    TaskErred,
    TaskFinished,
    TaskRestrictions,
    TaskSpec,
    WantKeys,
)

ARGS = Payload(0, b"\x92\x90\x80")  # msgpack: ([], {})
EXC = Payload(1, b"an exception")
FUNCS = {"f": b"pickled f"}
W1, W2, W3 = "tcp://w1:1", "tcp://w2:1", "tcp://w3:1"


def addr(n: int) -> str:
    return f"tcp://w{n}:1"


class Sim:
    """A scheduler, a recording comm, and short verbs for the events a test needs."""

    def __init__(
        self,
        workers: Mapping[str, int] | None = None,
        clients: Iterable[str] = ("c",),
        ahead: bool = False,
    ):
        self.comm = RecordingComm()
        self.s = SchedulerState(self.comm, validate=True)
        if not ahead:
            # Scenario tests spell out the base placement's messages; placing ahead
            # (core/scheduler/ahead.py) has tests of its own, and the property tests.
            self.s.ahead_per_thread = 0
        self._sid = itertools.count()
        for client in clients:
            self.s.add_client(client)
        for address, nthreads in (workers if workers is not None else {W1: 1}).items():
            self.add_worker(address, nthreads)

    def sid(self, what: str) -> str:
        return f"{what}-{next(self._sid)}"

    # --- membership -----------------------------------------------------------------

    def add_worker(
        self,
        address: str,
        nthreads: int = 1,
        memory_limit: int = 2**30,
        resources: Mapping[str, float] | None = None,
        name: str | None = None,
        lifetime: float | None = None,
        max_tasks: int | None = None,
    ) -> None:
        name = address.split("//")[-1] if name is None else name
        self.s.add_worker(
            address,
            name,
            nthreads,
            memory_limit,
            "add-w",
            resources,
            lifetime=lifetime,
            max_tasks=max_tasks,
        )

    def remove_worker(self, address: str, sid: str = "remove-w") -> None:
        self.s.remove_worker(address, sid)

    # --- client events --------------------------------------------------------------

    def submit(
        self,
        dag: Mapping[Key, Iterable[Key]],
        wanted: Iterable[Key] | None = None,
        client: str = "c",
        *,
        priority: Mapping[Key, int] | None = None,
        retries: Mapping[Key, int] | None = None,
        func: Mapping[Key, str] | None = None,
        group: Mapping[Key, str] | None = None,
        restrictions: Mapping[Key, TaskRestrictions] | None = None,
        durations: Mapping[Key, float] | None = None,
        functions: Mapping[str, bytes] = FUNCS,
        sid: str = "submit",
    ) -> None:
        """Submit ``{key: [dependencies]}``; by default the client wants every key."""
        priority, retries = priority or {}, retries or {}
        func, group, restrictions = func or {}, group or {}, restrictions or {}
        durations = durations or {}
        specs = [
            TaskSpec(
                key,
                func.get(key, "f"),
                ARGS,
                list(deps),
                group=group.get(key, ""),
                priority=priority.get(key, 0),
                retries=retries.get(key, 0),
                restrictions=restrictions.get(key),
                duration=durations.get(key),
            )
            for key, deps in dag.items()
        ]
        wanted = list(dag) if wanted is None else list(wanted)
        self.s.handle_client(client, SubmitTasks(specs, wanted, dict(functions), sid))

    def release(self, *keys: Key, client: str = "c", sid: str = "release") -> None:
        self.s.handle_client(client, ReleaseKeys(list(keys), sid))

    def cancel(self, *keys: Key, client: str = "c", sid: str = "cancel") -> None:
        self.s.handle_client(client, CancelKeys(list(keys), sid))

    def want(self, *keys: Key, client: str = "c", sid: str = "want") -> None:
        self.s.handle_client(client, WantKeys(list(keys), sid))

    def scatter(
        self, worker: str, nbytes: Mapping[Key, int], client: str = "c", sid: str = "scatter"
    ) -> None:
        msg = ScatterDone(list(nbytes), list(nbytes.values()), worker, sid)
        self.s.handle_client(client, msg)

    # --- worker events --------------------------------------------------------------

    def worker_of(self, key: Key) -> str:
        ws = self.s.tasks[key].processing_on
        assert ws is not None, f"{key!r} is {self.state(key)}, not processing"
        return ws.address

    def finish(
        self,
        key: Key,
        nbytes: int = 8,
        duration: float = 1.0,
        worker: str | None = None,
        sid: str | None = None,
        value: Payload | None = None,
    ) -> None:
        """The worker ``key`` runs on (or ``worker``) reports it done."""
        worker = worker or self.worker_of(key)
        msg = TaskFinished(key, nbytes, 10.0, 10.0 + duration, value, "int", sid or f"done-{key}")
        self.s.handle_worker(worker, msg)

    def fail(self, key: Key, worker: str | None = None, sid: str | None = None) -> None:
        worker = worker or self.worker_of(key)
        msg = TaskErred(key, EXC, "Traceback ...", 10.0, 11.0, sid or f"erred-{key}")
        self.s.handle_worker(worker, msg)

    def add_keys(self, worker: str, nbytes: Mapping[Key, int], sid: str = "add-keys") -> None:
        self.s.handle_worker(worker, AddKeys(list(nbytes), list(nbytes.values()), sid))

    def missing(self, key: Key, *missing: Key, sid: str = "missing") -> None:
        self.s.handle_worker(self.worker_of(key), MissingData(key, list(missing), sid))

    def drain_all(self) -> None:
        """Every worker answers for every released task its threads were running (not
        for lanes' runs, which end with their own report)."""
        for address, ws in list(self.s.workers.items()):
            for key, n in list(ws.draining.items()):
                if not is_lane_run(key):
                    self.drained(address, *[key] * n)

    def run_all(self, limit: int = 10_000) -> list[Key]:
        """Finish processing tasks (in key order) until none is left, the workers
        answering for released tasks as they go; the keys run."""
        done = []
        for _ in range(limit):
            self.drain_all()
            processing = sorted(self.runnable(), key=repr)
            if not processing:
                return done
            self.finish(processing[0])
            done.append(processing[0])
        raise AssertionError("did not quiesce")

    # --- looking ----------------------------------------------------------------------

    def ts(self, key: Key) -> TaskState:
        return self.s.tasks[key]

    def ws(self, address: str) -> WorkerRecord:
        return self.s.workers[address]

    def state(self, key: Key) -> str:
        ts = self.s.tasks.get(key)
        return "forgotten" if ts is None else ts.state

    def states(self) -> dict[Key, str]:
        return {k: ts.state for k, ts in self.s.tasks.items()}

    def processing(self) -> list[Key]:
        return [k for k, ts in self.s.tasks.items() if ts.state == "processing"]

    def runnable(self) -> list[Key]:
        """Processing keys a worker could run now: not waiting ahead on a dependency."""
        return [
            k for k, ts in self.s.tasks.items() if ts.state == "processing" and not ts.waiting_on
        ]

    def on(self, address: str) -> set[Key]:
        """Keys processing on a worker."""
        return {ts.key for ts in self.s.workers[address].processing}

    def holds(self, address: str) -> set[Key]:
        return {ts.key for ts in self.s.workers[address].has_what}

    def to_worker(self, address: str) -> list[Message]:
        return self.comm.take_worker(address)

    def to_client(self, client: str = "c") -> list[Message]:
        return self.comm.take_client(client)

    def computes(self, address: str) -> list[Key]:
        """Keys sent to ``address`` in ComputeTask since the last take, in order."""
        return [msg.key for msg in self.to_worker(address) if isinstance(msg, ComputeTask)]

    def freed(self, address: str) -> list[Key]:
        """Keys ``address`` was told to drop (FreeKeys, or ReleaseCompute of a task it
        was processing) since the last take, in order."""
        out: list[Key] = []
        for msg in self.to_worker(address):
            if isinstance(msg, FreeKeys):
                out.extend(msg.keys)
            elif isinstance(msg, ReleaseCompute):
                out.append(msg.key)
        return out

    def drained(self, address: str, *keys: Key, sid: str = "drained") -> None:
        """``address`` answers that its threads no longer run these released keys."""
        self.s.handle_worker(address, *(ComputeReleased(k, sid) for k in keys))

    def clear(self) -> None:
        self.comm.clear()


def kinds(msgs: Iterable[Any]) -> list[str]:
    return [type(msg).__name__ for msg in msgs]
