"""Scheduler memory per task, no network: a dask-array-shaped graph of N tasks is
submitted to a ``SchedulerState`` (2 workers, a comm that drops every message), decoded
from real wire bytes, and the growth of the process is divided by N.

    python benchmarks/scheduler_memory.py [--n 1000000] [--chunk 10000]

The graph is ``da.ones(...).sum()`` in shape: ``("ones-<hex>", i)`` roots, one
``("sum-<hex>", 0, i)`` per root (one dependency), then a tree reduction
``("sum-<hex>", level, j)`` of 16 dependencies per node down to one key, which the
client wants. One function id is shared by every task; payloads are 40-100 bytes.

The wire bytes are made first, in a child process, so that building them leaves no
freed memory behind in the measuring process. Each measurement then runs in its own
child: one with tracemalloc (exact Python allocations, but slow, and tracemalloc's own
bookkeeping inflates RSS), one without (RSS growth, and ingestion time). Both use the
scheduler server's garbage collector settings.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc

import psutil

from shoal.core.scheduler.state import SchedulerState
from shoal.protocol import messages as m
from shoal.protocol.framing import decode_body, encode_body
from shoal.server.scheduler import tune_gc

FANIN = 16
FID = "5f2d0c4b9a8e7d6c5b4a3f2e"  # a 24-hex function id, as serialize.function_id makes
_LEN = struct.Struct("!Q")


class DropComm:
    """Drops every message: no cost beyond the message objects the core builds."""

    def send_worker(self, address: str, msg: m.Message) -> None:
        pass

    def send_client(self, client_id: str, msg: m.Message) -> None:
        pass


def graph(n: int) -> tuple[list[m.TaskSpec], m.TaskSpec]:
    """About ``n`` task specs (roots, one-dependency layer, reduction tree), and the
    final one."""
    rng = random.Random(0)
    nroots = max(1, round(n / (2 + 1 / (FANIN - 1))))
    ones = f"ones-{rng.getrandbits(128):032x}"
    total = f"sum-{rng.getrandbits(128):032x}"

    def payload() -> m.Payload:
        return m.Payload(0, rng.randbytes(rng.randint(40, 100)))

    specs = [m.TaskSpec((ones, i), FID, payload(), group=ones) for i in range(nroots)]
    level: list[m.Key] = [(total, 0, i) for i in range(nroots)]
    specs += [
        m.TaskSpec(key, FID, payload(), [(ones, i)], group=total) for i, key in enumerate(level)
    ]
    depth = 0
    while len(level) > 1:
        depth += 1
        nxt: list[m.Key] = []
        for j in range(0, len(level), FANIN):
            key = (total, depth, j // FANIN)
            specs.append(m.TaskSpec(key, FID, payload(), level[j : j + FANIN], group=total))
            nxt.append(key)
        level = nxt
    return specs, specs[-1]


def write_wire(n: int, chunk: int, path: str) -> int:
    """Encode the graph as SubmitTasks messages of ``chunk`` tasks, into ``path``."""
    specs, last = graph(n)
    with open(path, "wb") as f:
        for start in range(0, len(specs), chunk):
            part = specs[start : start + chunk]
            final = start + chunk >= len(specs)
            msg = m.SubmitTasks(
                part,
                [last.key] if final else [],
                {FID: b"pickled function" * 8} if start == 0 else {},
                f"submit-{start}",
            )
            body = encode_body([msg])
            f.write(_LEN.pack(len(body)))
            f.write(body)
    return len(specs)


def read_wire(path: str) -> list[memoryview]:
    with open(path, "rb") as f:
        data = memoryview(f.read())
    bodies, pos = [], 0
    while pos < len(data):
        (size,) = _LEN.unpack_from(data, pos)
        bodies.append(data[pos + 8 : pos + 8 + size])
        pos += 8 + size
    return bodies


def rss() -> int:
    return psutil.Process().memory_info().rss


def measure(path: str, trace: bool) -> dict[str, float]:
    bodies = read_wire(path)
    tune_gc()  # as the scheduler server does at startup
    s = SchedulerState(DropComm())
    s.add_worker("tcp://10.0.0.1:40001", "w1", 1, 2**30, "w1")
    s.add_worker("tcp://10.0.0.2:40001", "w2", 1, 2**30, "w2")
    s.add_client("client-1")
    gc.collect()
    if trace:
        tracemalloc.start()
    traced0, rss0 = (tracemalloc.get_traced_memory()[0] if trace else 0), rss()
    decoding = submitting = 0.0
    for body in bodies:
        t0 = time.perf_counter()
        (msg,) = decode_body(body)
        t1 = time.perf_counter()
        s.handle_client("client-1", msg)
        t2 = time.perf_counter()
        decoding += t1 - t0
        submitting += t2 - t1
        del msg
    gc.collect()
    n = len(s.tasks)
    out = {
        "n": n,
        "rss": (rss() - rss0) / n,
        "decode_us": decoding / n * 1e6,
        "submit_us": submitting / n * 1e6,
    }
    if trace:
        now, peak = tracemalloc.get_traced_memory()
        out.update(traced=(now - traced0) / n, peak=(peak - traced0) / n)
        tracemalloc.stop()
    roots = s.prefixes["ones"].states  # sanity: every root is queued or running
    assert roots["queued"] + roots["processing"] == s.prefixes["ones"].alive, roots
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="tasks (about)")
    p.add_argument("--chunk", type=int, default=10_000, help="tasks per SubmitTasks")
    p.add_argument("--no-trace", action="store_true", help="skip the (slow) tracemalloc run")
    p.add_argument("--child", choices=["write", "rss", "trace"], help=argparse.SUPPRESS)
    p.add_argument("--wire", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "write":
        write_wire(args.n, args.chunk, args.wire)
        return
    if args.child:
        print(json.dumps(measure(args.wire, args.child == "trace")))
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = [sys.executable, __file__, "--n", str(args.n), "--chunk", str(args.chunk)]
        run += ["--wire", os.path.join(tmp, "wire"), "--child"]
        subprocess.run([*run, "write"], check=True, env=env)
        for mode in ("rss",) if args.no_trace else ("rss", "trace"):
            out = subprocess.run(
                [*run, mode], check=True, env=env, stdout=subprocess.PIPE, text=True
            )
            results[mode] = json.loads(out.stdout)
    plain = results["rss"]
    print(f"{plain['n']:,} tasks, in SubmitTasks messages of {args.chunk:,}")
    if "trace" in results:
        traced = results["trace"]
        print(f"  {'tracemalloc, after - before':30s} {traced['traced']:8.0f} bytes/task")
        print(f"  {'tracemalloc, peak - before':30s} {traced['peak']:8.0f} bytes/task")
    print(f"  {'RSS, after - before':30s} {plain['rss']:8.0f} bytes/task")
    print(f"  {'decode_body':30s} {plain['decode_us']:8.2f} us/task")
    print(f"  {'handle_client(SubmitTasks)':30s} {plain['submit_us']:8.2f} us/task")


if __name__ == "__main__":
    main()
