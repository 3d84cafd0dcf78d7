"""Turn measured runs into markdown tables (RESULTS.md and stdout)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
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
    extra: dict[str, float] = field(default_factory=dict)  # workload-specific figures


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
            m.update(_extra_metrics(r.extra, n))
            per_run.append(m)
        keys = [k for k in per_run[0] if all(k in m for m in per_run)]
        return {k: statistics.median(m[k] for m in per_run) for k in keys}


def _extra_metrics(extra: dict[str, float], n: int) -> dict[str, float]:
    """Figures a workload reported (``Outcome.metrics``), with per-task forms."""
    m: dict[str, float] = {}
    if "tasks run" in extra:
        m["tasks run"] = extra["tasks run"]
    for what in ("submit", "result"):
        if f"{what} s" in extra:
            m[f"{what} s"] = extra[f"{what} s"]
            m[f"{what} µs/task"] = extra[f"{what} s"] * 1e6 / n
    if "sched peak RSS bytes" in extra:
        m["sched bytes/task"] = extra["sched peak RSS bytes"] / n
        m["sched peak RSS MB"] = extra["sched peak RSS bytes"] / 2**20
    if "sched idle RSS bytes" in extra:
        m["sched idle RSS MB"] = extra["sched idle RSS bytes"] / 2**20
    return m


HIGHER_IS_BETTER = {"tasks/s"}
NO_RATIO = {"tasks run", "sched idle RSS MB"}  # facts, not better or worse
# Totals: only comparable when both systems ran the same size.
SIZE_BOUND = {"wall s", "submit s", "result s", "sched peak RSS MB", "tasks run"}

HEADLINE = {
    "latency": ["p10 ms", "median ms", "p90 ms"],
    "throughput": ["tasks/s"],
    "hop": ["ms/hop"],
    "wall": ["wall s"],
    "memory": ["sched bytes/task"],
}
SUMMARY_METRIC = {"latency": "median ms"}  # else the first headline metric
DETAIL = ["wall s", "sched µs/task", "workers µs/task", "client µs/task"]
KIND_DETAIL = {
    "wall": ["tasks/s", "sched µs/task", "workers µs/task", "client µs/task", "tasks run"],
    "memory": [
        "submit s", "result s", "submit µs/task", "result µs/task", "sched peak RSS MB",
        "sched idle RSS MB", "sched µs/task", "workers µs/task", "client µs/task", "wall s",
        "tasks run",
    ],
}


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
    if not cand or not base or metric in NO_RATIO:
        return "—"
    r = cand / base if metric in HIGHER_IS_BETTER else base / cand
    return f"{r:.2f}×" if r >= 0.1 else f"{r:.2g}×"


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


def _groups(results: list[Result], systems: list[str]) -> list[dict[str, Result | None]]:
    """Non-zero-workload results by workload (in run order), then by system."""
    by: dict[str, dict[str, Result | None]] = {}
    for r in results:
        if not r.zero or r.workload.zero:
            by.setdefault(r.workload.name, {s: None for s in systems})[r.system] = r
    return list(by.values())


def _present(res: dict[str, Result | None]) -> list[Result]:
    return [r for r in res.values() if r is not None]


def _same_size(res: dict[str, Result | None]) -> bool:
    return len({r.size for r in _present(res)}) == 1


def _group_label(res: dict[str, Result | None]) -> str:
    present = _present(res)
    if _same_size(res):
        return present[0].label
    return f"{present[0].workload.name} (" + ", ".join(f"{r.system} {r.label}" for r in present) + ")"


def _ratio_cell(res: dict[str, Result | None], metric: str) -> str:
    if metric in SIZE_BOUND and not _same_size(res):
        return "—"
    if metric == "workers µs/task" and len({r.zero for r in _present(res)}) > 1:
        return "—"  # zero workers against real ones
    return ratio(metric, _value(res[CANDIDATE], metric), _value(res[BASELINE], metric))


def summary_table(results: list[Result], systems: list[str]) -> list[str]:
    with_ratio = _has_ratio(systems)
    header = ["workload", "metric", *systems]
    if with_ratio:
        header.append("ratio")
    header += [f"{s} sched µs/task" for s in systems]
    if with_ratio:
        header.append("sched CPU ratio")
    rows = []
    for res in _groups(results, systems):
        wl = _present(res)[0].workload
        metric = SUMMARY_METRIC.get(wl.kind, HEADLINE[wl.kind][0])
        row = [_group_label(res), metric, *(_cell(res[s], metric) for s in systems)]
        if with_ratio:
            row.append(_ratio_cell(res, metric))
        row += [_cell(res[s], "sched µs/task") for s in systems]
        if with_ratio:
            row.append(_ratio_cell(res, "sched µs/task"))
        rows.append(row)
    return _table(header, rows)


def _tasks_line(res: dict[str, Result | None]) -> str:
    present = _present(res)
    if _same_size(res):
        return f"{present[0].n_tasks:,} tasks"
    return "; ".join(f"{r.system}: {r.n_tasks:,} tasks ({r.label})" for r in present)


def workload_tables(results: list[Result], systems: list[str]) -> list[str]:
    with_ratio = _has_ratio(systems)
    out: list[str] = []
    for res in _groups(results, systems):
        wl = _present(res)[0].workload
        out += ["", f"### {_group_label(res)}", "", f"{wl.description}; {_tasks_line(res)}.", ""]
        header = ["metric", *systems] + (["ratio"] if with_ratio else [])
        rows = []
        for metric in HEADLINE[wl.kind] + KIND_DETAIL.get(wl.kind, DETAIL):
            row = [metric, *(_cell(res[s], metric) for s in systems)]
            if with_ratio:
                row.append(_ratio_cell(res, metric))
            rows.append(row)
        out += _table(header, rows)
        out += _run_notes(res)
    return out


def _run_notes(res: dict[str, Result | None]) -> list[str]:
    notes = []
    counted: set[int] = set()
    for s, r in res.items():
        if r is None:
            continue
        if r.zero:
            notes.append(f"- {s}: on `--zero` workers (every task reported done at once)")
        if r.workload.count is not None and r.size not in counted:
            counted.add(r.size)
            n, secs = r.workload.counted(r.size)
            who = "" if _same_size(res) else f"{r.label}: "
            notes.append(
                f"- {who}{n:,} tasks in dask's optimised graph; building and optimising "
                f"that graph alone took {secs:.2f} s in a client (counted once, untimed)"
            )
        if r.runs:
            walls = ", ".join(f"{x.wall:.3f}" for x in r.runs)
            notes.append(f"- {s}: {len(r.runs)} timed run(s), wall s = [{walls}]")
            coarse = sum(not x.precise_cpu for x in r.runs)
            if coarse:
                notes.append(f"- {s}: CPU from psutil clock ticks (10 ms) in {coarse} run(s)")
            if any(x.extra.get("peak reset") == 0.0 for x in r.runs):
                notes.append(
                    f"- {s}: VmHWM could not be reset (clear_refs); peak RSS is since "
                    "the scheduler started"
                )
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
    zero = [r for r in results if r.zero and not r.workload.zero]
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


MILLION_BAR_BYTES = 1500  # 1.5 KB of scheduler peak RSS per task


def bars_table(results: list[Result]) -> list[str]:
    """The targets set for particular workloads, measured against this run."""

    def val(name: str, system: str, metric: str) -> float | None:
        for r in results:
            if r.workload.name == name and r.system == system and (not r.zero or r.workload.zero):
                return _value(r, metric)
        return None

    rows = []

    def bar(workload: str, what: str, value: float | None, target: str, ok: bool | None) -> None:
        if value is None:
            return
        met = "—" if ok is None else ("yes" if ok else "**no**")
        rows.append([workload, what, fmt(value), target, met])

    pp, plain = val("partial_path", "shoal", "sched µs/task"), val("plain_path", "shoal", "sched µs/task")
    pp_dask = val("partial_path", "dask", "sched µs/task")
    if pp and plain:
        r = pp / plain
        bar("partial_path", "shoal sched CPU per task, partial ÷ no partial", r, "≤ 1.3", r <= 1.3)
    if pp and pp_dask:
        r = pp / pp_dask
        bar("partial_path", "sched CPU per task, shoal ÷ Dask", r, "≤ 0.1", r <= 0.1)
    a, a_dask = val("array", "shoal", "wall s"), val("array", "dask", "wall s")
    if a and a_dask:
        bar("array", "wall time, shoal ÷ Dask", a / a_dask, "≤ 1", a <= a_dask)
    mb, mb_dask = val("million", "shoal", "sched bytes/task"), val("million", "dask", "sched bytes/task")
    if mb is not None:
        bar(
            "million", "shoal scheduler peak RSS per task (bytes)", mb,
            f"≤ {MILLION_BAR_BYTES:,}", mb <= MILLION_BAR_BYTES,
        )
    if mb_dask is not None:
        bar("million", "Dask scheduler peak RSS per task (bytes)", mb_dask, "—", None)
    if not rows:
        return []
    return _table(["workload", "figure", "measured", "target", "met"], rows)


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

Dask collections (array, million) go through each system's `Client.compute`; their
task count is that of dask's optimised graph, and "tasks run" is what the workers
report having run. million runs every time on a fresh cluster, without a warm-up:
"sched bytes/task" is the scheduler's peak RSS (VmHWM, reset via clear_refs before
submission, cross-checked by sampling VmRSS every 20 ms) minus its idle RSS just before
submission, divided by the number of tasks.

**ratio > 1 means shoal is better**: shoal/dask for tasks/s, dask/shoal for times,
CPU and bytes per task; "—" where the sizes differ, for totals."""


def render(results, systems, command, settings) -> tuple[str, str]:
    """Return (RESULTS.md text, stdout text)."""
    tables = ["## Summary", "", *summary_table(results, systems)]
    bt = bars_table(results)
    if bt:
        tables += ["", "## Targets", "", *bt]
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
    return document("shoal benchmark results", command, settings, METHOD, tables)


def document(
    title: str,
    command: str,
    settings: str,
    method: str,
    tables: list[str],
    data_lines: list[str] = [],  # noqa: B006 - read only
) -> tuple[str, str]:
    """A report: the title, the machine and run lines (then ``data_lines``), the
    method, the tables. Returns (the whole document, the tables alone)."""
    doc = [
        f"# {title}",
        "",
        *machine_lines(command, settings),
        *data_lines,
        "",
        method.strip(),
        "",
        *tables,
        "",
    ]
    return "\n".join(doc), "\n".join(tables)


def load_average() -> str:
    """The 1/5/15-minute load averages, as the reports print them: "0.9/1.2/1.6"."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def write_report(out: str, doc: str, log: Callable[[str], None]) -> None:
    """Write the markdown report to ``out`` ('' for none)."""
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc)
        log(f"wrote {path}")
