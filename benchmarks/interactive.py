"""Notebook-sized computes: dask's sync scheduler vs shoal vs Dask distributed, side by side.

    python benchmarks/interactive.py [--repeat 30] [--only sum,merge] [--quick]
        [--systems sync,shoal,dask] [--pause 0.05] [--out benchmarks/RESULTS-interactive.md]

Three systems in one run. ``sync``: dask's local synchronous scheduler
(``dask.config.set(scheduler="sync")``) in this process. ``shoal`` and ``dask``: a
client in this process on a cluster of one scheduler process and two worker processes
with one thread each (``benchmarks.cluster.Cluster``; Dask ``--no-nanny
--no-dashboard``), all on 127.0.0.1; both clusters are up for the whole run. Each cell
builds its collection once (untimed); what is timed is one ``collection.compute()``,
that is dask's optimisation, graph submission, the cluster running the graph and the
result coming back. On a cluster it runs in the cluster's client thread (timed there)
under ``dask.config.set(scheduler=client.get)``: that client is Dask's default
scheduler, as in a notebook with it alone, so shuffles are that system's P2P. The sync
scheduler runs under ``dataframe.shuffle.method="disk"``, dask's choice when no
distributed client exists (``value_counts`` is a shuffle: its rows are compared sorted
by index, their order being the shuffle's). Per cell: one untimed warm-up per system, then
``--repeat`` timed computes per system, alternating the systems compute by compute
(the first system of a round rotates), with ``--pause`` seconds after each so one
system's clean-up does not fall into the next one's time. Every result, warm-up
included, must equal the sync scheduler's (type, dtype, index and integers exactly,
floating point values to a relative 1e-9: the same sum can differ in its last bit from
one process to the next); a system with a different result fails that cell, loudly, and
runs no more of it.

Data (made once in this process from seed 0, so the frames and arrays travel inside
every graph, as in a notebook that built them locally):

* ``df``: 2,000,000 rows, ``a`` int64 uniform in [0, 100), ``b`` float64 in [0, 1);
  ``dd.from_pandas(pdf, npartitions=4)``.
* ``small``: 100 rows, ``a`` = 0..99 and three float64 columns, one partition.
* ``frame100``: 500,000 rows like ``df`` plus a float64 ``c``, 100 partitions.
* arrays: ``da.ones((1000, 1000), chunks=250)``; ``x``: ``default_rng(0).random((2000,
  2000), chunks=100)`` (400 chunks); ``tall``: ``random((2000, 100), chunks=(200, 100))``.

``--quick`` divides the frames' rows by 10 and runs 5 timed computes per cell.

Sizes: the issue's sync times are 17.7 (``sum``), 43.2 (``groupby_mean``), 88.9
(``merge``), 10.4 (``array_sum``) and 0.9 ms (``delayed_sum``). The last two are fixed by
the issue; ``sum`` costs mostly dask's own overhead, not data. The frame sizes were
chosen on the shared 2-core machine, where the same sync compute moved by 2-3x with the
other engineers' load. At load average 1, with 1,000,000 rows, the sync scheduler took
7.6 ms for ``sum``, 29 for ``groupby_mean`` and 31 for ``merge`` (the issue's machine was
slower: ``array_sum`` 4.2 ms here against 10.4), hence 2,000,000 rows. The report's
settings line gives the load average of its run.

"tasks" is the size of dask's optimised graph for the sync scheduler; "dask graph ms"
(in the Cells table) the median time dask takes to optimise and materialise it, a part
of every system's compute that no scheduler can save.

Bar (issue 16): every cell's shoal median at most 1.5x the sync scheduler's, and Dask's
at least 2x shoal's.
"""

from __future__ import annotations

import argparse
import functools
import math
import shlex
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import dask.dataframe as dd  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.cluster import ROOT, SYSTEMS, Cluster, ClusterError  # noqa: E402
from benchmarks.report import _table, document, load_average, write_report  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-interactive.md"
ALL_SYSTEMS = ("sync", "shoal", "dask")
BAR_VS_SYNC = 1.5  # shoal's median at most this times the sync scheduler's
BAR_VS_DASK = 2.0  # Dask's median at least this times shoal's
ROWS = 2_000_000
FRAME100_ROWS = 500_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- data and cells ---------------------------------------------------------------------


@dataclass
class Data:
    df: Any
    small: Any
    frame100: Any


