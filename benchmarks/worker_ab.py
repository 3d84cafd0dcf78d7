"""A/B of two shoal code trees' schedulers and workers under the same load: one client
process starts one cluster per tree (its processes import that tree, through
``PYTHONPATH``) and alternates the same computes between them, compute by compute.

For changes on the worker/scheduler side only (the client is this process's shoal)::

    python benchmarks/worker_ab.py --a /work/main --b "$PWD"

Prints the median ms of each compute per tree and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import dask


def inc(x: int) -> int:
    return x + 1


def nap(x: int) -> int:
    time.sleep(0.005)  # a task of a few ms, off the CPU: what waits is the hand-off
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="code tree A (a PYTHONPATH)")
    ap.add_argument("--b", required=True, help="code tree B")
    ap.add_argument("--repeat", type=int, default=20, help="alternated computes per case")
    ap.add_argument("--only", default="", help="comma-separated cases")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.interactive import CELLS, make_data
    from shoal import Client, LocalCluster

    data = make_data(200_000, 100_000)  # --quick's sizes
    cases: dict[str, Any] = {
        name: CELLS[name].build
        for name in ("sum", "array_sum", "delayed_sum", "array_mean0", "merge", "matmul")
    }
    cases["chain50"] = "chain"
    cases["map2000"] = "map"
    cases["nap200"] = "nap"
    if args.only:
        cases = {k: v for k, v in cases.items() if k in args.only.split(",")}
    clusters, clients = {}, {}
    saved = os.environ.get("PYTHONPATH")
    try:
        for label, tree in (("A", args.a), ("B", args.b)):
            os.environ["PYTHONPATH"] = tree  # the cluster's processes import this tree
            clusters[label] = LocalCluster(n_workers=2, threads_per_worker=1)
            clients[label] = Client(clusters[label], set_as_default=False)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved

    def run(label: str, case: str, n: int) -> float:
        client = clients[label]
        build = cases[case]
        t0 = time.perf_counter()
        if build == "chain":
            f = client.submit(inc, 0, key=f"c-{label}-{n}-0")
            for i in range(1, 50):
                f = client.submit(inc, f, key=f"c-{label}-{n}-{i}")
            f.result()
        elif build == "nap":
            client.gather(
                client.map(nap, range(200), key=[f"n-{label}-{n}-{i}" for i in range(200)])
            )
        elif build == "map":
            client.gather(
                client.map(inc, range(2000), key=[f"m-{label}-{n}-{i}" for i in range(2000)])
            )
        else:
            with dask.config.set(scheduler=client.get):
                build(data).compute()
        return time.perf_counter() - t0

    times: dict[str, dict[str, list[float]]] = {c: {"A": [], "B": []} for c in cases}
    loads = []
    try:
        for case in cases:
            for label in ("A", "B"):  # warm: functions shipped, durations measured
                for w in range(3):
                    run(label, case, -1 - w)
            for n in range(args.repeat):
                order = ("A", "B") if n % 2 == 0 else ("B", "A")
                for label in order:
                    times[case][label].append(run(label, case, n))
                time.sleep(0.02)
            loads.append(os.getloadavg()[0])
    finally:
        for label in clients:
            clients[label].close()
            clusters[label].close()
    report = {
        "A": args.a,
        "B": args.b,
        "load": [round(x, 1) for x in loads],
        "median_ms": {
            c: {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()}
            for c, t in times.items()
        },
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
