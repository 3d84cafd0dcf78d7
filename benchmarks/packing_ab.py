"""Sibling packing on and off in one cluster, compute by compute (core/scheduler/packing.py),
or another placement rule with ``--rule``.

    python benchmarks/packing_ab.py [--repeat 30] [--only array_sum,matmul] [--quick]
        [--latency 0.002] [--rule packing|ahead-data|order-cache|worker-batch|lanes]
        [--pause 0]

The interactive cells on one shoal cluster (two worker processes of one thread) and
dask's sync scheduler in this process. Per round each cell is computed three ways, in
rotating order: sync; shoal with packing (the scheduler's ``transfer_latency`` at its
default, or ``--latency``); shoal with ``transfer_latency = 0`` (siblings spread as before the rule). The
switch is set through ``run_on_scheduler`` between computes, untimed. On a shared,
noisy machine this compares the rule alone under the same load, where runs of
``interactive.py`` against another checkout are minutes apart. Prints medians and the
shoal/sync ratios.

``--rule ahead-data`` switches instead whether a task goes ahead with more data in
memory elsewhere than moves within the transfer latency, when no other worker would
need less moved (core/scheduler/ahead.py, ``ahead_beyond_latency``): "on" with it,
"off" without. ``--rule order-cache`` switches the client's cache of ``dask.order``'s
orders (client/graph/order_cache.py): "on" the client's own, "off" one that remembers
nothing. ``--rule worker-batch`` is not a rule of shoal's but of Linux: every thread of
both worker processes under ``SCHED_BATCH`` ("on": a worker woken up never preempts the
process running, the scheduler or the client) or the default ``SCHED_OTHER`` ("off"),
set from this process with ``os.sched_setscheduler``. Tried for shoal's workers and not
kept: PROFILE-interactive.md, section 9. ``--rule lanes`` switches the client's lanes
(shoal/lanes): "on", a one-task get, or a small graph's, goes straight to the worker
the scheduler granted; "off", through the scheduler.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dask  # noqa: E402

from benchmarks.interactive import CELLS, FRAME100_ROWS, ROWS, SYNC_CONFIG, make_data  # noqa: E402
from shoal import Client, LocalCluster  # noqa: E402
from shoal.client.graph.order_cache import OrderCache  # noqa: E402
from shoal.core.scheduler.packing import TRANSFER_LATENCY  # noqa: E402

DEFAULT_CELLS = "array_sum,matmul,sum,array_mean0,delayed_sum"


def set_latency(latency: float, dask_scheduler: Any = None) -> None:
    dask_scheduler.state.transfer_latency = latency


def set_ahead_data(on: bool, dask_scheduler: Any = None) -> None:
    dask_scheduler.state.ahead_beyond_latency = on


def set_worker_policy(pids: list[int], policy: int) -> None:
    """``policy`` for every thread of the processes ``pids`` (Linux)."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.sched_setscheduler(int(tid), policy, os.sched_param(0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--only", default=DEFAULT_CELLS)
    p.add_argument("--quick", action="store_true", help="frames of 1/10 the rows")
    p.add_argument(
        "--pause", type=float, default=0.0, help="seconds after each compute (interactive's: 0.05)"
    )
    p.add_argument("--latency", type=float, default=TRANSFER_LATENCY, help="seconds, packing on")
    p.add_argument(
        "--rule",
        choices=("packing", "ahead-data", "order-cache", "worker-batch", "lanes"),
        default="packing",
    )
    args = p.parse_args(argv)
    if args.rule == "worker-batch" and not hasattr(os, "SCHED_BATCH"):
        p.error("--rule worker-batch needs Linux's SCHED_BATCH")
    if not args.latency > 0:
        p.error(f"--latency must be positive, got {args.latency}")
    if args.pause < 0:
        p.error(f"--pause must be at least 0, got {args.pause}")
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    for name in args.only.split(","):
        if name not in CELLS:
            p.error(f"unknown cell {name!r} (expected {', '.join(CELLS)})")
    warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
    shrink = 10 if args.quick else 1
    data = make_data(ROWS // shrink, FRAME100_ROWS // shrink)
    on, off = ("packed", "spread") if args.rule == "packing" else ("on", "off")
    ways = ("sync", on, off)
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        orders = {on: client._orders, off: OrderCache(max_tasks=0)}
        workers = list(client.run(os.getpid).values()) if args.rule == "worker-batch" else []

        def compute(way: str, collection: Any) -> float:
            if way == "sync":
                config: dict[str, Any] = dict(SYNC_CONFIG)
            else:
                if args.rule == "packing":
                    client.run_on_scheduler(set_latency, args.latency if way == on else 0.0)
                elif args.rule == "ahead-data":
                    client.run_on_scheduler(set_ahead_data, way == on)
                elif args.rule == "worker-batch":
                    set_worker_policy(workers, os.SCHED_BATCH if way == on else os.SCHED_OTHER)
                elif args.rule == "lanes":
                    client._lanes.enabled = way == on
                else:
                    client._orders = orders[way]
                config = {"scheduler": client.get}
            with dask.config.set(config):
                t0 = time.perf_counter()
                collection.compute()
                return time.perf_counter() - t0

        print(f"load average {os.getloadavg()}; rule {args.rule}", flush=True)
        if args.rule == "packing":
            print(f"packed: latency {args.latency:g} s", flush=True)
        print(f"| cell | sync ms | {on} ms | {off} ms | {on}/sync | {off}/sync | {on}/{off} |")
        print("|---|---|---|---|---|---|---|")
        for name in args.only.split(","):
            collection = CELLS[name].build(data)
            for way in ways:  # warm-up: imports, and each prefix's duration measured
                compute(way, collection)
            times: dict[str, list[float]] = {w: [] for w in ways}
            for i in range(args.repeat):
                for j in range(len(ways)):
                    way = ways[(i + j) % len(ways)]
                    times[way].append(compute(way, collection))
                    time.sleep(args.pause)
            ms = {w: statistics.median(t) * 1000 for w, t in times.items()}
            print(
                f"| {name} | {ms['sync']:.2f} | {ms[on]:.2f} | {ms[off]:.2f} | "
                f"{ms[on] / ms['sync']:.2f} | {ms[off] / ms['sync']:.2f} | "
                f"{ms[on] / ms[off]:.3f} |",
                flush=True,
            )
        if workers:
            set_worker_policy(workers, os.SCHED_OTHER)
        print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
