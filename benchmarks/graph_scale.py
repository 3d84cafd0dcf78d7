"""Graphs of every size: shoal vs Dask distributed on dask.array graphs of 10k to 3M tasks.

    python benchmarks/graph_scale.py [--sizes 10k,100k,1M,3M] [--systems shoal,dask]
        [--modes zero,workers] [--repeat 1] [--dask-limit 600] [--dask-max-size N]
        [--timeout S] [--ndim 1]
        [--out benchmarks/RESULTS-graph-scale.md]

The graph is ``(da.ones((c,), chunks=1) + k).sum()`` with c = ¾ of the size: after
dask's optimisation one fused ones+add+partial-sum task per chunk, then dask's 4-way
reduction tree and the finalize tasks, about the size in all (1M gives 1,000,003).
With ``--ndim 2`` (or 3) the same chunks make a square (cube) array summed over all
its axes: Dask's tree then lists each task's inputs as lists of lists.
"tasks" is the exact count of the graph as Dask makes it: for Dask, the number of tasks
its scheduler holds after ingesting it; for shoal, the length of the graph
``materialize`` returned in the client plus the leaves ``tree_fuse`` fused into their
reduction tasks (shoal's client fuses each group of 4 leaves into its reduction task,
then those into the level above, while a level gets at least
``shoal.client.fuse-reductions.min-groups`` tasks of at most 64 leaves: the same
results, from 1.6% of the tasks at 1M). "scheduled tasks" is the number of
tasks the scheduler holds and runs (for Dask the same as "tasks"). The CPU columns
per task are over "tasks" (the graph's work, comparable with and without fusion);
"ingest tasks/s" and "B/task" are over "scheduled tasks" (what the scheduler holds).
``k`` is new for every run (so every run has new keys and dask cannot reuse an
expression or graph made for an earlier one), and the result, ``c * (1 + k)``, is
checked.

Layout per system: one scheduler process, the client in this process, on 127.0.0.1
with OS-chosen ports (Dask: ``--no-dashboard``, its workers ``--no-nanny
--no-dashboard``); every run on a freshly started cluster, only that one alive, after
an untimed warm-up graph of the same shape (200 tasks: both systems import dask.array
and warm their code paths; without workers it is submitted, then released). The
systems alternate run by run (the first of each size and mode rotates), so a shared
machine's load falls on both alike. Two modes:

* zero: the scheduler without any worker. Timed from the ``client.compute`` call:
  "client s" until that call returns, "submit s" until the scheduler holds every task
  (polled every 50 ms: shoal ``client.scheduler_info(n_workers=0)["tasks"]``, Dask
  ``len(dask_scheduler.tasks)`` through ``run_on_scheduler``). "ingest tasks/s" is the
  task count over the scheduler process's CPU time in that window (its threads'
  schedstat): shoal's scheduler decodes the parts while the client encodes the next
  ones, Dask's materialises and orders the graph itself. "B/task" is the scheduler's
  peak RSS (VmHWM, reset through ``/proc/PID/clear_refs`` just before the call, cross-
  checked by sampling VmRSS every 20 ms from a process of its own) minus its RSS
  before, over the scheduled tasks; the bar's row divides the same bytes by the
  graph's tasks (fused, a scheduled task holds up to 64 leaves and the 21 tasks
  that reduce them).
  Then, shoal only, two ``--zero`` workers (which report every task done at once
  without running it) are started and "zero-work finish s" is the time from starting
  them to the result: the scheduler's own cost of running the graph it holds.
* workers: two real worker processes with one thread each; "end-to-end s" from the
  ``client.compute`` call to the result in the client, the result checked. "workers
  CPU µs/task" is both workers' CPU time over that window (their threads' schedstat)
  over the task count, "sched CPU µs/task" the scheduler's: what a graph costs each
  side, less sensitive to a shared machine's load than the wall-clock time.

Where the client's time goes (shoal): simple timers in this process around dask's
graph materialisation (``shoal.client.graph.collections.materialize``: lowering the
expression, materialising its graph and converting it to Dask's task spec),
``dask.order.order`` (where shoal bounds it, its ``submission_order``: dask.order or the
cheap order above ``shoal.client.order.max-tasks``) and shoal's encoding of each task
(``GraphEncoder.task_spec``);
"client CPU s" is this process's CPU time (all threads, including the client's event
loop that frames and writes the messages) over the submit window. The timers cost
well under 1 µs per task. Dask's client only builds and pickles the expression: its
scheduler does the materialising and ordering, inside its "submit s".

Dask runs up to the largest size it finishes within ``--dask-limit`` seconds: a size
where it fails or times out skips every larger size for Dask (reported as skipped), as
does ``--dask-max-size`` for the sizes above it.
Every shoal run has a timeout (``--timeout``, default 120 s + 1.2 ms per task), every
Dask run ``--dask-limit``, so nothing hangs. The report is rewritten after every run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import (  # noqa: E402
    ROOT,
    SYSTEMS,
    Cluster,
    cpu_delta,
    cpu_snapshot,
    spawn,
)
from benchmarks.report import _table, document, load_average, write_report  # noqa: E402
from benchmarks.workloads import _reset_peak_rss, _RssSampler, _status_kb  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-graph-scale.md"
DEFAULT_SIZES = "10k,100k,1M,3M"
MODES = ("zero", "workers")
POLL = 0.05  # seconds between polls of the scheduler's task count
WARM_UP = 200  # tasks of the untimed graph run first on every cluster
# The bar.
BAR_SUBMIT_1M = 30.0  # seconds to submit the 1M-task graph
BAR_FINISH_1M = 60.0  # seconds to finish it on 2 workers
BAR_BYTES = 600  # scheduler peak RSS per task


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_count(text: str) -> int:
    """``"10k"`` -> 10,000, ``"1M"`` -> 1,000,000, ``"2500"`` -> 2,500."""
    t = text.strip()
    mult = {"k": 1_000, "m": 1_000_000}.get(t[-1:].lower(), 1)
    number = t[:-1] if mult > 1 else t
    try:
        value = float(number) * mult
    except ValueError:
        raise ValueError(f"not a task count: {text!r} (expected e.g. 2000, 10k or 1M)") from None
    if value < 4 or value != int(value):
        raise ValueError(f"a task count must be a whole number of at least 4, got {text!r}")
    return int(value)


def size_label(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1_000 and n % 100 == 0:
        return f"{n / 1_000:g}k"
    return str(n)


NDIM = 1  # --ndim: the array's axes (the sum is over all of them)


def make_graph(size: int, k: int) -> tuple[Any, int]:
    """(the collection, its expected result) for a graph of about ``size`` tasks: ¾ of
    the size in chunks, over ``NDIM`` axes of equal length (``--ndim``)."""
    import dask.array as da

    chunks = max(1, size * 3 // 4)
    side = max(1, round(chunks ** (1 / NDIM)))
    shape = (side,) * NDIM if NDIM > 1 else (chunks,)
    blocks = side**NDIM if NDIM > 1 else chunks
    return (da.ones(shape, chunks=1) + k).sum(), blocks * (1 + k)


def default_timeout(size: int) -> float:
    return 120.0 + 1.2e-3 * size


# --- where the client's time goes (shoal) -------------------------------------------------


class PhaseTimers:
    """Wraps, while entered, the functions a shoal client calls to submit a dask graph,
    adding up the time spent in each; ``scheduled`` is the number of tasks encoded (the
    materialised graph less the aliases the client skips: a 2-D tree has some),
    ``tasks`` the materialised graph's length plus the leaves fused into reduction
    tasks (Dask's count)."""

    def __init__(self) -> None:
        self.seconds = {"materialise": 0.0, "order": 0.0, "encode": 0.0}
        self.tasks = 0
        self.scheduled = 0
        self.fused_away = 0
        self._undo: list[tuple[Any, str, Any]] = []

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def __enter__(self) -> PhaseTimers:
        import dask.order

        from shoal.client.graph import collections
        from shoal.client.graph.dask_graph import GraphEncoder

        try:
            from shoal.client.graph import tree_fuse
        except ImportError:  # a shoal without reduction fusion
            tree_fuse = None

        seconds = self.seconds
        materialize, order = collections.materialize, dask.order.order
        task_spec = GraphEncoder.task_spec
        clock = time.perf_counter

        def timed_materialize(graph: Any, *args: Any) -> Any:
            t0 = clock()
            out = materialize(graph, *args)
            seconds["materialise"] += clock() - t0
            self.scheduled = 0  # (counted as they are encoded)
            self.tasks = len(out[0]) + self.fused_away
            self.fused_away = 0
            return out

        def counted_fuse(dsk: Any, *args: Any, **kwargs: Any) -> Any:
            before = len(dsk)  # (it fuses in place)
            out = fuse(dsk, *args, **kwargs)
            self.fused_away += before - len(out)
            return out

        def timed_order(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = order(*args, **kwargs)
            seconds["order"] += clock() - t0
            return out

        def timed_task_spec(encoder: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = task_spec(encoder, *args, **kwargs)
            seconds["encode"] += clock() - t0
            self.scheduled += 1
            return out

        self._patch(collections, "materialize", timed_materialize)
        if tree_fuse is not None:
            fuse = tree_fuse.fuse_reduction_leaves
            self._patch(tree_fuse, "fuse_reduction_leaves", counted_fuse)
        if hasattr(collections, "submission_order"):
            # the order shoal chose: dask.order up to its bound, the cheap one above
            order = collections.submission_order
            self._patch(collections, "submission_order", timed_order)
        else:
            self._patch(dask.order, "order", timed_order)  # submit_graph imports it per call
        self._patch(GraphEncoder, "task_spec", timed_task_spec)
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)


# --- one run ------------------------------------------------------------------------------


@dataclass
class Run:
    system: str
    mode: str
    size: int
    tasks: int = 0  # exact count of the graph as Dask makes it
    scheduled: int = 0  # tasks the scheduler held (shoal: after fusing reduction leaves)
    client_s: float | None = None  # until client.compute returned
    submit_s: float | None = None  # zero: until the scheduler held every task
    sched_cpu_s: float | None = None  # zero: scheduler CPU over the submit window
    client_cpu_s: float | None = None  # zero: this process's CPU over the submit window
    peak_bytes: float | None = None  # zero: scheduler peak RSS minus RSS before
    peak_reset: bool = True
    finish_s: float | None = None  # zero (shoal): finishing on --zero workers
    end_to_end_s: float | None = None  # workers: compute call to checked result
    workers_cpu_s: float | None = None  # workers: both workers' CPU over end_to_end_s
    sched_run_cpu_s: float | None = None  # workers: the scheduler's CPU over end_to_end_s
    phases: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def bytes_per_task(self) -> float | None:
        held = self.scheduled or self.tasks
        return None if self.peak_bytes is None or not held else self.peak_bytes / held

    @property
    def bytes_per_graph_task(self) -> float | None:
        return None if self.peak_bytes is None or not self.tasks else self.peak_bytes / self.tasks

    def per_task_us(self, attr: str) -> float | None:
        """``attr`` (CPU seconds) per task of the graph, in µs (the size where the exact
        count is unknown)."""
        cpu = getattr(self, attr)
        return None if cpu is None else cpu / (self.tasks or self.size) * 1e6

    @property
    def workers_us_per_task(self) -> float | None:
        return self.per_task_us("workers_cpu_s")

    @property
    def sched_run_us_per_task(self) -> float | None:
        return self.per_task_us("sched_run_cpu_s")

    @property
    def ingest_rate(self) -> float | None:
        held = self.scheduled or self.tasks
        if not self.sched_cpu_s or not held:
            return None
        return held / self.sched_cpu_s


def _scheduler_tasks(cluster: Cluster, timeout: float) -> int:
    client = cluster.client
    if cluster.system.name == "shoal":
        return int(cluster.call(lambda: client.scheduler_info(n_workers=0)["tasks"], timeout))
    return int(
        cluster.call(
            lambda: client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)),
            timeout,
        )
    )