def make_data(rows: int, frame100_rows: int) -> Data:
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"a": rng.integers(0, 100, rows), "b": rng.random(rows)})
    small = pd.DataFrame({"a": np.arange(100), **{f"c{i}": rng.random(100) for i in range(3)}})
    big = pd.DataFrame(
        {
            "a": rng.integers(0, 100, frame100_rows),
            "b": rng.random(frame100_rows),
            "c": rng.random(frame100_rows),
        }
    )
    return Data(
        df=dd.from_pandas(pdf, npartitions=4),
        small=dd.from_pandas(small, npartitions=1),
        frame100=dd.from_pandas(big, npartitions=100),
    )


@dataclass(frozen=True)
class CellSpec:
    name: str
    code: str  # what a notebook cell would say
    build: Callable[[Data], Any]  # the collection to compute
    # The result's row order is not part of it (a shuffle's output): compared sorted.
    unordered: bool = False


CELLS: dict[str, CellSpec] = {
    c.name: c
    for c in [
        CellSpec("sum", "df.b.sum()", lambda d: d.df.b.sum()),
        CellSpec("groupby_mean", 'df.groupby("a").b.mean()', lambda d: d.df.groupby("a").b.mean()),
        CellSpec("merge", 'df.merge(small, on="a")', lambda d: d.df.merge(d.small, on="a")),
        CellSpec(
            "array_sum",
            "da.ones((1000, 1000), chunks=250).sum()",
            lambda d: da.ones((1000, 1000), chunks=250).sum(),
        ),
        CellSpec("delayed_sum", "delayed(sum)([1, 2, 3])", lambda d: dask.delayed(sum)([1, 2, 3])),
        CellSpec("describe", "frame100.describe()", lambda d: d.frame100.describe()),
        CellSpec(
            "array_mean0",
            "x.mean(axis=0)",
            lambda d: da.random.default_rng(0).random((2000, 2000), chunks=100).mean(axis=0),
        ),
        CellSpec(
            "value_counts", "df.a.value_counts()", lambda d: d.df.a.value_counts(), unordered=True
        ),
        CellSpec("matmul", "tall.T @ tall", lambda d: matmul_cell()),
    ]
}


def matmul_cell() -> Any:
    """``tall.T @ tall`` (also profiled by profile_interactive.py)."""
    tall = da.random.default_rng(1).random((2000, 100), chunks=(200, 100))
    return tall.T @ tall


@dataclass(frozen=True)
class Graph:
    tasks: int  # in dask's optimised graph for the sync scheduler, finalize task included
    build_ms: float  # median time dask takes to optimise and materialise it (in this process)


def graph_of(collection: Any, repeat: int = 5) -> Graph:
    """The graph ``compute`` hands to a scheduler, and dask's own time to make it: the
    share of every system's compute spent before any scheduler sees a task."""
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    times = []
    with dask.config.set(SYNC_CONFIG):
        for _ in range(repeat):
            t0 = time.perf_counter()
            expr = FinalizeCompute(collections_to_expr([collection], True)).optimize()
            graph = expr.__dask_graph__()
            times.append(time.perf_counter() - t0)
    return Graph(len(graph), statistics.median(times) * 1e3)


# Floating point results are compared to this relative tolerance, not bit for bit: the
# same pandas sum over the same partition can differ in the last bit from one process to
# the next (seen with the sync scheduler itself, and between it and Dask: numpy's SIMD
# summation depends on where the buffer lies in memory). One row lost or doubled in a
# 1,000,000-row sum moves it by about 1e-6, far above this.
FLOAT_RTOL = 1e-9


def mismatch(got: Any, expected: Any) -> str | None:
    """Why ``got`` is not ``expected`` (None if it is): type, dtype, index and integer
    values exactly, floating point values to ``FLOAT_RTOL``."""
    if type(got) is not type(expected):
        return f"a {type(got).__name__}, expected a {type(expected).__name__}"
    close = {"check_exact": False, "rtol": FLOAT_RTOL, "atol": 0.0}
    try:
        if isinstance(expected, pd.DataFrame):
            pd.testing.assert_frame_equal(got, expected, **close)
        elif isinstance(expected, pd.Series):
            pd.testing.assert_series_equal(got, expected, **close)
        elif isinstance(expected, np.ndarray | np.generic):
            if got.dtype != expected.dtype or got.shape != expected.shape:
                return f"{got.dtype} {got.shape}, expected {expected.dtype} {expected.shape}"
            if np.issubdtype(expected.dtype, np.inexact):
                same = np.isclose(got, expected, rtol=FLOAT_RTOL, atol=0.0, equal_nan=True)
            else:
                same = np.asarray(got == expected)
            if not same.all():
                if isinstance(expected, np.generic):
                    return f"{got!r}, expected {expected!r}"
                return f"values differ at {int((~same).sum())} positions"
        elif got != expected:
            return f"{got!r}, expected {expected!r}"
    except AssertionError as e:
        return " ".join(str(e).split())[:300]
    return None


