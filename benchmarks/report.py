"""Turn measured runs into markdown tables (RESULTS.md and stdout)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

from benchmarks.cluster import ROOT, SYSTEMS
from benchmarks.workloads import Workload

BASELINE, CANDIDATE = "dask", "shoal"


@dataclass
class Run:
    wall: float  # seconds, whole workload
    sched_cpu: float  # scheduler process user+system CPU seconds
    worker_cpu: float  # both workers, user+system CPU seconds
    client_cpu: float  # benchmark (client) process CPU seconds
    samples: list[float] | None = None  # latency: per-call seconds
    precise_cpu: bool = True  # CPU from per-thread schedstat (ns), not psutil ticks


@dataclass
class Result:
    workload: Workload
    size: int
    system: str
    zero: bool = False
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    @property
    def n_tasks(self) -> int:
        return self.workload.n_tasks(self.size)

    @property
    def label(self) -> str:
        return self.workload.label(self.size)

    def metrics(self) -> dict[str, float]:
        """Median over the timed runs of every metric (empty if there are none)."""
        if not self.runs:
            return {}
        n = self.n_tasks
        per_run: list[dict[str, float]] = []
        for r in self.runs:
            m = {
                "wall s": r.wall,
                "tasks/s": n / r.wall,
                "sched µs/task": r.sched_cpu * 1e6 / n,
                "workers µs/task": r.worker_cpu * 1e6 / n,
                "client µs/task": r.client_cpu * 1e6 / n,
            }
            if self.workload.kind == "hop":
                m["ms/hop"] = r.wall * 1e3 / n
            if r.samples:
                qs = statistics.quantiles(r.samples, n=10, method="inclusive")
                m["p10 ms"] = qs[0] * 1e3
                m["median ms"] = statistics.median(r.samples) * 1e3
                m["p90 ms"] = qs[-1] * 1e3
            per_run.append(m)
        return {k: statistics.median(m[k] for m in per_run) for k in per_run[0]}


HIGHER_IS_BETTER = {"tasks/s"}

HEADLINE = {
    "latency": ["p10 ms", "median ms", "p90 ms"],
    "throughput": ["tasks/s"],
    "hop": ["ms/hop"],
}
DETAIL = ["wall s", "sched µs/task", "workers µs/task", "client µs/task"]


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ratio(metric: str, cand: float | None, base: float | None) -> str:
    """>1 always means the candidate (shoal) is better."""
    if not cand or not base:
        return "—"
    r = cand / base if metric in HIGHER_IS_BETTER else base / cand
    return f"{r:.2f}×"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _cell(res: Result | None, metric: str) -> str:
    if res is None:
        return "—"
    if res.error and not res.runs:
        return "FAILED"
    return fmt(res.metrics().get(metric))


def _value(res: Result | None, metric: str) -> float | None:
    return res.metrics().get(metric) if res is not None else None


def _has_ratio(systems: list[str]) -> bool:
    return BASELINE in systems and CANDIDATE in systems


def summary_table(results: list[Result], systems: list[str]) -> list[str]:
    by = {(r.label, r.system): r for r in results if not r.zero}
    labels = list(dict.fromkeys(r.label for r in results if not r.zero))
    with_ratio = _has_ratio(systems)
    header = ["workload", "metric", *systems]
    if with_ratio:
        header.append("ratio")
    header += [f"{s} sched µs/task" for s in systems]
    if with_ratio:
        header.append("sched CPU ratio")
    rows = []
    for label in labels:
        res = {s: by.get((label, s)) for s in systems}
        wl = next(r for r in res.values() if r is not None).workload
        metric = HEADLINE[wl.kind][1 if wl.kind == "latency" else 0]
        row = [label, metric, *(_cell(res[s], metric) for s in systems)]
        if with_ratio:
            row.append(ratio(metric, _value(res[CANDIDATE], metric), _value(res[BASELINE], metric)))
        row += [_cell(res[s], "sched µs/task") for s in systems]
        if with_ratio:
            row.append(
                ratio(
                    "sched µs/task",
                    _value(res[CANDIDATE], "sched µs/task"),
                    _value(res[BASELINE], "sched µs/task"),
                )
            )
        rows.append(row)
    return _table(header, rows)


def workload_tables(results: list[Result], systems: list[str]) -> list[str]:
    by = {(r.label, r.system): r for r in results if not r.zero}
    labels = list(dict.fromkeys(r.label for r in results if not r.zero))
    with_ratio = _has_ratio(systems)
    out: list[str] = []
    for label in labels:
        res = {s: by.get((label, s)) for s in systems}
        wl = next(r for r in res.values() if r is not None).workload
        n = next(r for r in res.values() if r is not None).n_tasks
        out += ["", f"### {label}", "", f"{wl.description}; {n:,} tasks.", ""]
        header = ["metric", *systems] + (["ratio"] if with_ratio else [])
        rows = []
        for metric in HEADLINE[wl.kind] + DETAIL:
            row = [metric, *(_cell(res[s], metric) for s in systems)]
            if with_ratio:
                row.append(
                    ratio(metric, _value(res[CANDIDATE], metric), _value(res[BASELINE], metric))
                )
            rows.append(row)
        out += _table(header, rows)
        out += _run_notes(res)
    return out


def _run_notes(res: dict[str, Result | None]) -> list[str]:
    notes = []
    for s, r in res.items():
        if r is None:
            continue
        if r.runs:
            walls = ", ".join(f"{x.wall:.3f}" for x in r.runs)
            notes.append(f"- {s}: {len(r.runs)} timed run(s), wall s = [{walls}]")
            coarse = sum(not x.precise_cpu for x in r.runs)
            if coarse:
                notes.append(f"- {s}: CPU from psutil clock ticks (10 ms) in {coarse} run(s)")
        if r.error:
            notes += _error_lines(s, r.error)
    return [""] + notes if notes else []


def _error_lines(who: str, error: str) -> list[str]:
    first, _, rest = error.partition("\n")
    lines = [f"- {who}: **error** in {first}"]
    if rest:
        lines += ["", "  ```", *(f"  {line}" for line in rest.splitlines()), "  ```"]
    return lines


def zero_table(results: list[Result]) -> list[str]:
    zero = [r for r in results if r.zero]
    if not zero:
        return []
    header = ["workload", "system", "tasks", "tasks/s", "sched µs/task", "wall s"]
    rows = [
        [
            r.label,
            r.system,
            f"{r.n_tasks:,}",
            _cell(r, "tasks/s"),
            _cell(r, "sched µs/task"),
            _cell(r, "wall s"),
        ]
        for r in zero
    ]
    out = _table(header, rows)
    errors = [r for r in zero if r.error]
    if errors:
        out.append("")
    for r in errors:
        out += _error_lines(f"{r.system} {r.label}", r.error or "")
    return out


def _git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
            text=True, timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "shoal"], cwd=ROOT, capture_output=True,
            text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + (" (shoal/ has uncommitted changes)" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_lines(command: str, settings: str) -> list[str]:
    import dask

    versions = [f"dask {dask.__version__}", f"distributed {SYSTEMS['dask'].version()}"]
    versions.append(f"shoal {SYSTEMS['shoal'].version()}")
    return [
        f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {os.cpu_count()} logical CPUs ({psutil.cpu_count(logical=False)} physical), "
        f"{_cpu_model()}, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- python: {sys.version.split()[0]} ({platform.python_implementation()})",
        f"- versions: {', '.join(versions)}; psutil {psutil.__version__}",
        f"- repository commit: {_git_commit()}",
        f"- command: `{command}`",
        f"- settings: {settings}",
    ]


METHOD = """\
Layout per system: one scheduler process, two worker processes with one thread each
(Dask: `--no-nanny --no-dashboard`, default configuration otherwise), the client in the
benchmark process; all on 127.0.0.1 with OS-chosen ports. For each workload, the systems
run one after the other (who goes first alternates from workload to workload), each on
a freshly started cluster with only that cluster alive: one untimed warm-up run, then
the timed runs. Figures are medians over the timed runs.

"sched µs/task" is the scheduler process's CPU time over the timed region divided by
the number of tasks, summed over its threads from /proc/PID/task/*/schedstat (ns
resolution; psutil user+system, 10 ms ticks, only where a thread exited mid-run).
"workers µs/task" is the same for both workers together, "client µs/task" for the
benchmark process.

**ratio > 1 means shoal is better**: shoal/dask for tasks/s, dask/shoal for times and
CPU per task."""


def render(results, systems, command, settings) -> tuple[str, str]:
    """Return (RESULTS.md text, stdout text)."""
    tables = ["## Summary", "", *summary_table(results, systems)]
    if any(not r.zero for r in results):
        tables += ["", "## Per workload", *workload_tables(results, systems)]
    zt = zero_table(results)
    if zt:
        tables += [
            "",
            "## Zero workers (pure scheduler overhead)",
            "",
            "Same scheduler, two `--zero` workers that report every task done at once "
            "without running it.",
            "",
            *zt,
        ]
    doc = [
        "# shoal benchmark results",
        "",
        *machine_lines(command, settings),
        "",
        METHOD,
        "",
        *tables,
        "",
    ]
    return "\n".join(doc), "\n".join(tables)
