"""Peer-to-peer shuffle of a dask dataframe: shoal P2P vs Dask P2P vs shoal "tasks".

    python benchmarks/p2p_shuffle.py [--size 10000000] [--runs 3]
        [--systems dask-p2p,shoal-p2p,shoal-tasks] [--memory-limit auto] [--cluster-per op]
        [--out benchmarks/RESULTS-p2p-shuffle.md]

Layout as in ``benchmarks/run.py``: per system one scheduler process and two worker
processes with one thread each (Dask: ``--no-nanny --no-dashboard``), the client in this
process, all on 127.0.0.1. The events frame (``--size`` rows, ``dask.datasets.timeseries``
-like, see ``benchmarks/shuffle_data.py``; 100,000 rows per partition) and the keys
frame (a tenth of the rows) are made inside the workers from a seed. Two operations:

* shuffle: ``events.shuffle("id")``;
* merge: ``events.merge(keys, on="id", how="inner")`` (both sides shuffled);

each followed on the cluster by a reduction to one row per output partition (rows, sums,
distinct ids; ``shuffle_data.summarize``), which the client gathers and checks against
the expected figures (computed once in the client, one partition at a time, and at
small sizes also with pandas): a wrong row, value or partitioning fails the run. The
timed region is ``client.compute(...).result()``: making the frames, the shuffle, the
reduction. "frame only" times the same without the shuffle (making and reducing the
events), the floor of both.

Systems: Dask with ``shuffle_method="p2p"``; shoal with no ``shuffle_method`` (its
default under a shoal client, P2P); shoal with ``shuffle_method="tasks"``. Each round
runs every system (one after the other, in ``--systems`` order), each operation on a
fresh cluster: an untimed warm-up of that operation at 100,000 rows, then one timed
run; ``--runs`` rounds, figures are medians. Peak RSS:
the kernel's high-water mark of each worker process (VmHWM, reset through
``/proc/PID/clear_refs`` before each operation), the larger of the two workers; "peak
over RSS before": the same minus the worker's RSS just before the operation (what the
operation itself added).
Bytes spilled: Dask, the bytes its P2P buffers wrote to disk (the workers'
``digests_total`` "disk-write" counters; Dask's P2P writes every shard to disk by
default); shoal P2P, the bytes spilled in its "p2p" finish events
(``client.get_events("p2p")``). Ratios are Dask P2P's over shoal's: > 1 means shoal is
better (faster, or a lower peak).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shuffle_data as sd  # noqa: E402
from benchmarks.cluster import ROOT, SYSTEMS, Cluster, System  # noqa: E402
from benchmarks.report import _table, document, load_average, write_report  # noqa: E402
from benchmarks.shuffle_events import p2p_totals  # noqa: E402
from benchmarks.transfer import hwm, log, rss, settle  # noqa: E402
from benchmarks.transfer_tasks import getpid  # noqa: E402
from benchmarks.workloads import _reset_peak_rss  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-p2p-shuffle.md"
VARIANTS = {  # name: (system, shuffle_method; None = the system's default)
    "dask-p2p": ("dask", "p2p"),
    "shoal-p2p": ("shoal", None),
    "shoal-tasks": ("shoal", "tasks"),
}
BASELINE = "dask-p2p"
OPS = ("shuffle", "merge", "frame only")
WARM_ROWS = 100_000
PANDAS_CHECK_ROWS = 1_000_000  # up to this size the reference is also checked with pandas
BAR_SPEED = 2.0  # shoal P2P at least 2x faster than Dask P2P
MB = 1e6


@dataclass
class Run:
    seconds: float
    peaks: list[int]  # per worker, bytes (VmHWM)
    growth: list[int]  # per worker, bytes: the peak over the RSS just before the operation
    spilled: float | None  # bytes
    moved: float | None


@dataclass
class Cell:
    variant: str
    op: str
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    def median(self, fn: Any) -> float | None:
        values = [v for v in (fn(r) for r in self.runs) if v is not None]
        return statistics.median(values) if values else None

    @property
    def seconds(self) -> float | None:
        return self.median(lambda r: r.seconds)

    @property
    def peak(self) -> float | None:
        return self.median(lambda r: max(r.peaks))

    @property
    def growth(self) -> float | None:
        return self.median(lambda r: max(r.growth))

    @property
    def spilled(self) -> float | None:
        return self.median(lambda r: r.spilled)


def shoal_p2p_missing() -> str | None:
    """Why shoal's default shuffle under a shoal client is not P2P (None if it is).
    Called with the shoal client alive and Dask's default."""
    import dask.utils

    method = dask.utils.get_default_shuffle_method()
    if method in ("disk", "tasks"):
        return (
            f"under a shoal client dask's default shuffle method is {method!r}: shoal's "
            "P2P shuffle is not there"
        )
    return None