# --- running ----------------------------------------------------------------------------


@dataclass
class Cell:
    system: str
    name: str
    seconds: list[float] = field(default_factory=list)
    error: str | None = None
    wrong: bool = False  # the error is a result different from the sync scheduler's
    by_lane: int = 0  # timed computes answered by lane (shoal/lanes), shoal only

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.seconds) * 1e3 if self.seconds else None

    @property
    def p90_ms(self) -> float | None:
        """Nearest-rank 90th percentile."""
        if not self.seconds:
            return None
        ordered = sorted(self.seconds)
        return ordered[math.ceil(0.9 * len(ordered)) - 1] * 1e3


# The sync scheduler with the shuffle method dask picks when no distributed client exists.
# In this process Dask's client exists, so dask would pick "p2p", which needs Dask's
# workers; Dask and shoal keep their own defaults (P2P, each its own).
SYNC_CONFIG = {"scheduler": "sync", "dataframe.shuffle.method": "disk"}


def sync_compute(collection: Any) -> tuple[Any, float]:
    with dask.config.set(SYNC_CONFIG):
        t0 = time.perf_counter()
        result = collection.compute()
        return result, time.perf_counter() - t0


class Runner:
    """Runs one compute of a collection on a system and times it."""

    def __init__(self, clusters: dict[str, Cluster], timeout: float):
        self.clusters = clusters
        self.timeout = timeout

    def compute(self, system: str, collection: Any) -> tuple[Any, float, bool]:
        """The result, the seconds, and whether shoal answered it by lane."""
        if system == "sync":
            return (*sync_compute(collection), False)
        cluster = self.clusters[system]
        client = cluster.client
        lanes = getattr(client, "_lanes", None)  # (shoal's; counted outside the timing)
        before = lanes.runs if lanes is not None else 0

        def timed() -> tuple[Any, float]:
            # The client as Dask's default scheduler, as in a notebook with it alone: dask
            # then lowers shuffles to that system's P2P. (``compute(scheduler=client)``
            # would not do for shoal: dask optimises before it calls ``client.get``,
            # and with Dask's client the process default, picks Dask's P2P.)
            with dask.config.set(scheduler=client.get):
                t0 = time.perf_counter()
                result = collection.compute()
                return result, time.perf_counter() - t0

        result, seconds = cluster.call(timed, self.timeout)
        return result, seconds, lanes is not None and lanes.runs > before


def run_cells(
    systems: list[str], names: list[str], data: Data, args: argparse.Namespace
) -> tuple[list[Cell], dict[str, int]]:
    """Every cell on every live system, computes alternating between systems."""
    cells = {(s, n): Cell(s, n) for n in names for s in systems}
    graphs: dict[str, Graph] = {}
    clusters: dict[str, Cluster] = {}
    live = list(systems)
    try:
        for s in systems:
            if s == "sync":
                continue
            cluster = clusters[s] = Cluster(SYSTEMS[s], n_workers=2, timeout=args.startup_timeout)
            try:
                cluster.start()
            except Exception as e:
                log(f"!! {s}: {type(e).__name__}: {e}")
                live.remove(s)
                for n in names:
                    cells[(s, n)].error = f"cluster: {type(e).__name__}: {e}"
        runner = Runner(clusters, args.timeout)
        for n in names:
            spec = CELLS[n]
            collection = spec.build(data)
            graphs[n] = graph_of(collection)
            log(f"   {n}: {spec.code} ({graphs[n].tasks} tasks, {graphs[n].build_ms:.1f} ms)")
            try:  # the reference every result must equal
                expected = _canonical(spec, sync_compute(collection)[0])
            except Exception as e:
                log(f"!! sync {n} (the reference): {type(e).__name__}: {e}")
                log(traceback.format_exc())
                for s in systems:
                    cells[(s, n)].error = f"no reference, sync failed: {type(e).__name__}: {e}"
                continue
            check = functools.partial(_one, runner, spec=spec, collection=collection, live=live)
            active = [s for s in live if check(cells[(s, n)], expected)]
            for r in range(args.repeat if active else 0):
                for s in active[r % len(active) :] + active[: r % len(active)]:
                    if cells[(s, n)].error is None:
                        check(cells[(s, n)], expected, timed=True)
                    time.sleep(args.pause)
            for s in systems:
                c = cells[(s, n)]
                if c.seconds:
                    log(f"      {s:6s} median {c.median_ms:8.2f} ms  p90 {c.p90_ms:8.2f} ms")
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return list(cells.values()), graphs


