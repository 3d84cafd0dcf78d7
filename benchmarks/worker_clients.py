"""Tasks that submit tasks, shoal vs Dask side by side.

    python benchmarks/worker_clients.py [--repeat 5] [--tasks 200] [--subtasks 10]
        [--systems shoal,dask] [--out benchmarks/RESULTS-worker-clients.md]

The benchmark client submits ``--tasks`` tasks (``submit_incs`` in
``benchmarks/workloads.py``); each opens its system's ``worker_client()`` (which
secedes it from the worker's thread count until the block ends), submits
``--subtasks`` ``inc`` tasks, gathers them and returns their sum. The benchmark client
gathers the top-level results; the total is checked after timing.

Same layout and method as ``benchmarks/run.py`` (one scheduler, two one-thread workers,
the client here, all on 127.0.0.1): per system a fresh cluster, one untimed warm-up run
(which also makes the workers' clients), then ``--repeat`` timed runs; the systems run
one after the other; figures are medians. Tables go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import gc
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from benchmarks.cluster import ROOT, SYSTEMS, Cluster, ClusterError, cpu_delta  # noqa: E402
from benchmarks.report import _table, document, fmt, load_average, write_report  # noqa: E402
from benchmarks.workloads import submit_incs  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-worker-clients.md"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Run:
    wall: float
    sched_cpu: float
    worker_cpu: float
    client_cpu: float
    sched_precise: bool  # from per-thread schedstat; else psutil ticks (a thread exited)
    workers_precise: bool
    connections: int | None  # established TCP connections at the scheduler's port


@dataclass
class Result:
    system: str
    runs: list[Run] = field(default_factory=list)
    warmup_wall: float | None = None
    clients_logged: int | None = None  # client connections in the scheduler's log (Dask)
    error: str | None = None


def scheduler_connections(cluster: Cluster) -> int | None:
    """Established TCP connections at the scheduler's listening port (workers, their
    clients, the benchmark client), seen from the scheduler process."""
    assert cluster.scheduler_proc is not None and cluster.address is not None
    port = int(cluster.address.rsplit(":", 1)[1].rstrip("/"))
    try:
        conns = cluster.scheduler_proc.net_connections(kind="tcp")
    except psutil.Error:
        return None
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)


def clients_in_log(cluster: Cluster) -> int | None:
    """Client connections the Dask scheduler logged ("Receive client connection")."""
    if cluster.system.name != "dask":
        return None  # shoal's scheduler does not log clients
    try:
        text = (cluster.dir / "scheduler.log").read_text(errors="replace")
    except OSError:
        return None
    return text.count("Receive client connection")


def measure(cluster: Cluster, module: str, tasks: int, subtasks: int, timeout: float) -> Run:
    """One run: submit ``tasks`` top-level tasks and gather them, timed."""
    cluster.wait_idle()
    gc.collect()
    client = cluster.client

    def body() -> tuple[Run, list[int]]:
        (s0, w0), c0 = cluster.cpu_snapshot(), time.process_time()
        t0 = time.perf_counter()
        futs = [
            client.submit(submit_incs, module, i * subtasks, subtasks, pure=False)
            for i in range(tasks)
        ]
        results = client.gather(futs)
        wall = time.perf_counter() - t0
        (s1, w1), c1 = cluster.cpu_snapshot(), time.process_time()
        sched, ps = cpu_delta(s0, s1)
        workers, pw = cpu_delta(w0, w1)
        return Run(wall, sched, workers, c1 - c0, ps, pw, None), results

    run, results = cluster.call(body, timeout)
    m = tasks * subtasks  # inc(0) + ... + inc(m - 1) = 1 + ... + m
    if sum(results) != m * (m + 1) // 2 or len(results) != tasks:
        raise AssertionError(f"wrong results: sum {sum(results)}, expected {m * (m + 1) // 2}")
    want = [sum(range(i * subtasks + 1, (i + 1) * subtasks + 1)) for i in range(tasks)]
    if results != want:
        raise AssertionError("wrong per-task results")
    run.connections = scheduler_connections(cluster)
    return run


def run_system(system: str, args) -> Result:
    res = Result(system)
    module = SYSTEMS[system].client_module  # "shoal" or "distributed": has worker_client
    cluster = Cluster(SYSTEMS[system], timeout=args.startup_timeout)
    timeout = args.timeout
    try:
        cluster.start()
        for i in range(args.repeat + 1):
            name = "warm-up" if i == 0 else f"run {i}/{args.repeat}"
            run = measure(cluster, module, args.tasks, args.subtasks, timeout)
            n_all = args.tasks * (args.subtasks + 1)
            log(
                f"  {name:>9} {system:>6}: {run.wall:.3f} s, sched {run.sched_cpu:.3f} s "
                f"({run.sched_cpu * 1e6 / n_all:.0f} µs/task of {n_all}), workers "
                f"{run.worker_cpu:.3f} s, client {run.client_cpu:.3f} s, "
                f"{run.connections} sched connections"
            )
            if i == 0:
                res.warmup_wall = run.wall
                timeout = min(timeout, max(60.0, 10 * run.wall))
            else:
                res.runs.append(run)
        res.clients_logged = clients_in_log(cluster)
    except Exception as e:
        msg = f"{type(e).__name__}: {e or repr(e)}"
        dead = "" if isinstance(e, ClusterError) else cluster.diagnose()  # already said
        if dead:
            msg += "\n" + dead
        msg += f"\n(logs kept in {cluster.dir})"
        res.error = msg
        log(f"  {system}: FAILED: {msg}")
        if not isinstance(e, TimeoutError | ClusterError):
            log(traceback.format_exc(limit=-6))
    finally:
        cluster.stop(remove_logs=not res.error)
    return res


# --- report ---------------------------------------------------------------------------

def _median(res: Result, attr: str) -> float | None:
    vals = [getattr(r, attr) for r in res.runs if getattr(r, attr) is not None]
    return statistics.median(vals) if vals else None


def _per(value: float | None, n: int, scale: float = 1e6) -> float | None:
    return None if value is None else value * scale / n


def metrics(res: Result, args) -> dict[str, float | None]:
    top, every = args.tasks, args.tasks * (args.subtasks + 1)
    wall, sched = _median(res, "wall"), _median(res, "sched_cpu")
    return {
        "wall s": wall,
        "top-level tasks/s": None if not wall else top / wall,
        "sched CPU s": sched,
        "sched µs / top-level task": _per(sched, top),
        f"sched µs / task (all {every:,})": _per(sched, every),
        "workers CPU s": _median(res, "worker_cpu"),
        "client CPU s": _median(res, "client_cpu"),
        "sched TCP connections after a run": _median(res, "connections"),
        "client connections in sched log": res.clients_logged,
        "warm-up wall s (makes the workers' clients)": res.warmup_wall,
    }


RATIO = {  # metric -> True if higher is better
    "wall s": False,
    "top-level tasks/s": True,
    "sched CPU s": False,
    "sched µs / top-level task": False,
    "workers CPU s": False,
    "client CPU s": False,
    "warm-up wall s (makes the workers' clients)": False,
}


def _ratio(metric: str, shoal: float | None, dask: float | None) -> str:
    key = metric if metric in RATIO else None
    if metric.startswith("sched µs / task"):
        key = "sched CPU s"
    if key is None or not shoal or not dask:
        return "—"
    r = shoal / dask if RATIO[key] else dask / shoal
    return f"{r:.2f}×"


def render(results: list[Result], args, command: str, settings: str) -> tuple[str, str]:
    systems = [r.system for r in results]
    per = {r.system: metrics(r, args) for r in results}
    both = {"shoal", "dask"} <= set(systems)
    header = ["metric", *systems] + (["ratio (>1: shoal better)"] if both else [])
    rows = []
    for metric in per[systems[0]]:
        cells = [metric]
        for r in results:
            v = per[r.system][metric]
            if r.error and not r.runs:
                cells.append("FAILED")
            elif "connections" in metric and v is not None:
                cells.append(f"{v:.0f}")
            else:
                cells.append(fmt(v))
        if both:
            cells.append(_ratio(metric, per["shoal"][metric], per["dask"][metric]))
        rows.append(cells)
    tables = [
        f"## worker_clients: {args.tasks} tasks × {args.subtasks} sub-tasks each",
        "",
        *_table(header, rows),
    ]
    notes = []
    for r in results:
        walls = ", ".join(f"{x.wall:.3f}" for x in r.runs)
        scheds = ", ".join(f"{x.sched_cpu:.3f}" for x in r.runs)
        if r.runs:
            notes.append(f"- {r.system}: wall s per run {walls}; sched CPU s per run {scheds}")
        for who, attr in (("scheduler", "sched_precise"), ("workers", "workers_precise")):
            n = sum(not getattr(x, attr) for x in r.runs)
            if n:
                notes.append(
                    f"- {r.system}: {who} CPU of {n}/{len(r.runs)} runs from psutil user+system "
                    "(10 ms ticks): a thread exited during the run"
                )
        if r.error:
            notes.append(f"- {r.system} FAILED: " + r.error.replace("\n", "\n  "))
    if notes:
        tables += ["", *notes]
    return document(
        "shoal vs Dask: tasks that submit tasks (worker_clients)",
        command,
        settings,
        METHOD.format(tasks=args.tasks, subtasks=args.subtasks),
        tables,
    )


METHOD = """\
Workload: the benchmark client submits {tasks} tasks (`submit_incs` in
`benchmarks/workloads.py`) and gathers them. Each task, on a worker, does
`with worker_client() as c:` (its system's: `shoal.worker_client` or
`distributed.worker_client`; the task secedes from its worker's thread count for the
block and rejoins at its end), submits {subtasks} `inc` tasks with
`c.submit(inc, j, pure=False)`, gathers them and returns their sum. The sum of all
results is checked after timing.

