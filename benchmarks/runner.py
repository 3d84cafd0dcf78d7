"""Benchmark driver: start clusters, run the workloads, write the report.

Invoked through ``benchmarks/run.py``; see ``--help``.
"""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
import traceback

from benchmarks.cluster import ROOT, SYSTEMS, Cluster, ClusterError, cpu_delta
from benchmarks.report import Result, Run, load_average, render, write_report
from benchmarks.workloads import BY_NAME, WORKLOADS, ZERO_WORKLOADS, Workload

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS.md"
ALL_NAMES = [w.name for w in WORKLOADS] + [f"zero-{n}" for n in ZERO_WORKLOADS]
# --only names that stand for several workloads
ALIASES = {
    "zero": [f"zero-{z}" for z in ZERO_WORKLOADS],
    "partial_path": ["partial_path", "plain_path"],  # with its no-partial control
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/run.py",
        description="Benchmark shoal against Dask distributed on the same cluster layout.",
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes (about 1/10) for a smoke run")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per workload and system (default 3)")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated workloads to run, from: " + ", ".join(ALL_NAMES)
        + " ('zero' = all zero-worker ones, 'partial_path' includes plain_path; "
        "default: all)",
    )
    p.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="NAME[:SYSTEM]=N",
        help="override a workload's size (for one system only with :SYSTEM), e.g. "
        "--size million:dask=50000; repeatable",
    )
    p.add_argument(
        "--systems", default="shoal,dask", help="comma-separated systems (default: shoal,dask)"
    )
    p.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        help="markdown report path ('' = none; default: benchmarks/RESULTS.md in the repository)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds allowed for a warm-up run (default: 600; million, which has no "
        "warm-up, 1800 per run); timed runs after a warm-up get "
        "min(this, max(60, 10 x warm-up time))",
    )
    p.add_argument(
        "--startup-timeout", type=float, default=60.0, help="seconds allowed to start a cluster"
    )
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    args.systems = systems
    names = [n.strip() for n in args.only.split(",") if n.strip()] or ALL_NAMES
    expanded = []
    for n in names:
        expanded += ALIASES.get(n, [n])
    bad = [n for n in expanded if n not in ALL_NAMES]
    if bad:
        p.error(f"unknown workloads {bad}; choose from {ALL_NAMES + ['zero']}")
    args.only = list(dict.fromkeys(expanded))
    sizes: dict[tuple[str, str | None], int] = {}
    for item in args.size:
        target, _, value = item.partition("=")
        name, _, system = target.partition(":")
        if name not in BY_NAME or (system and system not in SYSTEMS) or not value.isdigit():
            p.error(f"bad --size {item!r}: expected NAME[:SYSTEM]=N with a workload name")
        sizes[(name, system or None)] = int(value)
    args.size = sizes
    return args


def size_of(wl: Workload, system: str, args) -> int:
    """The size ``system`` runs ``wl`` at: --size, else the workload's (quick) size."""
    for key in ((wl.name, system), (wl.name, None)):
        if key in args.size:
            return args.size[key]
    return wl.size_for(system, args.quick)


def measure(cluster: Cluster, wl: Workload, size: int, timeout: float) -> Run:
    """One run of ``wl`` on ``cluster``: wall time and CPU deltas over the timed region."""
    arg = wl.prepare(size) if wl.prepare is not None else size  # untimed
    # Graph workloads: the tasks the workers ran, as each system counts them.
    ran0 = cluster.tasks_run() if wl.count is not None else None
    cluster.wait_idle()
    gc.collect()

    def body() -> Run:
        (s0, w0), c0 = cluster.cpu_snapshot(), time.process_time()
        t0 = time.perf_counter()
        outcome = wl.func(cluster.api, cluster.client, arg)
        wall = time.perf_counter() - t0
        (s1, w1), c1 = cluster.cpu_snapshot(), time.process_time()
        if outcome.verify is not None:
            outcome.verify()
        sched, precise_s = cpu_delta(s0, s1)
        workers, precise_w = cpu_delta(w0, w1)
        return Run(
            wall, sched, workers, c1 - c0, outcome.samples, precise_s and precise_w,
            dict(outcome.metrics),
        )

    run = cluster.call(body, timeout)  # futures are dropped with the closure here
    gc.collect()
    if ran0 is not None:
        run.extra["tasks run"] = float(cluster.tasks_run() - ran0)
    return run


def describe(res: Result, run: Run) -> str:
    m = Result(res.workload, res.size, res.system, res.zero, [run]).metrics()
    if res.workload.kind == "latency":
        head = f"median {m['median ms']:.2f} ms, p90 {m['p90 ms']:.2f} ms"
    elif res.workload.kind == "hop":
        head = f"{m['ms/hop']:.3f} ms/hop"
    elif res.workload.kind == "memory":
        head = (
            f"submit {m['submit s']:.2f} s, result {m['result s']:.2f} s, "
            f"sched {m['sched bytes/task']:,.0f} B/task"
        )
    else:
        head = f"{m['tasks/s']:,.0f} tasks/s"
    if "tasks run" in m:
        head += f", {m['tasks run']:,.0f} tasks run"
    return f"{run.wall:.3f} s, {head}, sched {m['sched µs/task']:.1f} µs/task"