def _canonical(spec: CellSpec, result: Any) -> Any:
    return result.sort_index() if spec.unordered else result


def _one(
    runner: Runner,
    cell: Cell,
    expected: Any,
    *,
    spec: CellSpec,
    collection: Any,
    live: list[str],
    timed: bool = False,
) -> bool:
    """One compute (the warm-up unless ``timed``); False if the cell failed on it."""
    try:
        result, seconds, by_lane = runner.compute(cell.system, collection)
    except Exception as e:  # one failing cell must not lose the others
        cell.error = f"{type(e).__name__}: {e}"
        log(f"!! {cell.system} {cell.name}: {cell.error}")
        log(traceback.format_exc())
        if isinstance(e, ClusterError) or "Timeout" in type(e).__name__:
            live.remove(cell.system)  # that system runs no further cell
        return False
    why = mismatch(_canonical(spec, result), expected)
    if why is not None:
        cell.error, cell.wrong = f"WRONG RESULT: {why}", True
        log(f"!! {cell.system} {cell.name}: wrong result: {why}")
        return False
    if timed:
        cell.seconds.append(seconds)
        cell.by_lane += by_lane
    return True


# --- report -----------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _ratio(num: float | None, den: float | None) -> str:
    return "—" if num is None or den is None or den <= 0 else f"{num / den:.2f}"


def bar(sync_ms: float | None, shoal_ms: float | None, dask_ms: float | None) -> str:
    """'met', 'MISSED (...)' or '—' when a figure is missing."""
    if sync_ms is None or shoal_ms is None or dask_ms is None:
        return "—"
    missed = []
    if shoal_ms > BAR_VS_SYNC * sync_ms:
        missed.append(f"shoal/sync > {BAR_VS_SYNC:g}")
    if dask_ms < BAR_VS_DASK * shoal_ms:
        missed.append(f"dask/shoal < {BAR_VS_DASK:g}")
    return "met" if not missed else f"MISSED ({', '.join(missed)})"