class Bench:
    """One started cluster of one variant: runs the operations and measures them."""

    def __init__(self, variant: str, cluster: Cluster, reference: sd.Reference, args: Any):
        self.variant, self.cluster, self.ref, self.args = variant, cluster, reference, args
        self.system, self.method = VARIANTS[variant]
        client = cluster.client
        addrs = sorted(cluster.call(lambda: list(client.scheduler_info()["workers"]), 30))
        self.pids = [self.worker_pid(a) for a in addrs]

    def worker_pid(self, address: str) -> int:
        client = self.cluster.client
        return self.cluster.call(
            lambda: client.submit(getpid, workers=[address], pure=False).result(), 60
        )

    def call(self, fn: Any) -> Any:
        return self.cluster.call(fn, self.args.timeout)

    def counters(self) -> dict[str, float] | None:
        """Bytes moved/spilled so far (Dask), or None (shoal reads its events instead)."""
        client = self.cluster.client
        if self.system != "dask":
            return None
        per_worker = self.call(lambda: client.run(sd.dask_p2p_bytes))
        return {k: sum(w[k] for w in per_worker.values()) for k in ("moved", "spilled")}

    def p2p_events(self) -> list[Any] | None:
        """shoal's "p2p" events so far (None for Dask, or a shoal without the event log)."""
        client = self.cluster.client
        if self.system != "shoal" or not hasattr(client, "get_events"):
            return None
        return list(self.call(lambda: client.get_events("p2p")))

    def one(self, op: str, rows: int, seed: int) -> Run:
        client, tag = self.cluster.client, uuid.uuid4().hex[:8]

        def build() -> Any:
            events, keys = sd.frames(rows, seed, tag)
            if op == "shuffle":
                return sd.shuffle_summary(events, self.method)
            if op == "merge":
                return sd.merge_summary(events, keys, self.method)
            return sd.frame_only_summary(events)

        collection = self.call(build)
        settle()
        before, events_before = self.counters(), self.p2p_events()
        for pid in self.pids:
            _reset_peak_rss(pid)
        rss_before = [rss(pid) for pid in self.pids]

        def timed() -> tuple[float, Any]:
            t0 = time.perf_counter()
            parts = client.compute(collection).result()
            return time.perf_counter() - t0, parts

        seconds, parts = self.call(timed)
        peaks = [hwm(pid) for pid in self.pids]
        after = self.counters()
        moved = spilled = None
        if before is not None and after is not None:
            moved, spilled = after["moved"] - before["moved"], after["spilled"] - before["spilled"]
        events_after = self.p2p_events()
        if events_before is not None and events_after is not None:
            # this operation's events: those after the ones seen before (the log keeps
            # each topic's newest 1,000, far more than a run makes)
            seen = len(events_before)
            ours = p2p_totals(events_after[seen:] if events_after[:seen] == events_before else [])
            if ours["finished"]:
                moved, spilled = ours["moved"], ours["spilled"]
        self.check(op, rows, seed, sd.Summary.of(parts))
        growth = [max(0, p - b) for p, b in zip(peaks, rss_before, strict=True)]
        return Run(seconds, peaks, growth, spilled, moved)

    def check(self, op: str, rows: int, seed: int, got: sd.Summary) -> None:
        ref = self.ref if rows == self.args.size else sd.reference(rows, seed)
        want = ref.merge if op == "merge" else ref.shuffle
        if op == "frame only":  # input partitions are not partitioned on id
            got, want = replace(got, ids=0), replace(want, ids=0)
        wrong = got.mismatch(want)
        if wrong:
            raise AssertionError(f"{self.variant} {op}: wrong result: {wrong}")