def _fail(res: Result, cluster: Cluster, stage: str, exc: BaseException) -> None:
    msg = f"{stage}: {type(exc).__name__}: {exc or repr(exc)}"
    if not isinstance(exc, ClusterError):
        dead = cluster.diagnose()  # a crashed process explains most failures
        if dead:
            msg += "\n" + dead
    msg += f"\n(logs kept in {cluster.dir})"
    res.error = msg
    log(f"    {res.system}: FAILED: {msg}")
    if not isinstance(exc, TimeoutError | ClusterError):
        log(traceback.format_exc(limit=-6))


def run_workload(
    wl: Workload, systems: list[str], args, *, zero: bool = False
) -> list[Result]:
    """Run ``wl`` on each system in turn, each on a freshly started cluster.

    Only one cluster is alive at a time: an idle Dask cluster alone costs ~10% of a
    core in heartbeats, which would disturb the other system's figures.
    """
    results = []
    for s in systems:
        size = size_of(wl, s, args)
        z = zero or (wl.zero and SYSTEMS[s].supports_zero)
        head = f"== {'zero-' if zero else ''}{wl.label(size)} on {s}"
        if z and not zero:
            head += " (zero workers)"
        if wl.count is not None:
            n, secs = wl.counted(size)
            log(f"{head}: {n:,} tasks (counted from dask's optimised graph in {secs:.1f} s)")
        else:
            log(f"{head} ({wl.n_tasks(size):,} tasks)")
        results.append(run_system(wl, size, s, args, zero=z))
    return results


def run_system(wl: Workload, size: int, system: str, args, *, zero: bool) -> Result:
    result = Result(wl, size, system, zero=zero)
    timeout = wl.timeout if args.timeout is None else args.timeout
    first = 0 if wl.warmup else 1
    cluster: Cluster | None = None
    try:
        for i in range(first, args.repeat + 1):  # an untimed warm-up, then the timed runs
            name = "warm-up" if i == 0 else f"run {i}/{args.repeat}"
            if cluster is None:
                cluster = Cluster(SYSTEMS[system], zero=zero, timeout=args.startup_timeout)
                try:
                    cluster.start()
                except Exception as e:
                    _fail(result, cluster, f"cluster start ({name})", e)
                    cluster = None
                    break
            try:
                run = measure(cluster, wl, size, timeout)
            except Exception as e:
                _fail(result, cluster, name, e)
                break
            log(f"  {name:>9} {system:>6}: {describe(result, run)}")
            if i == 0:  # a hang in a timed run should not cost the full --timeout
                timeout = min(timeout, max(60.0, 10 * run.wall))
            else:
                result.runs.append(run)
            if wl.fresh_cluster:  # e.g. a peak-RSS figure must start from a new process
                cluster.stop()
                cluster = None
    finally:
        if cluster is not None:
            cluster.stop(remove_logs=not result.error)
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])])
    systems = []
    for s in args.systems:
        why = SYSTEMS[s].available()
        if why:
            log(f"!! skipping {s}: {why}")
        else:
            systems.append(s)
    if not systems:
        log("no usable system")
        return 2

    results: list[Result] = []
    t_start = time.monotonic()
    load_start = load_average()
    selected = [wl for wl in WORKLOADS if wl.name in args.only]
    for i, wl in enumerate(selected):
        order = systems if i % 2 == 0 else systems[::-1]  # alternate who goes first
        order = [s for s in order if wl.systems is None or s in wl.systems]
        results += run_workload(wl, order, args)
    zero_systems = [s for s in systems if SYSTEMS[s].supports_zero]
    for name in ZERO_WORKLOADS:
        if f"zero-{name}" in args.only and zero_systems:
            results += run_workload(BY_NAME[name], zero_systems, args, zero=True)

    load = load_average()
    no_warmup = ", ".join(wl.name for wl in selected if not wl.warmup)
    overrides = ", ".join(
        f"{name}{':' + system if system else ''}={n}" for (name, system), n in args.size.items()
    )
    settings = (
        f"{'quick' if args.quick else 'full'} sizes"
        + (f" (overridden: {overrides})" if overrides else "")
        + f", 1 warm-up + {args.repeat} timed runs"
        + (f" ({no_warmup}: no warm-up)" if no_warmup else "")
        + f", systems {', '.join(systems)}, total benchmark time "
        f"{time.monotonic() - t_start:.0f} s; "
        f"load average (1/5/15 min) {load_start} at start, {load} at end"
    )
    doc, tables = render(results, systems, command, settings)
    print(tables)
    write_report(args.out, doc, log)
    return 1 if any(r.error for r in results) else 0