def render(
    cells: list[Cell], graphs: dict[str, Graph], systems: list[str], command: str, settings: str
) -> tuple[str, str]:
    by = {(c.system, c.name): c for c in cells}
    names = list(dict.fromkeys(c.name for c in cells))
    header = ["cell", "tasks"]
    for s in systems:
        header += [f"{s} ms", f"{s} p90"]
    if "shoal" in systems and "sync" in systems:
        header.append("shoal/sync")
    if "shoal" in systems and "dask" in systems:
        header.append("dask/shoal")
    full = all(s in systems for s in ALL_SYSTEMS)
    if full:
        header.append("bar")
    header.append("results")
    rows, errors = [], []
    n_met = 0
    for n in names:
        row = [n, str(graphs[n].tasks) if n in graphs else "—"]
        med: dict[str, float | None] = {}
        for s in systems:
            c = by[(s, n)]
            if c.error:
                row += ["WRONG" if c.wrong else "failed", ""]
                errors.append(f"- {s} {n}: {c.error}")
                med[s] = None
                continue
            med[s] = c.median_ms
            row += [_ms(c.median_ms), _ms(c.p90_ms)]
        if "shoal" in systems and "sync" in systems:
            row.append(_ratio(med["shoal"], med["sync"]))
        if "shoal" in systems and "dask" in systems:
            row.append(_ratio(med["dask"], med["shoal"]))
        if full:
            verdict = bar(med["sync"], med["shoal"], med["dask"])
            n_met += verdict == "met"
            row.append(verdict)
        wrong = [s for s in systems if by[(s, n)].wrong]
        failed = [s for s in systems if by[(s, n)].error and not by[(s, n)].wrong]
        if wrong:
            row.append(f"**WRONG ({', '.join(wrong)})**")
        elif failed:
            row.append(f"failed ({', '.join(failed)})")
        else:
            row.append("equal")
        rows.append(row)
    tables = ["## Results", "", *_table(header, rows)]
    if full:
        tables += [
            "",
            f"Bar met in {n_met} of {len(names)} cells (shoal/sync ≤ {BAR_VS_SYNC:g} and "
            f'dask/shoal ≥ {BAR_VS_DASK:g}, on medians). "ms" is the median compute, '
            '"p90" the nearest-rank 90th percentile; "equal": every result of every '
            "system equalled the sync scheduler's.",
        ]
    cell_rows = [
        [
            n,
            f"`{CELLS[n].code}`",
            *([str(graphs[n].tasks), _ms(graphs[n].build_ms)] if n in graphs else ["—", "—"]),
        ]
        for n in names
    ]
    tables += [
        "",
        "## Cells",
        "",
        "\"dask graph ms\": dask's own optimisation and materialisation of the cell's graph "
        "(median of 5, in the benchmark process): part of every system's compute.",
        "",
        *_table(["cell", "code", "tasks", "dask graph ms"], cell_rows),
    ]
    if "shoal" in systems:
        lane_rows = [
            [n, f"{by[('shoal', n)].by_lane} of {len(by[('shoal', n)].seconds)}"] for n in names
        ]
        tables += [
            "",
            "## Lanes",
            "",
            "shoal's timed computes answered by lane (a one-task get, or a small graph run "
            "whole on one worker; shoal/lanes); the others went through the scheduler.",
            "",
            *_table(["cell", "by lane"], lane_rows),
        ]
    if errors:
        tables += ["", "## Failures", "", *errors]
    return document(
        "shoal interactive benchmark",
        command,
        settings,
        (__doc__ or "").split("\n\n", 1)[1].strip(),
        tables,
    )


# --- command line -----------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="notebook-sized computes: sync vs shoal vs Dask")
    p.add_argument("--repeat", type=int, default=30, help="timed computes per cell and system")
    p.add_argument("--only", default="", help=f"comma-separated cells ({', '.join(CELLS)})")
    p.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="sync,shoal,dask")
    p.add_argument("--quick", action="store_true", help="frames of 1/10 the rows, 5 computes")
    p.add_argument("--pause", type=float, default=0.05, help="seconds after each compute")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per compute")
    p.add_argument("--startup-timeout", type=float, default=60.0, help="seconds per cluster start")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report path ('' for none)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.quick:
        args.repeat = min(args.repeat, 5)
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in ALL_SYSTEMS:
            p.error(f"unknown system {s!r} (expected {', '.join(ALL_SYSTEMS)})")
    if not args.systems:
        p.error("--systems names no system")
    args.only = [c for c in args.only.split(",") if c] or list(CELLS)
    for c in args.only:
        if c not in CELLS:
            p.error(f"unknown cell {c!r} (expected {', '.join(CELLS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Dask warns at every compute that the frames travel inside the graph: that is the
    # notebook case measured here.
    warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
    command = shlex.join(["python", "benchmarks/interactive.py", *(argv or sys.argv[1:])])
    systems = []
    for s in args.systems:
        why = None if s == "sync" else SYSTEMS[s].available()
        if why:
            log(f"!! skipping {s}: {why}")
            continue
        systems.append(s)
    if not systems:
        return 2
    shrink = 10 if args.quick else 1
    data = make_data(ROWS // shrink, FRAME100_ROWS // shrink)
    load0 = load_average()
    t0 = time.monotonic()
    log(f"== interactive on {', '.join(systems)}, computes alternating")
    cells, graphs = run_cells(systems, args.only, data, args)
    load1 = load_average()
    settings = (
        f"1 warm-up + {args.repeat} timed computes per cell and system, systems "
        f"{', '.join(systems)} (alternating compute by compute, the first of each round "
        f"rotating), {args.pause:g} s pause after each compute, frames of "
        f"{ROWS // shrink:,} (df) and {FRAME100_ROWS // shrink:,} (frame100) rows, total "
        f"time {time.monotonic() - t0:.0f} s; load average (1/5/15 min) {load0} at "
        f"start, {load1} at end"
    )
    doc, tables = render(cells, graphs, systems, command, settings)
    print(tables)
    write_report(args.out, doc, log)
    return 1 if any(c.error for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
