"""Long tasks on workers whose jobs have a walltime: shoal vs Dask + dask-jobqueue,
on a real SLURM.

    python benchmarks/walltime_fit.py [--tasks 30] [--task-seconds 40]
        [--walltime 00:02:00] [--systems shoal,dask] [--tiny]
        [--out benchmarks/RESULTS-walltime-fit.md]

Each system gets ``SLURMCluster(cores=1, memory="1GB", walltime=WALLTIME)`` (on the
loopback interface) with ``adapt(minimum_jobs=2, maximum_jobs=3)`` and a client in
this process, and runs ``--tasks`` tasks of ``--task-seconds`` each (sleeps, in one
second steps). shoal: each task is submitted with its duration as a hint (when this
shoal's ``Client.submit`` takes ``duration=``), and its workers get a lifetime from the
walltime (its default: the walltime less a margin, staggered). Dask: the same cluster
with ``worker_extra_args=["--lifetime", L, "--lifetime-stagger", S]`` in the
proportions dask-jobqueue documents (55 min and 4 min for a one-hour walltime).

Measured, per system: wall time from submission to the last result; each task's
result checked; task attempts started and finished (every attempt records its start
and its job id, and touches its file each second, in a directory both systems'
workers see): an attempt that never finished was killed by the walltime if its job's
log says SLURM cancelled it "DUE TO TIME LIMIT", else lost otherwise (its worker left,
at its lifetime, with the task running); wasted core-seconds (for unfinished attempts,
from start to their last touch, plus whole recomputations: finished attempts of a task
that had finished before, its result lost with its worker); jobs submitted (the distinct job ids among the job
log files) and of those, killed by the walltime; and the longest time with
fewer than ``minimum_jobs`` workers once the cluster first had them (sampled every
0.2 s), next to the time the first workers took to start.

SLURM: the one ``SLURM_CONF`` points to if it answers, else a single-node SLURM this
script starts in a temporary directory (``benchmarks/local_slurm.py``; root and
Debian's slurm-wlm and munge needed), its node declaring ``--node-cpus`` CPUs (default
4: the three jobs ``maximum_jobs`` allows and a replacement run at once, as on a real
cluster with room; the tasks sleep, so a 2-core machine holds them).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.local_slurm import local_slurm  # noqa: E402
from benchmarks.report import _table, load_average, machine_lines, write_report  # noqa: E402
from benchmarks.transfer import log  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-walltime-fit.md"
MINIMUM_JOBS, MAXIMUM_JOBS = 2, 3


def fit_task(index: int, seconds: float, attempts_dir: str) -> int:
    """Sleep ``seconds`` in one-second steps, recording the attempt: its file is
    created at the start, touched every second, and renamed ``.done`` at the end."""
    path = Path(attempts_dir) / f"{index}-{uuid.uuid4().hex[:8]}.run"
    path.write_text(f"{time.time()} {os.environ.get('SLURM_JOB_ID', '')}\n")
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        path.touch()
    path.rename(path.with_suffix(".done"))
    return index * index


@dataclass
class Outcome:
    system: str
    wall: float | None = None
    correct: int = 0
    tasks: int = 0
    started: int = 0
    finished: int = 0
    wasted: float = 0.0
    by_walltime: int = 0
    recomputed: int = 0
    jobs: int = 0
    jobs_walltime_killed: int = 0
    startup: float | None = None
    longest_below: float = 0.0
    duration_hint: str = ""
    lifetime: str = ""
    error: str = ""
    notes: list[str] = field(default_factory=list)


class WorkerSampler:
    """Every 0.2 s, the number of workers; the longest run below ``minimum``."""

    def __init__(self, count: Callable[[], int], minimum: int):
        self.count, self.minimum = count, minimum
        self.reached: float | None = None
        self.below_since: float | None = None
        self.longest = 0.0
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                n = self.count()
            except Exception:
                continue
            now = time.monotonic()
            self.samples.append((now, n))
            if self.reached is None:
                if n >= self.minimum:
                    self.reached = now
                continue
            if n < self.minimum and self.below_since is None:
                self.below_since = now
            elif n >= self.minimum and self.below_since is not None:
                self.longest = max(self.longest, now - self.below_since)
                self.below_since = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.below_since is not None:
            self.longest = max(self.longest, time.monotonic() - self.below_since)


@dataclass
class Attempts:
    started: int = 0
    finished: int = 0
    wasted: float = 0.0  # core-seconds of the unfinished attempts and of the recomputed
    by_walltime: int = 0  # unfinished, in a job SLURM killed at its time limit
    recomputed: int = 0  # finished attempts of a task that had finished before


def attempts(attempts_dir: Path, walltime_killed: set[str] = frozenset()) -> Attempts:  # type: ignore[assignment]
    """Count the attempts recorded in ``attempts_dir`` (see ``fit_task``); those in a job
    of ``walltime_killed`` that never finished were killed by the walltime."""
    out = Attempts()
    finished: dict[str, list[float]] = {}  # task index -> durations of its finished attempts
    for path in attempts_dir.iterdir():
        out.started += 1
        start, _, job = path.read_text().strip().partition(" ")
        seconds = max(0.0, path.stat().st_mtime - float(start))
        if path.suffix == ".done":
            out.finished += 1
            finished.setdefault(path.name.partition("-")[0], []).append(seconds)
            continue
        out.wasted += seconds
        out.by_walltime += job in walltime_killed
    for durations in finished.values():  # all but one finished attempt were recomputations
        out.recomputed += len(durations) - 1
        out.wasted += sum(sorted(durations)[1:])
    return out


def walltime_killed(log_dir: Path) -> set[str]:
    """Job ids whose log says SLURM cancelled them at their time limit."""
    return {
        p.stem.rpartition("-")[2]
        for p in log_dir.iterdir()
        if p.suffix in (".out", ".err") and "DUE TO TIME LIMIT" in p.read_text(errors="replace")
    }


def job_ids(log_dir: Path) -> set[str]:
    """Job ids among the log files (``NAME-ID.out``/``.err``)."""
    return {p.stem.rpartition("-")[2] for p in log_dir.iterdir() if p.suffix in (".out", ".err")}


def dask_lifetime(walltime_s: int) -> tuple[str, str]:
    """dask-jobqueue's documented proportions: --lifetime 55m --lifetime-stagger 4m for
    a one-hour walltime."""
    return f"{walltime_s * 55 // 60}s", f"{walltime_s * 4 // 60}s"


def run_system(name: str, args: argparse.Namespace, work: Path) -> Outcome:
    out = Outcome(name, tasks=args.tasks)
    attempts_dir, log_dir = work / name / "attempts", work / name / "logs"
    attempts_dir.mkdir(parents=True)
    log_dir.mkdir(parents=True)
    try:
        with _cluster(name, args, log_dir, out) as (cluster, client, count):
            t_start = time.monotonic()
            sampler = WorkerSampler(count, MINIMUM_JOBS)
            try:
                while sampler.reached is None:
                    if time.monotonic() - t_start > args.startup_timeout:
                        raise TimeoutError(f"{MINIMUM_JOBS} workers did not start in time")
                    time.sleep(0.1)
                out.startup = sampler.reached - t_start
                log(f"{name}: {MINIMUM_JOBS} workers after {out.startup:.1f}s; submitting")
                t0 = time.monotonic()
                futures = [
                    _submit(name, client, i, args.task_seconds, str(attempts_dir), out)
                    for i in range(args.tasks)
                ]
                while not all(f.done() for f in futures):
                    if time.monotonic() - t0 > args.run_timeout:
                        done = sum(f.done() for f in futures)
                        raise TimeoutError(
                            f"{done}/{len(futures)} tasks done after {args.run_timeout:g} s"
                        )
                    time.sleep(0.2)
                results = client.gather(futures)
                out.wall = time.monotonic() - t0
            finally:
                sampler.stop()
            out.correct = sum(r == i * i for i, r in enumerate(results))
            out.longest_below = sampler.longest
    except Exception as e:
        out.error = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())
    with contextlib.suppress(Exception):
        killed = walltime_killed(log_dir)
        counts = attempts(attempts_dir, killed)
        out.started, out.finished, out.wasted = counts.started, counts.finished, counts.wasted
        out.by_walltime, out.recomputed = counts.by_walltime, counts.recomputed
        out.jobs, out.jobs_walltime_killed = len(job_ids(log_dir)), len(killed)
    log(f"{name}: {out}")
    return out


def _submit(name: str, client: Any, i: int, seconds: float, attempts_dir: str, out: Outcome) -> Any:
    key = f"fit-{i}"
    if name == "shoal" and "duration" in inspect.signature(client.submit).parameters:
        out.duration_hint = f"duration={seconds:g}"
        return client.submit(fit_task, i, seconds, attempts_dir, key=key, duration=seconds)
    out.duration_hint = out.duration_hint or "none (this Client.submit takes no duration)"
    if name == "dask":
        out.duration_hint = "none (Dask has no duration hint)"
    return client.submit(fit_task, i, seconds, attempts_dir, key=key, pure=False)


@contextlib.contextmanager
def _cluster(name: str, args: argparse.Namespace, log_dir: Path, out: Outcome) -> Iterator[Any]:
    common = dict(
        cores=1,
        memory="1GB",
        walltime=args.walltime,
        processes=1,
        interface="lo",
        log_directory=str(log_dir),
        python=sys.executable,
    )
    if name == "shoal":
        from shoal import Client
        from shoal.jobqueue import SLURMCluster

        with SLURMCluster(**common) as cluster:  # type: ignore[arg-type]
            lifetime, stagger = cluster.lifetime or (0, 0)
            out.lifetime = f"--lifetime {lifetime}s --lifetime-stagger {stagger}s (shoal's default)"
            cluster.adapt(minimum_jobs=MINIMUM_JOBS, maximum_jobs=MAXIMUM_JOBS)
            with Client(cluster) as client:
                yield cluster, client, lambda: cluster.n_joined
        return
    from dask_jobqueue import SLURMCluster as DaskSLURMCluster
    from distributed import Client as DaskClient

    from shoal.jobqueue._options import parse_walltime

    lifetime, stagger = dask_lifetime(parse_walltime(args.walltime))
    out.lifetime = f"--lifetime {lifetime} --lifetime-stagger {stagger} (dask-jobqueue docs)"
    with DaskSLURMCluster(
        **common,
        worker_extra_args=["--lifetime", lifetime, "--lifetime-stagger", stagger],
        scheduler_options={"dashboard_address": None},
    ) as cluster:
        cluster.adapt(minimum_jobs=MINIMUM_JOBS, maximum_jobs=MAXIMUM_JOBS)
        with DaskClient(cluster) as client:
            yield cluster, client, lambda: len(cluster.scheduler.workers)


def _queue_empty(timeout: float = 30.0) -> bool:
    """Whether the queue empties within ``timeout`` (cancelled jobs take a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["squeue", "--noheader"], capture_output=True, text=True, timeout=10)
        if not out.stdout.strip():
            return True
        if time.monotonic() > deadline:
            subprocess.run(["scancel", "--user", str(os.getuid())], capture_output=True, timeout=10)
            return False
        time.sleep(0.5)


