"""Scheduler core cost per task, no network: submit, run, finish and release N
independent tasks on W workers, plus a reduction tree. Prints microseconds per task,
also with a no-op scheduler plugin ``transition`` hook watching (each batch's
transitions handed to it, as the server does).

    python benchmarks/core_overhead.py [N]
"""

from __future__ import annotations

import sys
import time

from shoal.core.scheduler.state import SchedulerState
from shoal.plugins import SchedulerPlugin
from shoal.plugins.registry import PluginRegistry
from shoal.protocol import messages as m

ARGS = m.Payload(0, b"\x92\x91\x01\x80")


class NoOpTransitions(SchedulerPlugin):
    def transition(self, key: object, start: str, finish: str, *args: object, **kw: object) -> None:
        pass


class NullComm:
    def __init__(self) -> None:
        self.computes: list[m.ComputeTask] = []

    def send_worker(self, address: str, msg: m.Message) -> None:
        if type(msg) is m.ComputeTask:
            self.computes.append(msg)

    def send_client(self, client_id: str, msg: m.Message) -> None:
        pass


def run(n: int, workers: int = 2, deps: bool = False, watched: bool = False) -> float:
    comm = NullComm()
    s = SchedulerState(comm)
    feed: list[tuple[object, ...]] = []
    registry = PluginRegistry("scheduler", print, lambda coro: None)
    if watched:
        registry.add("noop", NoOpTransitions())
        s.watch_transitions(feed)

    def flush() -> None:  # what SchedulerPlugins does after each batch
        if feed:
            entries = feed[:]
            feed.clear()
            registry.dispatch_transitions(entries)

    for i in range(workers):
        s.add_worker(f"tcp://w{i}:1", f"w{i}", 1, 0, "w")
    s.add_client("c")
    if deps:  # a pairwise reduction tree
        specs, level, k = [], [f"leaf-{i}" for i in range(n)], 0
        specs = [m.TaskSpec(key, "f", ARGS) for key in level]
        while len(level) > 1:
            nxt = []
            for a, b in zip(level[::2], level[1::2]):
                k += 1
                specs.append(m.TaskSpec(f"add-{k}", "f", ARGS, [a, b]))
                nxt.append(f"add-{k}")
            level = nxt
        wanted = level
    else:
        specs = [m.TaskSpec(f"inc-{i}", "f", ARGS, group="inc") for i in range(n)]
        wanted = [s.key for s in specs]
    where = {}
    t0 = time.perf_counter()
    s.handle_client("c", m.SubmitTasks(specs, wanted, {"f": b"F"}, "submit"))
    flush()
    done = 0
    while comm.computes:
        batch, comm.computes = comm.computes, []
        by_worker: dict[str, list[m.Message]] = {}
        for msg in batch:
            ts = s.tasks[msg.key]
            addr = ts.processing_on.address
            by_worker.setdefault(addr, []).append(m.TaskFinished(msg.key, 8, 0.0, 1e-6))
            where[msg.key] = addr
        for addr, msgs in by_worker.items():
            for i in range(0, len(msgs), 50):  # ~50 completions per frame
                s.handle_worker(addr, *msgs[i : i + 50])
                flush()
        done += len(batch)
    s.handle_client("c", m.ReleaseKeys(wanted, "release"))
    flush()
    dt = time.perf_counter() - t0
    assert not s.tasks, len(s.tasks)
    return dt / len(specs) * 1e6


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    for label, kw in [("independent", {}), ("tree", {"deps": True})]:
        for watched in (False, True):
            best = min(run(n, watched=watched, **kw) for _ in range(3))
            name = label + (" + no-op transition plugin" if watched else "")
            print(f"{name:40s} {best:6.1f} us/task")