Layout per system: one scheduler process, two worker processes with one thread each
(Dask: `--no-nanny --no-dashboard`), the benchmark client in this process; all on
127.0.0.1. The systems run one after the other, each on a freshly started cluster (only
one alive at a time): one untimed warm-up run, which also makes each worker's client
(one per worker process on both systems), then the timed runs. Figures are medians of
the timed runs; the timed region is from the first submission to the last gathered
result. CPU is summed over the threads of each process from
/proc/PID/task/*/schedstat. "sched TCP connections" counts the established connections
at the scheduler's port after a run (workers, the workers' clients and the benchmark
client; Dask workers hold more than one each). Dask's scheduler logs each client
connection; shoal's does not.

**ratio > 1 means shoal is better** (dask/shoal for times and CPU)."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/worker_clients.py",
        description="Tasks that submit tasks through worker_client(): shoal vs Dask.",
    )
    p.add_argument("--repeat", type=int, default=5, help="timed runs per system (default 5)")
    p.add_argument("--tasks", type=int, default=200, help="top-level tasks (default 200)")
    p.add_argument("--subtasks", type=int, default=10, help="sub-tasks per task (default 10)")
    p.add_argument("--systems", default="shoal,dask", help="comma-separated (default shoal,dask)")
    p.add_argument(
        "--out", default=str(DEFAULT_OUT),
        help="markdown report ('' = none; default benchmarks/RESULTS-worker-clients.md)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0,
        help="seconds for the warm-up run (default 600); timed runs get "
        "min(this, max(60, 10 x warm-up))",
    )
    p.add_argument("--startup-timeout", type=float, default=60.0, help="seconds per cluster start")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.tasks < 1 or args.subtasks < 1:
        p.error("--repeat, --tasks and --subtasks must be >= 1")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad or not args.systems:
        p.error(f"unknown systems {bad}; choose from {list(SYSTEMS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/worker_clients.py", *(argv or sys.argv[1:])])
    load0 = load_average()
    t0 = time.monotonic()
    results = []
    for s in args.systems:
        why = SYSTEMS[s].available()
        if why:
            log(f"!! skipping {s}: {why}")
            continue
        log(f"== worker_clients on {s}: {args.tasks} tasks × {args.subtasks} sub-tasks")
        results.append(run_system(s, args))
    if not results:
        return 2
    load1 = load_average()
    settings = (
        f"{args.tasks} tasks × {args.subtasks} sub-tasks, 1 warm-up + {args.repeat} timed "
        f"runs, systems {', '.join(r.system for r in results)} (in that order), total "
        f"benchmark time {time.monotonic() - t0:.0f} s; load average (1/5/15 min) {load0} "
        f"at start, {load1} at end"
    )
    doc, tables = render(results, args, command, settings)
    print(tables)
    write_report(args.out, doc, log)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