def system_for(variant: str, memory_limit: str | None) -> System:
    base = SYSTEMS[VARIANTS[variant][0]]
    if not memory_limit:
        return base
    cmd = base.worker_cmd
    return replace(base, worker_cmd=lambda f, n, z: [*cmd(f, n, z), "--memory-limit", memory_limit])


def one_round(variant: str, cells: dict[str, Cell], ref: sd.Reference, args: Any) -> None:
    """One timed run of each operation, after a warm-up of that operation, each on a fresh
    cluster (so no peak RSS carries memory an earlier operation left in the process), or
    all on one cluster with ``--cluster-per system`` (fewer starts, for smoke tests)."""
    ops = [op for op in OPS if not cells[op].error]
    groups = [ops] if args.cluster_per == "system" else [[op] for op in ops]
    for group in groups:
        run_on_one_cluster(variant, group, cells, ref, args)


def run_on_one_cluster(
    variant: str, ops: list[str], cells: dict[str, Cell], ref: sd.Reference, args: Any
) -> None:
    if not ops:
        return
    op = ops[0]
    cluster = Cluster(system_for(variant, args.memory_limit), timeout=args.startup_timeout)
    try:
        cluster.start()
        if variant == "shoal-p2p":
            missing = cluster.call(shoal_p2p_missing, 30)
            if missing:
                raise NotAvailable(missing)
        bench = Bench(variant, cluster, ref, args)
        for op in ops:
            bench.one(op, min(WARM_ROWS, args.size), args.seed)
            run = bench.one(op, args.size, args.seed)
            cells[op].runs.append(run)
            log(
                f"   {variant:12} {op:10} {run.seconds:8.2f} s  peak RSS "
                f"{' / '.join(f'{p / MB:,.0f}' for p in run.peaks)} MB  spilled "
                f"{'—' if run.spilled is None else f'{run.spilled / MB:,.0f} MB'}"
            )
    except NotAvailable as e:
        for cell in cells.values():
            cell.error = f"not available: {e}"
        log(f"!! {variant}: not available: {e}")
    except Exception as e:
        log(f"!! {variant} {op}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        diag = cluster.diagnose()
        cells[op].error = f"{type(e).__name__}: {e}" + (f"\n{diag}" if diag else "")
    finally:
        cluster.stop()


class NotAvailable(RuntimeError):
    pass


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _ratio(base: float | None, cand: float | None) -> str:
    return "—" if not base or not cand else f"{base / cand:.2f}×"


def render(
    cells: dict[tuple[str, str], Cell],
    variants: list[str],
    ref: sd.Reference,
    command: str,
    settings: str,
) -> tuple[str, str]:
    others = [v for v in variants if v != BASELINE] if BASELINE in variants else []
    header = ["operation", "metric", *variants, *(f"{BASELINE} ÷ {v}" for v in others)]
    rows: list[list[str]] = []
    metrics = (
        ("wall s", lambda c: c.seconds, 2),
        ("peak RSS per worker MB", lambda c: None if c.peak is None else c.peak / MB, 0),
        ("peak over RSS before MB", lambda c: None if c.growth is None else c.growth / MB, 0),
        ("spilled MB", lambda c: None if c.spilled is None else c.spilled / MB, 0),
    )
    for op in OPS:
        for name, fn, digits in metrics:
            if op == "frame only" and name == "spilled MB":
                continue
            vals = {v: fn(cells[(v, op)]) for v in variants}
            row = [op, name]
            for v in variants:
                c = cells[(v, op)]
                row.append(
                    "not available"
                    if c.error and c.error.startswith("not available")
                    else "failed"
                    if c.error and not c.runs
                    else _fmt(vals[v], digits)
                )
            ratios = [
                _ratio(vals[BASELINE], vals[v]) if name != "spilled MB" else "—" for v in others
            ]
            rows.append(row + ratios)
    tables = ["## Results", "", *_table(header, rows)]
    tables += ["", "## Bar", "", *bar_lines(cells, variants)]
    notes: list[str] = []
    errors: dict[tuple[str, str], list[str]] = {}
    for (v, op), c in cells.items():
        if c.runs:
            walls = ", ".join(f"{r.seconds:.2f}" for r in c.runs)
            notes.append(f"- {v} {op}: {len(c.runs)} run(s), wall s = [{walls}]")
        if c.error:
            errors.setdefault((v, c.error), []).append(op)
    for (v, error), ops in errors.items():
        first, _, rest = error.partition("\n")
        more = f" ({rest.strip()[:400]})" if rest else ""
        notes.append(f"- {v} ({', '.join(ops)}): **{first}**{more}")
    tables += ["", "## Runs", "", *notes]
    return document(
        "shoal P2P shuffle benchmark",
        command,
        settings,
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        tables,
        data_lines=[
        f"- data: events {ref.shuffle.rows:,} rows, {ref.nbytes / MB:,.0f} MB in memory; keys "
        f"{sd.n_keys(ref.shuffle.rows):,} rows, {ref.keys_nbytes / MB:,.0f} MB",
        ],
    )


def bar_lines(cells: dict[tuple[str, str], Cell], variants: list[str]) -> list[str]:
    if BASELINE not in variants or "shoal-p2p" not in variants:
        return ["(needs dask-p2p and shoal-p2p)"]
    rows = []
    for op in OPS[:2]:
        d, s = cells[(BASELINE, op)], cells[("shoal-p2p", op)]
        if not (d.seconds and s.seconds and d.peak and s.peak):
            rows.append([op, "—", "—", "not measured"])
            continue
        speed, mem = d.seconds / s.seconds, s.peak <= d.peak
        met = speed >= BAR_SPEED and mem
        rows.append([op, f"{speed:.2f}×", f"{s.peak / d.peak:.2f}", "yes" if met else "**no**"])
    return [
        f"shoal P2P at least {BAR_SPEED:g}× faster than Dask P2P, with a peak worker RSS no "
        "higher than Dask's.",
        "",
        *_table(["operation", "speed (Dask ÷ shoal)", "peak RSS (shoal ÷ Dask)", "met"], rows),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="P2P shuffle and merge: shoal vs Dask")
    p.add_argument("--size", type=int, default=10_000_000, help="rows of the events frame")
    p.add_argument("--runs", type=int, default=3, help="timed rounds (default 3; median)")
    p.add_argument("--systems", default=",".join(VARIANTS), help="comma-separated variants")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--memory-limit", default="", help="workers' --memory-limit (default: theirs)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per client call")
    p.add_argument("--startup-timeout", type=float, default=60.0)
    p.add_argument(
        "--cluster-per",
        choices=("op", "system"),
        default="op",
        help="a fresh cluster per operation (default; no peak RSS carries an earlier "
        "operation's memory) or one per system and round (fewer starts: smoke tests)",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report path ('' for none)")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in VARIANTS:
            p.error(f"unknown system {s!r} (expected {', '.join(VARIANTS)})")
    if args.size < sd.MIN_PARTITIONS * 10 or args.runs < 1:
        p.error(f"--size must be at least {sd.MIN_PARTITIONS * 10} and --runs at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/p2p_shuffle.py", *(argv or sys.argv[1:])])
    log(f"== reference for {args.size:,} rows")
    ref = sd.reference(args.size, args.seed, pandas_check=args.size <= PANDAS_CHECK_ROWS)
    load0, t0 = load_average(), time.monotonic()
    cells = {(v, op): Cell(v, op) for v in args.systems for op in OPS}
    for r in range(args.runs):
        for v in args.systems:
            log(f"== round {r + 1}/{args.runs}: {v}")
            mine = {op: cells[(v, op)] for op in OPS}
            if any(c.error and c.error.startswith("not available") for c in mine.values()):
                continue
            one_round(v, mine, ref, args)
    settings = (
        f"{args.runs} round(s), a fresh cluster per system"
        f"{' and operation' if args.cluster_per == 'op' else ' (and round)'}, warm-up at "
        f"{min(WARM_ROWS, args.size):,} rows, seed {args.seed}, worker memory limit "
        f"{args.memory_limit or 'each system default'}; total time {time.monotonic() - t0:.0f} s; "
        f"load average (1/5/15 min) {load0} at start, {load_average()} at end"
    )
    doc, tables = render(cells, args.systems, ref, command, settings)
    print(tables)
    write_report(args.out, doc, log)
    failed = [c for c in cells.values() if c.error and not c.error.startswith("not available")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
