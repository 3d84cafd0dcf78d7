"""What one progress / counters query costs as task groups pile up, shoal vs Dask.

    python benchmarks/progress_cost.py [--groups 100,10000,100000] [--queries 30]
        [--prefixes 10] [--systems shoal,dask] [--out benchmarks/RESULTS-progress-cost.md]

Per system one cluster (one scheduler, two one-thread workers, the client here, all on
127.0.0.1). Groups are added until each size in ``--groups`` is reached: one
``client.map(inc, ..., key=[("p3-17", 0), ...])`` per step, so that every task is its
own group (the group of a tuple key is its first element, in both systems) spread
over ``--prefixes`` prefixes (``p0`` ... ``p9``); the futures are held, so every group
stays alive. At each size, after the workers are idle, each query is timed
``--queries`` times from the client (a full round trip) and the median reported:

- prefix counters: shoal ``client.task_prefixes()``; Dask
  ``client.run_on_scheduler`` reading ``state_counts`` of every ``TaskPrefix``
  (Dask has no client call for them; its dashboard reads the same counters).
- group counters: shoal ``client.task_groups()`` (the newest 100 groups); Dask
  ``run_on_scheduler`` reading every ``TaskGroup``'s states (it has no paged query).
- progress start: shoal only, from starting a progress watch over 100 finished futures
  to its first counts (what ``shoal.progress`` waits for before drawing).
- run_on_scheduler no-op: Dask only, the floor of its two queries above.

The bar: shoal's times at the largest size within 2x of those at the smallest.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import ROOT, SYSTEMS, Cluster  # noqa: E402
from benchmarks.report import _table, fmt, machine_lines  # noqa: E402
from benchmarks.workloads import inc  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-progress-cost.md"
QUERIES = ("prefix counters", "group counters", "progress start", "run_on_scheduler no-op")


def log(msg: str) -> None:
    print(f"[progress_cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def dask_prefix_counts(dask_scheduler: Any) -> dict[str, dict[str, int]]:
    return {n: dict(tp.state_counts) for n, tp in dask_scheduler.task_prefixes.items()}


def dask_group_counts(dask_scheduler: Any) -> dict[str, dict[str, int]]:
    return {n: dict(tg.states) for n, tg in dask_scheduler.task_groups.items()}


def dask_noop(dask_scheduler: Any) -> None:
    return None


def shoal_progress_start(client: Any, futures: list[Any]) -> None:
    from shoal.client.progress import Watch

    watch = Watch(client, [f.key for f in futures])
    try:
        watch.wait(0, 30)
        assert watch.latest is not None and watch.latest.finished, watch.latest
    finally:
        watch.stop()


def queries(system: str, client: Any, sample: list[Any]) -> dict[str, Any]:
    if system == "shoal":
        return {
            "prefix counters": client.task_prefixes,
            "group counters": client.task_groups,
            "progress start": lambda: shoal_progress_start(client, sample),
        }
    return {
        "prefix counters": lambda: client.run_on_scheduler(dask_prefix_counts),
        "group counters": lambda: client.run_on_scheduler(dask_group_counts),
        "run_on_scheduler no-op": lambda: client.run_on_scheduler(dask_noop),
    }


def add_groups(cluster: Cluster, start: int, stop: int, prefixes: int, timeout: float) -> list:
    keys = [(f"p{i % prefixes}-{i}", 0) for i in range(start, stop)]
    kwargs = {"pure": False} if cluster.system.name == "dask" else {}

    def submit() -> list:
        futures = cluster.client.map(inc, range(start, stop), key=keys, **kwargs)
        cluster.api.wait(futures)
        return futures

    return cluster.call(submit, timeout)


def count_groups(cluster: Cluster) -> int:
    if cluster.system.name == "dask":
        return len(cluster.call(lambda: cluster.client.run_on_scheduler(dask_group_counts), 120))
    return len(cluster.call(lambda: cluster.client.task_groups(limit=10**9), 120))


def run_system(system: str, sizes: list[int], args) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    cluster = Cluster(SYSTEMS[system], timeout=args.startup_timeout).start()
    held: list[Any] = []
    try:
        for size in sizes:
            t0 = time.monotonic()
            held += add_groups(cluster, len(held), size, args.prefixes, args.timeout)
            log(f"{system}: {size:,} groups in {time.monotonic() - t0:.1f} s")
            groups = count_groups(cluster)  # untimed: the setup is what it claims
            if groups != size:
                raise RuntimeError(f"{system}: {groups} groups alive, expected {size}")
            cluster.wait_idle(timeout=30)
            out[size] = {}
            for name, query in queries(system, cluster.client, held[:100]).items():
                cluster.call(query, 120)  # warm-up
                times = []
                for _ in range(args.queries):
                    t = time.perf_counter()
                    cluster.call(query, 120)
                    times.append(time.perf_counter() - t)
                out[size][name] = statistics.median(times) * 1e3
                log(f"{system} {size:,} groups: {name} {out[size][name]:.2f} ms")
    finally:
        held.clear()
        cluster.stop()
    return out


def render(results: dict[str, dict[int, dict[str, float]]], sizes: list[int], args) -> str:
    lines = [
        "# Progress and counters queries as task groups pile up (progress_cost)",
        "",
        *machine_lines(
            "python benchmarks/progress_cost.py " + shlex.join(sys.argv[1:]),
            f"groups {sizes}, {args.prefixes} prefixes, median of {args.queries} queries",
        ),
        "",
        "Milliseconds per query, a full round trip from the client; see the module",
        "docstring of `benchmarks/progress_cost.py` for what each query is.",
        "",
    ]
    header = ["system", "query", *(f"{n:,} groups" for n in sizes), "largest / smallest"]
    rows = []
    for system, by_size in results.items():
        for query in QUERIES:
            values = [by_size.get(n, {}).get(query) for n in sizes]
            if all(v is None for v in values):
                continue
            first, last = values[0], values[-1]
            growth = f"{last / first:.2f}×" if first and last else "—"
            rows.append([system, query, *(fmt(v) for v in values), growth])
    lines += _table(header, rows)
    shoal = results.get("shoal", {})
    if shoal and len(sizes) > 1:
        small, large = shoal.get(sizes[0], {}), shoal.get(sizes[-1], {})
        lines += ["", "## Bar", ""]
        for query in ("prefix counters", "group counters", "progress start"):
            if query in small and query in large:
                ratio = large[query] / small[query]
                verdict = "met" if ratio <= 2 else "NOT met"
                lines.append(
                    f"- shoal {query}: {fmt(large[query])} ms at {sizes[-1]:,} groups vs "
                    f"{fmt(small[query])} ms at {sizes[0]:,}: {ratio:.2f}× (≤ 2×: {verdict})"
                )
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", default="100,10000,100000")
    p.add_argument("--queries", type=int, default=30)
    p.add_argument("--prefixes", type=int, default=10)
    p.add_argument("--systems", default="shoal,dask")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to add groups")
    p.add_argument("--startup-timeout", type=float, default=60.0)
    p.add_argument("--out", default=str(DEFAULT_OUT))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = sorted(int(n) for n in args.groups.split(","))
    threading.current_thread().name = "progress_cost"
    results = {}
    for system in args.systems.split(","):
        results[system] = run_system(system, sizes, args)
    text = render(results, sizes, args)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
