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


def _roles() -> dict[str, list[psutil.Process]]:
    """The cluster's processes by role: scheduler, workers, nannies."""
    roles: dict[str, list[psutil.Process]] = {"scheduler": [], "workers": [], "nannies": []}
    for p in psutil.Process().children(recursive=True):
        cmd = " ".join(p.cmdline())
        if "shoal scheduler" in cmd:
            roles["scheduler"].append(p)
        elif "shoal worker" in cmd:
            roles["nannies" if "--nanny" in cmd else "workers"].append(p)
    return roles


def _cpu(
    roles: dict[str, list[psutil.Process]], since: dict[str, float] | None = None
) -> dict[str, float]:
    """CPU seconds used by each role (since ``since``, if given)."""
    used = {role: sum(sum(p.cpu_times()[:2]) for p in ps) for role, ps in roles.items()}
    return used if since is None else {role: used[role] - since[role] for role in used}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=50_000, help="tasks of client.map(inc, ...)")
    ap.add_argument("--chain", type=int, default=200, help="length of a chain of inc tasks")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds to sample idle CPU")
    args = ap.parse_args()

    import shoal
    from shoal import Client, LocalCluster

    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        client.submit(inc, 0).result()  # warm: functions shipped, durations measured
        procs = _roles()
        maps, chains, singles = [], [], []
        map_cpu: dict[str, list[float]] = {role: [] for role in procs}
        for r in range(args.repeat):
            before = _cpu(procs)
            t0 = time.perf_counter()
            futs = client.map(inc, range(args.tasks), key=[f"m{r}-{i}" for i in range(args.tasks)])
            client.gather(futs)
            maps.append(time.perf_counter() - t0)
            for role, used in _cpu(procs, before).items():
                map_cpu[role].append(used * 1e6 / args.tasks)
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
        before = _cpu(procs)
        time.sleep(args.idle)
        idle = {role: used * 1000 / args.idle for role, used in _cpu(procs, before).items()}
    print(
        json.dumps(
            {
                "code": os.path.dirname(os.path.dirname(shoal.__file__)),
                "load": os.getloadavg()[0],
                "map_tasks_per_s": round(args.tasks / statistics.median(maps)),
                "chain_us_per_task": round(statistics.median(chains) / args.chain * 1e6),
                "single_ms": round(statistics.median(singles) * 1e3, 3),
                "map_cpu_us_per_task": {
                    k: round(statistics.median(v), 1) for k, v in map_cpu.items()
                },
                "idle_cpu_ms_per_s": {k: round(v, 2) for k, v in idle.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