def _wait_held(cluster: Cluster, expected: int, deadline: float) -> int:
    """Poll until the scheduler holds ``expected`` tasks (0: any, for Dask, whose
    scheduler adds a whole graph at once); the count it holds."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the scheduler did not hold every task in time")
        held = _scheduler_tasks(cluster, remaining)
        if (expected and held >= expected) or (not expected and held > 0):
            return held
        time.sleep(POLL)


def warm_up(cluster: Cluster, k: int, zero: bool, timeout: float) -> None:
    """An untimed graph of the same shape, WARM_UP tasks, first on every fresh cluster:
    both systems import dask.array and warm their code paths outside the timed run.
    Without workers it is submitted, held, then released until the scheduler is empty."""
    client = cluster.client
    collection, expected = make_graph(WARM_UP, -k)  # keys unlike the timed run's
    deadline = time.monotonic() + timeout
    if not zero:
        result = cluster.call(lambda: client.compute(collection).result(), timeout)
        if int(result) != expected:
            raise AssertionError(f"warm-up result {result!r}, expected {expected}")
        return
    box = {"future": cluster.call(lambda: client.compute(collection), timeout)}
    _wait_held(cluster, 0, deadline)
    cluster.call(lambda: box.clear(), timeout)  # the client's last reference goes
    while _scheduler_tasks(cluster, max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            raise TimeoutError("the warm-up graph was not released in time")
        time.sleep(POLL)


def run_zero(cluster: Cluster, run: Run, k: int, timeout: float) -> Any:
    """Submit to a scheduler without workers; measure until it holds every task."""
    client = cluster.client
    assert cluster.scheduler_proc is not None
    pid = cluster.scheduler_proc.pid
    warm_up(cluster, k, True, timeout)
    collection, expected = make_graph(run.size, k)
    me = psutil.Process()
    deadline = time.monotonic() + timeout
    cluster.wait_idle()
    gc.collect()
    idle_kb = _status_kb(pid, "VmRSS")
    run.peak_reset = _reset_peak_rss(pid)
    timers = PhaseTimers() if run.system == "shoal" else contextlib.nullcontext()
    sched0, mine0 = cpu_snapshot([cluster.scheduler_proc]), cpu_snapshot([me])
    with _RssSampler(pid) as sampler, timers:
        t0 = time.perf_counter()
        fut = cluster.call(lambda: client.compute(collection), timeout)
        run.client_s = time.perf_counter() - t0
        target = timers.scheduled if isinstance(timers, PhaseTimers) else 0
        held = _wait_held(cluster, target, deadline)
        run.submit_s = time.perf_counter() - t0
        sched1, mine1 = cpu_snapshot([cluster.scheduler_proc]), cpu_snapshot([me])
    peak_kb = max(_status_kb(pid, "VmHWM"), sampler.peak)
    run.tasks = run.scheduled = held
    if isinstance(timers, PhaseTimers):
        run.phases = dict(timers.seconds)
        if held != timers.scheduled:
            raise AssertionError(
                f"the scheduler holds {held} tasks, the graph has {timers.scheduled}"
            )
        run.tasks = timers.tasks
    run.sched_cpu_s = cpu_delta(sched0, sched1)[0]
    run.client_cpu_s = cpu_delta(mine0, mine1)[0]
    run.peak_bytes = (peak_kb - idle_kb) * 1024.0
    if run.system == "shoal":
        # The graph is held: start two --zero workers and time the scheduler running it.
        system = cluster.system
        t1 = time.perf_counter()
        for i in range(2):
            cmd = system.worker_cmd(cluster.scheduler_file, f"z{i}", True)
            cluster.workers.append(spawn(cmd, cluster.dir / f"worker-z{i}.log"))
        remaining = max(1.0, deadline - time.monotonic())
        mod = sys.modules[system.client_module]
        cluster.call(lambda: mod.wait([fut], timeout=remaining), remaining + 5)
        if fut.status != "finished":
            raise AssertionError(f"on --zero workers the result ended {fut.status!r}")
        run.finish_s = time.perf_counter() - t1
    return fut


def run_workers(cluster: Cluster, run: Run, k: int, timeout: float) -> Any:
    """Compute on two real workers; the time to the checked result."""
    client = cluster.client
    warm_up(cluster, k, False, timeout)
    collection, expected = make_graph(run.size, k)
    cluster.wait_idle()
    gc.collect()
    timers = PhaseTimers() if run.system == "shoal" else contextlib.nullcontext()
    with timers:
        sched_before, workers_before = cluster.cpu_snapshot()
        t0 = time.perf_counter()
        fut = cluster.call(lambda: client.compute(collection), timeout)
        run.client_s = time.perf_counter() - t0
        result = cluster.call(lambda: fut.result(), max(1.0, timeout - run.client_s))
        run.end_to_end_s = time.perf_counter() - t0
        sched_after, workers_after = cluster.cpu_snapshot()
    run.sched_run_cpu_s = cpu_delta(sched_before, sched_after)[0]
    run.workers_cpu_s = cpu_delta(workers_before, workers_after)[0]
    if isinstance(timers, PhaseTimers):
        run.phases = dict(timers.seconds)
        run.tasks = timers.tasks
        run.scheduled = timers.scheduled
    if int(result) != expected:
        raise AssertionError(f"the result is {result!r}, expected {expected}")
    return fut


def one_run(
    system: str, mode: str, size: int, k: int, timeout: float, args: argparse.Namespace
) -> Run:
    run = Run(system, mode, size)
    n_workers = 0 if mode == "zero" else 2
    logdir = Path(args.logdir) if args.logdir else None
    cluster = Cluster(
        SYSTEMS[system], n_workers=n_workers, timeout=args.startup_timeout, logdir=logdir
    )
    keep_logs = False
    try:
        cluster.start()
        fut = (run_zero if mode == "zero" else run_workers)(cluster, run, k, timeout)
        del fut
    except Exception as e:  # one failing run must not lose the others
        keep_logs = True
        run.error = f"{type(e).__name__}: {e}"
        dead = cluster.diagnose()
        if dead:
            run.error += f"\n{dead}"
        run.error += f"\n(logs kept in {cluster.dir})"
        log(f"!! {system} {mode} {size_label(size)}: {run.error}")
        log(traceback.format_exc())
    finally:
        cluster.stop(remove_logs=not keep_logs)
        gc.collect()
    return run


def run_all(
    args: argparse.Namespace, after_each: Callable[[list[Run], dict[str, str]], object]
) -> tuple[list[Run], dict[str, str]]:
    """Every size (ascending), mode and system, the systems alternating; Dask stops at
    the first size it fails or cannot finish within ``--dask-limit``. Returns the runs
    and, per system, why it skipped the larger sizes; ``after_each`` sees them after
    every run (the report is rewritten, so a long run that is stopped keeps its
    results)."""
    runs: list[Run] = []
    stopped: dict[str, str] = {}
    k = 0
    for i, size in enumerate(args.sizes):
        for mode in args.modes:
            for r in range(args.repeat):
                turn = i + r + args.modes.index(mode)
                for system in (
                    args.systems[turn % len(args.systems) :]
                    + args.systems[: turn % len(args.systems)]
                ):
                    if system in stopped:
                        continue
                    if system == "dask" and args.dask_max_size and size > args.dask_max_size:
                        stopped[system] = f"sizes above --dask-max-size {args.dask_max_size:,}"
                        continue
                    k += 1
                    limit = args.dask_limit if system == "dask" else None
                    timeout = limit or args.timeout or default_timeout(size)
                    log(f"== {system} {mode} {size_label(size)} (run {r + 1}/{args.repeat})")
                    run = one_run(system, mode, size, k, timeout, args)
                    runs.append(run)
                    log(f"   {summary_line(run)}")
                    after_each(runs, stopped)
                    if limit is not None and not run.ok:
                        stopped[system] = (
                            f"failed or exceeded --dask-limit {limit:g} s at "
                            f"{size_label(size)} ({mode})"
                        )
    return runs, stopped


def summary_line(run: Run) -> str:
    if not run.ok:
        return f"FAILED: {(run.error or '').splitlines()[0]}"
    # (Dask's count in workers mode is not taken: its zero-mode run gives it)
    tasks = f"{run.tasks:,} tasks" if run.tasks else f"~{run.size:,} tasks"
    parts = [tasks, f"client {run.client_s:.2f} s"]
    if run.scheduled and run.scheduled != run.tasks:
        parts.insert(1, f"{run.scheduled:,} scheduled")
    if run.submit_s is not None:
        parts.append(f"held after {run.submit_s:.2f} s")
    if run.bytes_per_task is not None:
        parts.append(f"{run.bytes_per_task:.0f} B/task")
    if run.finish_s is not None:
        parts.append(f"zero-work finish {run.finish_s:.2f} s")
    if run.end_to_end_s is not None:
        parts.append(f"end-to-end {run.end_to_end_s:.2f} s")
    if run.workers_us_per_task is not None and run.sched_run_us_per_task is not None:
        parts.append(
            f"CPU/task: workers {run.workers_us_per_task:.0f} µs, "
            f"scheduler {run.sched_run_us_per_task:.0f} µs"
        )
    return ", ".join(parts)


# --- the report ---------------------------------------------------------------------------


def _median(runs: list[Run], attr: str) -> float | None:
    values = [getattr(r, attr) for r in runs if r.ok and getattr(r, attr) is not None]
    return statistics.median(values) if values else None


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _ratio(dask: float | None, shoal: float | None, higher_is_better: bool = False) -> str:
    if not dask or not shoal:
        return "—"
    r = shoal / dask if higher_is_better else dask / shoal
    return f"{r:.2f}×"


class Table:
    """The runs by (system, mode, size)."""

    def __init__(self, runs: list[Run], sizes: list[int]):
        self.runs = runs
        self.sizes = sorted({*sizes, *(r.size for r in runs)})

    def of(self, system: str, mode: str, size: int) -> list[Run]:
        return [r for r in self.runs if (r.system, r.mode, r.size) == (system, mode, size)]

    def median(self, system: str, mode: str, size: int, attr: str) -> float | None:
        return _median(self.of(system, mode, size), attr)

    def tasks(self, system: str, mode: str, size: int, attr: str = "tasks") -> str:
        runs = [r for r in self.of(system, mode, size) if r.ok]
        counts = sorted({getattr(r, attr) or r.tasks for r in runs if r.tasks})
        return "/".join(f"{c:,}" for c in counts) or "—"

    def status(self, system: str, mode: str, size: int, stopped: dict[str, str]) -> str | None:
        """None if there are good runs, else why there is no figure."""
        runs = self.of(system, mode, size)
        if any(r.ok for r in runs):
            return None
        if runs:
            return "FAILED"
        return "skipped" if system in stopped else "not run"


def zero_rows(t: Table, systems: list[str], stopped: dict[str, str]) -> list[list[str]]:
    rows = []
    for size in t.sizes:
        for s in systems:
            why = t.status(s, "zero", size, stopped)
            if why is not None:
                if why != "not run":
                    rows.append([size_label(size), s, why, *["—"] * 8])
                continue

            def m(attr: str, s: str = s, size: int = size) -> float | None:
                return t.median(s, "zero", size, attr)

            sched = m("sched_cpu_s")
            tasks = _median(t.of(s, "zero", size), "tasks")
            rows.append(
                [
                    size_label(size),
                    s,
                    t.tasks(s, "zero", size),
                    t.tasks(s, "zero", size, "scheduled"),
                    _fmt(m("client_s")),
                    _fmt(m("submit_s")),
                    _fmt(m("ingest_rate"), 0),
                    _fmt(sched * 1e6 / tasks if sched and tasks else None, 1),
                    _fmt(m("bytes_per_task"), 0),
                    _fmt(m("finish_s")) if s == "shoal" else "n/a",
                    _fmt(m("client_cpu_s")),
                ]
            )
    return rows


def workers_rows(t: Table, systems: list[str], stopped: dict[str, str]) -> list[list[str]]:
    rows = []
    for size in t.sizes:
        for s in systems:
            why = t.status(s, "workers", size, stopped)
            if why is not None:
                if why != "not run":
                    rows.append([size_label(size), s, why, "—", "—", "—", "—", "—"])
                continue
            rows.append(
                [
                    size_label(size),
                    s,
                    t.tasks(s, "workers", size) if s == "shoal" else t.tasks(s, "zero", size),
                    t.tasks(s, "workers", size, "scheduled")
                    if s == "shoal"
                    else t.tasks(s, "zero", size),
                    _fmt(t.median(s, "workers", size, "client_s")),
                    _fmt(t.median(s, "workers", size, "end_to_end_s")),
                    _fmt(t.median(s, "workers", size, "workers_us_per_task"), 0),
                    _fmt(t.median(s, "workers", size, "sched_run_us_per_task"), 0),
                ]
            )
    return rows


def ratio_rows(t: Table) -> list[list[str]]:
    rows = []
    for size in t.sizes:

        def both(mode: str, attr: str, size: int = size) -> tuple[float | None, float | None]:
            return t.median("dask", mode, size, attr), t.median("shoal", mode, size, attr)

        cells = [
            _ratio(*both("zero", "submit_s")),
            _ratio(*both("zero", "ingest_rate"), higher_is_better=True),
            _ratio(*both("zero", "bytes_per_task")),
            _ratio(*both("workers", "end_to_end_s")),
        ]
        if any(c != "—" for c in cells):
            rows.append([size_label(size), *cells])
    return rows


def phase_rows(t: Table) -> list[list[str]]:
    rows = []
    for size in t.sizes:
        for mode in MODES:
            runs = [r for r in t.of("shoal", mode, size) if r.ok and r.phases]
            if not runs:
                continue
            tasks = statistics.median(r.tasks for r in runs)
            client = statistics.median(r.client_s for r in runs if r.client_s is not None)
            cells = []
            named = 0.0
            for phase in ("materialise", "order", "encode"):
                secs = statistics.median(r.phases[phase] for r in runs)
                named += secs
                cells.append(f"{secs:.2f} s ({secs * 1e6 / tasks:.1f} µs)")
            rest = client - named
            cells.append(f"{rest:.2f} s ({rest * 1e6 / tasks:.1f} µs)")
            rows.append(
                [size_label(size), mode, f"{client:.2f} s ({client * 1e6 / tasks:.1f} µs)", *cells]
            )
    return rows


def bar_rows(t: Table) -> list[list[str]]:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    rows = []
    million = 1_000_000
    submit = t.median("shoal", "zero", million, "submit_s")
    rows.append(
        [
            "1M-task graph submitted (scheduler holds every task)",
            f"< {BAR_SUBMIT_1M:g} s",
            "not run" if submit is None else f"{submit:.1f} s",
            "—" if submit is None else verdict(submit < BAR_SUBMIT_1M),
        ]
    )
    finish = t.median("shoal", "workers", million, "end_to_end_s")
    rows.append(
        [
            "1M-task graph finished on 2 workers (end to end)",
            f"< {BAR_FINISH_1M:g} s",
            "not run" if finish is None else f"{finish:.1f} s",
            "—" if finish is None else verdict(finish < BAR_FINISH_1M),
        ]
    )
    three = 3_000_000
    runs3 = t.of("shoal", "zero", three)
    done3 = t.median("shoal", "zero", three, "finish_s")
    rows.append(
        [
            "3M-task graph finished on zero workers",
            "finishes",
            "not run" if not runs3 else ("FAILED" if done3 is None else f"{done3:.1f} s"),
            "—" if not runs3 else verdict(done3 is not None),
        ]
    )
    for size in t.sizes:
        if size < million:
            continue
        # Per task of the graph (the user's tasks: the scheduler's memory for the
        # graph), with the figure per scheduled task beside it.
        per_task = t.median("shoal", "zero", size, "bytes_per_graph_task")
        per_scheduled = t.median("shoal", "zero", size, "bytes_per_task")
        shown = "—"
        if per_task is not None and per_scheduled is not None:
            shown = f"{per_task:.0f} B ({per_scheduled:,.0f} B per scheduled task)"
        rows.append(
            [
                f"scheduler peak RSS per task of the graph, {size_label(size)}",
                f"≤ {BAR_BYTES} B",
                shown,
                "—" if per_task is None else verdict(per_task <= BAR_BYTES),
            ]
        )
    if not any(s >= million for s in t.sizes):
        rows.append(["scheduler peak RSS per task, ≥ 1M", f"≤ {BAR_BYTES} B", "not run", "—"])
    return rows


def render(
    runs: list[Run],
    stopped: dict[str, str],
    args: argparse.Namespace,
    command: str,
    settings: str,
) -> tuple[str, str]:
    """(the report's markdown, the tables alone for stdout)."""
    t = Table(runs, args.sizes)
    systems = args.systems
    tables: list[str] = []
    zr = zero_rows(t, systems, stopped) if "zero" in args.modes else []
    if zr:
        header = [
            "size",
            "system",
            "tasks",
            "scheduled tasks",
            "client s",
            "submit s",
            "ingest tasks/s",
            "sched µs/task",
            "B/task",
            "zero-work finish s",
            "client CPU s",
        ]
        tables += ["## Zero workers (scheduler only)", "", *_table(header, zr), ""]
    wr = workers_rows(t, systems, stopped) if "workers" in args.modes else []
    if wr:
        header = [
            "size",
            "system",
            "tasks",
            "scheduled tasks",
            "client s",
            "end-to-end s",
            "workers CPU µs/task",
            "sched CPU µs/task",
        ]
        tables += ["## Two workers, one thread each", "", *_table(header, wr), ""]
    rr = ratio_rows(t) if "shoal" in systems and "dask" in systems else []
    if rr:
        header = ["size", "submit s", "ingest tasks/s", "B/task", "end-to-end s"]
        tables += [
            "## shoal against Dask (> 1: shoal better)",
            "",
            "Dask/shoal for times and bytes, shoal/Dask for the ingest rate.",
            "",
            *_table(header, rr),
            "",
        ]
    pr = phase_rows(t)
    if pr:
        header = ["size", "mode", "client s", "materialise", "dask.order", "encode", "other"]
        tables += [
            "## Where shoal's client time goes (seconds, µs per task)",
            "",
            'Until `client.compute` returns; "other" is the rest (expression '
            "optimisation, culling and checking the graph, sorting it, annotations, "
            "handing the parts to the event loop).",
            "",
            *_table(header, pr),
            "",
        ]
    tables += [
        "## The bar (issue 16)",
        "",
        *_table(["target", "bar", "shoal", "met"], bar_rows(t)),
        "",
    ]
    notes = [f"- {s}: {why}; larger sizes skipped" for s, why in stopped.items()]
    notes += [
        f"- {r.system} {r.mode} {size_label(r.size)}: VmHWM could not be reset; the peak is "
        "since the scheduler started"
        for r in runs
        if r.ok and not r.peak_reset
    ]
    failed = [r for r in runs if not r.ok]
    if notes or failed:
        tables += ["## Notes and failures", "", *notes]
        for r in failed:
            first, _, rest = (r.error or "").partition("\n")
            tables.append(f"- {r.system} {r.mode} {size_label(r.size)}: **failed**: {first}")
            if rest:
                tables += ["", "  ```", *(f"  {line}" for line in rest.splitlines()), "  ```"]
        tables.append("")
    return document(
        "shoal graph-scale benchmark",
        command,
        settings,
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        tables,
    )


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="shoal vs Dask: dask.array graphs of 10k-3M tasks")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"task counts (default {DEFAULT_SIZES})")
    p.add_argument("--systems", default="shoal,dask", help="comma-separated (default shoal,dask)")
    p.add_argument("--modes", default=",".join(MODES), help="zero,workers (default both)")
    p.add_argument("--repeat", type=int, default=1, help="runs per size, mode and system")
    p.add_argument(
        "--dask-limit",
        type=float,
        default=600.0,
        help="seconds a Dask run may take; past it, or on failure, larger sizes skip Dask",
    )
    p.add_argument(
        "--dask-max-size",
        type=parse_count,
        default=0,
        help="largest size run on Dask (default: no limit but --dask-limit)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="seconds per run (default 120 + 1.2 ms per task)",
    )
    p.add_argument(
        "--ndim",
        type=int,
        default=1,
        help="the array's axes (default 1; 2 or 3: a reduction over several axes)",
    )
    p.add_argument("--startup-timeout", type=float, default=60.0, help="seconds per cluster start")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report path ('' for none)")
    p.add_argument(
        "--logdir", default="", help="where clusters keep their logs (default: the temp dir)"
    )
    args = p.parse_args(argv)
    try:
        args.sizes = sorted({parse_count(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError as e:
        p.error(str(e))
    if not args.sizes:
        p.error("--sizes names no size")
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r} (expected {', '.join(SYSTEMS)})")
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (expected {', '.join(MODES)})")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.ndim not in (1, 2, 3):
        p.error("--ndim must be 1, 2 or 3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    global NDIM
    NDIM = args.ndim
    command = shlex.join(["python", "benchmarks/graph_scale.py", *(argv or sys.argv[1:])])
    available = []
    for s in args.systems:
        why = SYSTEMS[s].available()
        if why:
            log(f"!! skipping {s}: {why}")
        else:
            available.append(s)
    if not available:
        return 2
    args.systems = available
    load0 = load_average()
    t0 = time.monotonic()

    def report(runs: list[Run], stopped: dict[str, str], final: bool = False) -> str:
        dask_sizes = f"; --dask-max-size {args.dask_max_size:,}" if args.dask_max_size else ""
        axes = "" if args.ndim == 1 else f"the array over {args.ndim} axes (--ndim); "
        settings = (
            f"{axes}sizes {', '.join(size_label(s) for s in args.sizes)}; modes "
            f"{', '.join(args.modes)}; {args.repeat} run(s) per size, mode and system, "
            f"systems {', '.join(args.systems)} alternating; --dask-limit "
            f"{args.dask_limit:g} s{dask_sizes}; total time {time.monotonic() - t0:.0f} s"
            f"{'' if final else ' so far (still running)'}; load average (1/5/15 min) "
            f"{load0} at start, {load_average()} at {'end' if final else 'last write'}"
        )
        doc, tables = render(runs, stopped, args, command, settings)
        write_report(args.out, doc, lambda msg: None if not final else log(msg))
        return tables

    runs, stopped = run_all(args, lambda runs, stopped: report(runs, stopped))
    print(report(runs, stopped, final=True))
    return 1 if any(not r.ok for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
