"""The scheduler's CPU per task in graph_scale's running phase, without processes.

    PYTHONPATH=. python benchmarks/sched_replay.py [--chunks 75000] [--repeat 3] [--batch 20]

The graph is graph_scale's ``(da.ones((c,), chunks=1) + 1).sum()`` (75,000 chunks:
100,003 tasks), encoded as a client sends it: in parts of ``PART_SIZE`` tasks, in its
submission order, as wire bytes. A ``SchedulerState`` (the server's garbage
collector settings) ingests all parts but the last untimed, then the last part starts
the graph on two simulated one-thread workers: each round, each worker reports up to
``--batch`` of the tasks it was sent whose dependencies are done, best priority first,
as one decoded frame of ``TaskFinished``. Timed (process CPU): the last part, and per
worker frame the core's handling and the encoding of the messages it sends back. Not
timed: the sockets, the event loop, and the simulated workers.

Unlike ``core_overhead.py`` (independent tasks and a binary tree, one submission), this
has the real graph's shape, parts (each part is a submission: its roots rank after the
previous part's) and messages. Absolute figures move with the machine's load: compare
two trees alternated (``PYTHONPATH=<tree>``), medians of several runs.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import statistics
import time
from typing import Any


def encoded_graph(chunks: int) -> tuple[list[bytes], int]:
    """(the SubmitTasks frames' bodies, the task count)."""
    import dask.array as da
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    from shoal.client.graph.blockwise_expand import materialize
    from shoal.client.graph.collections import PART_SIZE, _flatten
    from shoal.client.graph.dask_graph import GraphEncoder, cull
    from shoal.client.graph.order import order_bound, submission_order
    from shoal.protocol import messages as m
    from shoal.protocol.framing import encode_body
    from shoal.protocol.serialize import FunctionTable

    expr = FinalizeCompute(collections_to_expr([(da.ones((chunks,), chunks=1) + 1).sum()], True))
    expr = expr.optimize()
    dsk, _ = materialize(expr)
    keys = list(_flatten(expr.__dask_keys__()))
    dsk = cull(dsk, keys)
    table = FunctionTable()
    encoder = GraphEncoder(table, {})
    encoder.start_graph()
    specs = [encoder.task_spec(k, dsk[k]) for k in submission_order(dsk, order_bound())]
    bodies = []
    for start in range(0, len(specs), PART_SIZE):
        last = start + PART_SIZE >= len(specs)
        part = specs[start : start + PART_SIZE]
        functions = dict(table.bytes) if start == 0 else {}
        msg = m.SubmitTasks(part, keys if last else [], functions, "submit", not last)
        bodies.append(encode_body([msg]))
    return bodies, len(specs)


class Outbox:
    """The scheduler's Comm: messages per worker, until the end of the frame."""

    def __init__(self) -> None:
        self.out: dict[str, list[Any]] = {}

    def send_worker(self, address: str, msg: Any) -> None:
        self.out.setdefault(address, []).append(msg)

    def send_client(self, client_id: str, msg: Any) -> None:
        pass


def run(bodies: list[bytes], n: int, batch: int) -> float:
    """Scheduler CPU seconds to run the graph once."""
    from shoal.core.scheduler.state import SchedulerState
    from shoal.protocol import messages as m
    from shoal.protocol.framing import decode_body, encode_body

    comm = Outbox()
    s = SchedulerState(comm)
    addresses = ["tcp://w0:1", "tcp://w1:1"]
    for address in addresses:
        s.add_worker(address, address, 1, 0, "w")
    s.add_client("c")
    for body in bodies[:-1]:
        s.handle_client("c", *decode_body(body))
    gc.collect()
    # (priority, key, dependency keys, run_id) of the tasks each worker was sent
    sent: dict[str, list[tuple[Any, ...]]] = {a: [] for a in addresses}
    done: set[Any] = set()
    clock = time.process_time

    def write_out() -> None:  # the server encodes a frame per worker
        for address, msgs in comm.out.items():
            encode_body(msgs)
            for msg in msgs:
                if type(msg) is m.ComputeTask:
                    deps = [d.key for d in msg.deps]
                    heapq.heappush(sent[address], (msg.priority, msg.key, deps, msg.run_id))
        comm.out.clear()

    t0 = clock()
    s.handle_client("c", *decode_body(bodies[-1]))  # the last part starts the graph
    write_out()
    cpu = clock() - t0
    finished = 0
    while any(sent.values()):
        progressed = False
        for address in addresses:
            heap, report, blocked = sent[address], [], []
            while heap and len(report) < batch:
                prio, key, deps, run_id = heapq.heappop(heap)
                if all(d in done for d in deps):
                    done.add(key)
                    report.append(m.TaskFinished(key, 8, 1.0, 1.00002, None, "int", "", run_id))
                else:
                    blocked.append((prio, key, deps, run_id))
            for item in blocked:
                heapq.heappush(heap, item)
            if not report:
                continue
            progressed = True
            finished += len(report)
            body = encode_body(report)
            t0 = clock()
            s.handle_worker(address, *decode_body(body))
            write_out()
            cpu += clock() - t0
        if not progressed:
            raise AssertionError("no simulated worker can run any task it holds")
    if finished != n:
        raise AssertionError(f"{finished} tasks finished of {n}")
    return cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=75_000, help="chunks (roots) of the graph")
    p.add_argument("--repeat", type=int, default=3, help="runs")
    p.add_argument("--batch", type=int, default=20, help="TaskFinished per worker frame")
    args = p.parse_args()
    from shoal.server.scheduler import tune_gc

    bodies, n = encoded_graph(args.chunks)
    tune_gc()
    runs = [run(bodies, n, args.batch) / n * 1e6 for _ in range(args.repeat)]
    print(
        f"{n:,} tasks, batch {args.batch}: scheduler {statistics.median(runs):.2f} µs/task "
        f"(median; runs {', '.join(f'{r:.2f}' for r in runs)}); load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
