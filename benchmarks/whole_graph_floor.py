"""What a small graph would cost run whole by one worker (not part of shoal): the floor
of a design that sends a notebook cell's entire graph down a lane.

    python benchmarks/whole_graph_floor.py [--rounds 40] [--pause 0.05] [--only matmul,array_sum]

Per cell of the interactive benchmark that is a small array graph, three ways,
alternated compute by compute with ``--pause`` seconds after each, on a shoal
``LocalCluster`` of two one-thread worker processes:

* ``sync``: Dask's synchronous scheduler in this process (the bar's reference);
* ``shoal``: the cell through shoal as Dask's scheduler: its graph through the
  scheduler, spread over the workers, or (since this prototype led to it) sent whole
  by lane as tasks (``LaneRunGraph``) when the worker knows it is short;
* ``whole``: the collection itself as the argument of one task, sent by lane
  (``shoal/lanes``), which computes it with Dask's synchronous scheduler on the worker:
  Dask's optimisation, the graph and every task run there, in one thread, and only the
  result comes back. A prototype of the path, not the path: the collection is pickled
  whole (a real design would ship the graph's tasks), and nothing bounds how long the
  graph runs on one thread (a real design would need the tasks' durations, which only
  the scheduler knows).

Prints the medians and each way's ratio to sync. ``lane runs`` counts the ``whole``
computes that went by lane (all of them, unless the worker was busy); ``graph runs``
the ``shoal`` computes that went whole by lane.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Opaque:
    """Holds a collection so that Dask does not compute it as the task's dependency."""

    def __init__(self, collection: Any):
        self.collection = collection


def compute_here(box: Opaque) -> Any:
    """On the worker: the whole graph with Dask's synchronous scheduler."""
    return box.collection.compute(scheduler="sync")


def cells(quick: bool) -> dict[str, Any]:
    import dask.array as da

    rows = 200 if quick else 2000
    tall = da.random.default_rng(1).random((rows, 100), chunks=(rows // 10, 100))
    size = 100 if quick else 1000
    return {
        "matmul": tall.T @ tall,
        "array_sum": da.ones((size, size), chunks=size // 4).sum(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--pause", type=float, default=0.05)
    p.add_argument("--only", default="matmul,array_sum")
    p.add_argument("--quick", action="store_true", help="smaller arrays (a smoke test)")
    args = p.parse_args(argv)
    available = cells(args.quick)
    names = args.only.split(",")
    for name in names:
        if name not in available:
            p.error(f"unknown cell {name!r} (expected {', '.join(available)})")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")

    import numpy as np
    from dask import delayed

    from shoal import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        print(
            "| cell | sync ms | shoal ms | whole ms | shoal/sync | whole/sync | lane runs "
            "| graph runs |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name in names:
            collection = available[name]
            ways = {
                "sync": lambda c=collection: c.compute(scheduler="sync"),
                "shoal": lambda c=collection: c.compute(scheduler=client.get),
                "whole": lambda c=collection: delayed(compute_here)(Opaque(c)).compute(
                    scheduler=client.get
                ),
            }
            expected = ways["sync"]()
            for way, run in ways.items():  # warm-up; every way must give sync's result
                for _ in range(2):
                    if not np.allclose(run(), expected, rtol=1e-9):
                        raise SystemExit(f"{name}: {way} differs from sync")
            lanes = client._lanes
            runs, graphs = lanes.runs - lanes.graph_runs, lanes.graph_runs
            times: dict[str, list[float]] = {w: [] for w in ways}
            order = list(ways)
            for i in range(args.rounds):
                for way in order[i % 3 :] + order[: i % 3]:
                    t0 = time.perf_counter()
                    ways[way]()
                    times[way].append(time.perf_counter() - t0)
                    time.sleep(args.pause)
            ms = {w: statistics.median(t) * 1000 for w, t in times.items()}
            print(
                f"| {name} | {ms['sync']:.2f} | {ms['shoal']:.2f} | {ms['whole']:.2f} | "
                f"{ms['shoal'] / ms['sync']:.2f} | {ms['whole'] / ms['sync']:.2f} | "
                f"{lanes.runs - lanes.graph_runs - runs} | {lanes.graph_runs - graphs} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
