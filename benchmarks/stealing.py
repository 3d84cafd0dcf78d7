"""Work stealing: unequal task durations on three workers, shoal with and without
stealing and Dask side by side.

    python benchmarks/stealing.py [--repeat 3] [--tasks 30] [--chunk-mb 5]
        [--systems shoal,shoal-nosteal,dask] [--out benchmarks/RESULTS-stealing.md]

Layout as ``benchmarks/run.py`` (one scheduler and three one-thread workers, processes
on 127.0.0.1, the client here). Per run: ``--tasks`` chunks of ``--chunk-mb`` MB are
made on worker ``w0``; a warm-up of as many 1 ms ``consume`` tasks on a 1-byte chunk
measures the ``consume`` prefix as fast; then one ``consume`` task per chunk, every
other one sleeping 200 ms and the rest 1 ms. Placed by data locality with a 1 ms
estimate, they all queue on ``w0``; stealing moves the waiting ones to the idle
workers, paying for their chunk. Measured: wall time of that last batch (submit to
gather), and each worker's busy time (the sum of its tasks' sleeps). Figures are
medians of ``--repeat`` runs on a fresh cluster per system (one untimed warm-up run).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import statistics
import sys
import time
import traceback
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import ROOT, SYSTEMS, Cluster  # noqa: E402
from benchmarks.report import _table, fmt, load_average, machine_lines, write_report  # noqa: E402
from benchmarks.steal_tasks import chunk, consume  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-stealing.md"
N_WORKERS = 3
SLOW, FAST = 0.2, 0.001

_shoal = SYSTEMS["shoal"]
VARIANTS = {
    "shoal": _shoal,
    "shoal-nosteal": dataclasses.replace(
        _shoal,
        name="shoal",  # (the version, the client module)
        scheduler_cmd=lambda f: [*_shoal.scheduler_cmd(f), "--no-work-stealing"],
    ),
    "dask": SYSTEMS["dask"],
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def one_run(client, n_tasks: int, chunk_bytes: int) -> tuple[float, list[float], float]:
    """Wall seconds of the unequal batch, busy seconds per worker (largest first, one
    entry per worker), and the ideal wall time (total work / workers)."""
    tag = uuid.uuid4().hex[:8]
    chunks = [
        client.submit(chunk, chunk_bytes, key=f"chunk-{tag}-{i}", workers=["w0"])
        for i in range(n_tasks)
    ]
    small = client.submit(chunk, 1, key=f"small-{tag}", workers=["w0"])
    fast = [client.submit(consume, small, FAST, key=f"consume-{tag}w{i}") for i in range(n_tasks)]
    client.gather(fast)  # measured: the "consume" prefix takes ~1 ms
    seconds = [SLOW if i % 2 == 0 else FAST for i in range(n_tasks)]
    start = time.perf_counter()
    futures = [
        client.submit(consume, c, s, key=f"consume-{tag}-{i}")
        for i, (c, s) in enumerate(zip(chunks, seconds))
    ]
    results = client.gather(futures)
    wall = time.perf_counter() - start
    busy: dict[int, float] = {}
    for pid, spent in results:
        busy[pid] = busy.get(pid, 0.0) + spent
    per_worker = sorted(busy.values(), reverse=True)
    per_worker += [0.0] * (N_WORKERS - len(per_worker))
    del futures, fast, chunks, small
    return wall, per_worker, sum(seconds) / N_WORKERS


def bench(name: str, repeat: int, n_tasks: int, chunk_bytes: int) -> dict:
    cluster = Cluster(VARIANTS[name], n_workers=N_WORKERS).start()
    try:
        cluster.call(lambda: one_run(cluster.client, n_tasks, chunk_bytes), 300)  # warm-up
        runs = []
        for i in range(repeat):
            cluster.wait_idle()
            runs.append(cluster.call(lambda: one_run(cluster.client, n_tasks, chunk_bytes), 300))
            log(f"{name} run {i + 1}: wall {runs[-1][0]:.2f} s, busy {runs[-1][1]}")
        return {"runs": runs}
    except Exception:
        return {"error": traceback.format_exc(limit=3)}
    finally:
        cluster.stop()


def report(results: dict[str, dict], args: argparse.Namespace, command: str) -> str:
    rows = []
    for name, res in results.items():
        if "error" in res:
            rows.append([name, "error", "", "", ""])
            continue
        walls = [r[0] for r in res["runs"]]
        busy = [statistics.median(r[1][i] for r in res["runs"]) for i in range(N_WORKERS)]
        ideal = res["runs"][0][2]
        rows.append(
            [
                name,
                fmt(statistics.median(walls)),
                " / ".join(fmt(b) for b in busy),
                fmt(ideal),
                ", ".join(f"{w:.2f}" for w in walls),
            ]
        )
    lines = [
        "# Work stealing: unequal task durations, shoal with and without stealing, Dask",
        "",
        f"`{command}`",
        "",
        *machine_lines(
            command,
            f"repeat={args.repeat} tasks={args.tasks} chunk={args.chunk_mb} MB workers={N_WORKERS}",
        ),
        f"- load average before: {args.load_before}",
        "",
        "Every other task sleeps 200 ms, the rest 1 ms; all need a chunk held by `w0`,",
        "and their prefix was measured at 1 ms, so placement puts them all on `w0`.",
        "Busy: seconds of task work per worker (most to least busy, medians).",
        "",
        *_table(["system", "wall s (median)", "busy s per worker", "ideal wall s", "runs"], rows),
        "",
    ]
    for name, res in results.items():
        if "error" in res:
            lines += [f"{name} failed:", "```", res["error"], "```", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tasks", type=int, default=30)
    p.add_argument("--chunk-mb", type=float, default=5.0)
    p.add_argument("--systems", default="shoal,shoal-nosteal,dask")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args = p.parse_args()
    names = [s for s in args.systems.split(",") if s]
    unknown = [s for s in names if s not in VARIANTS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {sorted(VARIANTS)}")
    if args.repeat < 1 or args.tasks < 2 or args.chunk_mb <= 0:
        p.error("--repeat must be >= 1, --tasks >= 2, --chunk-mb > 0")
    args.load_before = load_average()
    command = "python benchmarks/stealing.py " + shlex.join(sys.argv[1:])
    chunk_bytes = int(args.chunk_mb * 1e6)
    results = {name: bench(name, args.repeat, args.tasks, chunk_bytes) for name in names}
    doc = report(results, args, command)
    print(doc)
    write_report(args.out, doc, log)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