@contextlib.contextmanager
def slurm(mode: str, cpus: int) -> Iterator[str]:
    """A SLURM to use: the configured one if it answers (``auto``/``existing``), else one
    started here (``auto``/``local``)."""
    answers = (
        bool(os.environ.get("SLURM_CONF"))
        and subprocess.run(["scontrol", "ping"], capture_output=True, timeout=10).returncode == 0
    )
    if mode == "existing" or (mode == "auto" and answers):
        if not answers:
            raise RuntimeError("no SLURM answers (SLURM_CONF unset or scontrol ping fails)")
        yield f"the SLURM at {os.environ['SLURM_CONF']}"
        return
    with tempfile.TemporaryDirectory(prefix="shoal-slurm-") as d, local_slurm(Path(d), cpus=cpus):
        yield (
            f"a single-node SLURM started by this script (benchmarks/local_slurm.py), the "
            f"node declaring {cpus} CPUs"
        )


def render(outs: list[Outcome], args: argparse.Namespace, command: str, settings: str) -> str:
    rows = []
    for o in outs:
        lost = o.started - o.finished
        rows.append(
            [
                o.system,
                f"{o.wall:.0f}" if o.wall is not None else "—",
                f"{o.correct}/{o.tasks}",
                f"{o.started} / {o.finished}",
                str(o.by_walltime),
                str(lost - o.by_walltime),
                str(o.recomputed),
                f"{o.wasted:.0f}",
                f"{o.jobs} ({o.jobs_walltime_killed})",
                f"{o.longest_below:.1f}",
                f"{o.startup:.1f}" if o.startup is not None else "—",
            ]
        )
    table = _table(
        [
            "system",
            "wall s",
            "correct",
            "attempts started / finished",
            "attempts killed by walltime",
            "attempts lost otherwise",
            "tasks recomputed",
            "wasted core-s",
            "jobs submitted (killed by walltime)",
            f"longest s below {MINIMUM_JOBS} workers",
            "first workers' start-up s",
        ],
        rows,
    )
    details = [
        f"- {o.system}: worker lifetime {o.lifetime or '—'}; duration hint "
        f"{o.duration_hint or '—'}" + (f"; ERROR {o.error}" if o.error else "")
        for o in outs
    ]
    doc = [
        "# Long tasks under a walltime: shoal vs Dask + dask-jobqueue on a real SLURM",
        "",
        *machine_lines(command, settings),
        "",
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        "",
        "## Results",
        "",
        *table,
        "",
        *details,
        "",
    ]
    return "\n".join(doc)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Long tasks under a walltime: shoal vs Dask")
    p.add_argument("--tasks", type=int, default=30)
    p.add_argument("--task-seconds", type=float, default=40.0)
    p.add_argument("--walltime", default="00:02:00")
    p.add_argument("--systems", default="shoal,dask")
    p.add_argument("--slurm", choices=["auto", "local", "existing"], default="auto")
    p.add_argument(
        "--node-cpus",
        type=int,
        default=MAXIMUM_JOBS + 1,
        help="CPUs the started SLURM's node declares (default: maximum_jobs + 1, so that "
        "a replacement need not wait for a CPU; the tasks sleep)",
    )
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds for the tasks")
    p.add_argument("--tiny", action="store_true", help="6 tasks of 2 s: a quick check")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report path ('' for none)")
    args = p.parse_args(argv)
    if args.tiny:
        args.tasks, args.task_seconds, args.walltime = 6, 2.0, "00:01:00"
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in ("shoal", "dask"):
            p.error(f"unknown system {s!r} (expected shoal, dask)")
    if args.tasks < 1 or args.task_seconds <= 0:
        p.error("--tasks must be >= 1 and --task-seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/walltime_fit.py", *(argv or sys.argv[1:])])
    # Jobs get this environment: their workers import this module (fit_task) by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(
            filter(None, [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
        )
    )
    load0, t0 = load_average(), time.monotonic()
    outs = []
    with (
        slurm(args.slurm, args.node_cpus) as which,
        tempfile.TemporaryDirectory(prefix="walltime-fit-") as d,
    ):
        for name in args.systems:
            log(f"== {name}")
            outs.append(run_system(name, args, Path(d)))
            if not _queue_empty():
                outs[-1].error = outs[-1].error or "jobs left in the queue after close"
    settings = (
        f"SLURMCluster(cores=1, memory='1GB', walltime={args.walltime!r}), "
        f"adapt(minimum_jobs={MINIMUM_JOBS}, maximum_jobs={MAXIMUM_JOBS}); {args.tasks} tasks "
        f"of {args.task_seconds:g} s; {which}; total time {time.monotonic() - t0:.0f} s; "
        f"load average (1/5/15 min) {load0} at start, {load_average()} at end"
    )
    doc = render(outs, args, command, settings)
    print(doc.split("## Results", 1)[1])
    write_report(args.out, doc, log)
    return 1 if any(o.error or o.correct != o.tasks for o in outs) else 0


if __name__ == "__main__":
    sys.exit(main())
