"""Worker per-task cost: throughput of many tiny tasks, the latency of a chain of tiny
tasks (one level at a time), and the CPU an idle worker burns.

Run it once per code version and compare (A/B, alternated run by run)::

    PYTHONPATH=/work/main python benchmarks/worker_latency.py
    PYTHONPATH=$PWD python benchmarks/worker_latency.py

Prints one JSON line: medians over ``--repeat`` runs, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import psutil


def inc(x: int) -> int:
    return x + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=50_000, help="tasks of client.map(inc, ...)")
    ap.add_argument("--chain", type=int, default=200, help="length of a chain of inc tasks")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds to sample idle CPU")
    args = ap.parse_args()

    import shoal
    from shoal import Client, LocalCluster

    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        client.submit(inc, 0).result()  # warm: functions shipped, durations measured
        maps, chains, singles = [], [], []
        for r in range(args.repeat):
            t0 = time.perf_counter()
            futs = client.map(inc, range(args.tasks), key=[f"m{r}-{i}" for i in range(args.tasks)])
            client.gather(futs)
            maps.append(time.perf_counter() - t0)
            del futs
            t0 = time.perf_counter()
            f = client.submit(inc, 0, key=f"c{r}-0")
            for i in range(1, args.chain):
                f = client.submit(inc, f, key=f"c{r}-{i}")
            assert f.result() == args.chain
            chains.append(time.perf_counter() - t0)
            del f
            for i in range(20):
                t0 = time.perf_counter()
                client.submit(inc, i, key=f"s{r}-{i}").result()
                singles.append(time.perf_counter() - t0)
        time.sleep(1.0)
        pids = [p.pid for p in psutil.Process().children(recursive=True)]
        procs = [psutil.Process(p) for p in pids]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(args.idle)
        after = [sum(p.cpu_times()[:2]) for p in procs]
        idle_ms_per_s = [(a - b) * 1000 / args.idle for a, b in zip(after, before)]
    print(
        json.dumps(
            {
                "code": os.path.dirname(os.path.dirname(shoal.__file__)),
                "load": os.getloadavg()[0],
                "map_tasks_per_s": round(args.tasks / statistics.median(maps)),
                "chain_us_per_task": round(statistics.median(chains) / args.chain * 1e6),
                "single_ms": round(statistics.median(singles) * 1e3, 3),
                "idle_cpu_ms_per_s": sorted(round(x, 2) for x in idle_ms_per_s),
            }
        )
    )


if __name__ == "__main__":
    main()
