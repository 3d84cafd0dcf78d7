"""Moving data: shoal vs Dask distributed side by side.

    python benchmarks/transfer.py [--repeat 3] [--sizes 1MB,100MB,1GB] [--kinds numpy,pandas]
        [--bytes-sizes 1GB] [--ops gather,scatter,w2w] [--systems shoal,dask] [--quick]
        [--sequential] [--out benchmarks/RESULTS-transfer.md]

Same layout as ``benchmarks/run.py``: per system one scheduler process and two worker
processes with one thread each (Dask: ``--no-nanny --no-dashboard``), the client in this
process, all on 127.0.0.1. Both systems' clusters run at once and each cell's timed runs
alternate between them (``--sequential``: one system after the other), so the load of a
shared machine falls on both alike. For every payload (a float64 numpy array, a pandas frame of
four float64 columns, a ``bytes``; ``transfer_tasks.make_payload``) and size:

* gather: the payload is made on worker A (pinned with ``workers=``); timed:
  ``future.result()`` in the client. Sender A, receiver the client.
* scatter: the payload is made in the client; timed: ``client.scatter(value,
  workers=[B])`` (both systems' defaults otherwise, so both hash the data to name it).
  Sender the client, receiver B.
* w2w: the payload is made on worker A; timed: a task on worker B that takes it as an
  argument (``payload_nbytes``), from submit to its result. Sender A, receiver B.

MB/s is the payload's size over the timed wall time. Peak RSS: the kernel's high-water
mark (VmHWM, reset through ``/proc/PID/clear_refs`` just before the timed part) of each
side, minus that process's RSS before the payload existed (sender) or before the
transfer (receiver), over the payload's size: 1.0 means the payload itself and nothing
more. Each cell is the median of ``--repeat`` runs (each run makes a fresh payload and
releases everything after; shoal's received arrays may land in memory recycled from
the run before, see "First timed run"). Ratios are shoal/Dask for MB/s (> 1: shoal faster) and
Dask/shoal for peak RSS (> 1: shoal leaner).

All processes share one machine, so shoal's gathers and worker-to-worker transfers of
1 MiB or more take its same-host path: the holder lends the buffers and the receiver
copies them from its memory (``shoal/comm/same_host.py``). ``--socket-only`` turns
that off for shoal's processes (``SHOAL_COMM__SAME_HOST_TRANSFERS=False``), to
measure what crosses a network. Scatter always goes by socket.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import ROOT, SYSTEMS, Cluster, ClusterError  # noqa: E402
from benchmarks.report import _table, document, load_average, write_report  # noqa: E402
from benchmarks.transfer_tasks import getpid, make_payload, payload_nbytes  # noqa: E402
from benchmarks.workloads import _reset_peak_rss, _status_kb  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-transfer.md"
OPS = ("gather", "scatter", "w2w")
MB = 1_000_000
BAR_SPEED = 2.0  # shoal's MB/s over Dask's, gather and w2w, at >= 100 MB
BAR_RSS = 1.5  # peak RSS over the payload, each side, at >= 100 MB


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    for unit, mult in (("GB", 1000 * MB), ("MB", MB), ("KB", 1000)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(float(text))


def label(n: int) -> str:
    return f"{n / (1000 * MB):g} GB" if n >= 1000 * MB else f"{n / MB:g} MB"


@dataclass
class Run:
    seconds: float
    sender_peak: float  # bytes over the sender's baseline
    receiver_peak: float


@dataclass
class Cell:
    system: str
    op: str
    kind: str
    nbytes: int
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    def median(self, attr: str) -> float | None:
        if not self.runs:
            return None
        return statistics.median(getattr(r, attr) for r in self.runs)

    @property
    def mbps(self) -> float | None:
        s = self.median("seconds")
        return None if s is None else self.nbytes / MB / s

    def peak(self, side: str) -> float | None:
        p = self.median(f"{side}_peak")
        return None if p is None else p / self.nbytes


def rss(pid: int) -> int:
    return _status_kb(pid, "VmRSS") * 1024


def hwm(pid: int) -> int:
    return _status_kb(pid, "VmHWM") * 1024


def settle(seconds: float = 0.3) -> None:
    """Let released memory go back (both systems free asynchronously)."""
    gc.collect()
    time.sleep(seconds)


class Bench:
    def __init__(self, cluster: Cluster, timeout: float):
        self.cluster = cluster
        self.timeout = timeout
        client = cluster.client
        addrs = sorted(cluster.call(lambda: list(client.scheduler_info()["workers"]), 30))
        self.a, self.b = addrs[0], addrs[1]
        self.pid = {
            addr: cluster.call(
                lambda addr=addr: client.submit(getpid, workers=[addr], pure=False).result(), 30
            )
            for addr in addrs
        }
        self.me = os.getpid()

    def call(self, fn: Any) -> Any:
        return self.cluster.call(fn, self.timeout)

    def one(self, op: str, kind: str, nbytes: int) -> Run:
        client = self.cluster.client
        a, b = self.a, self.b
        if op == "scatter":
            sender, receiver = self.me, self.pid[b]
        else:
            sender = self.pid[a]
            receiver = self.me if op == "gather" else self.pid[b]
        settle()
        sender_base = rss(sender)
        box: dict[str, Any] = {}
        if op == "scatter":
            box["value"] = make_payload(kind, nbytes)
        else:
            box["src"] = self.call(
                lambda: client.submit(make_payload, kind, nbytes, workers=[a], pure=False)
            )
            self.call(lambda: _wait(client, box["src"]))
        receiver_base = rss(receiver)
        _reset_peak_rss(sender)
        _reset_peak_rss(receiver)

        def timed() -> float:
            t0 = time.perf_counter()
            if op == "gather":
                box["got"] = box["src"].result()
            elif op == "scatter":
                box["dst"] = client.scatter(box["value"], workers=[b])
                _wait(client, box["dst"])
            else:
                box["dst"] = client.submit(payload_nbytes, box["src"], workers=[b], pure=False)
                box["n"] = box["dst"].result()
            return time.perf_counter() - t0

        seconds = self.call(timed)
        run = Run(seconds, hwm(sender) - sender_base, hwm(receiver) - receiver_base)
        if op == "gather":
            got = box["got"]
            size = payload_nbytes(got)
            if size != nbytes:
                raise AssertionError(f"gathered {size} bytes, expected {nbytes}")
        if op == "w2w" and abs(box["n"] - nbytes) > 64:
            raise AssertionError(f"the task on B saw {box['n']} bytes, expected {nbytes}")
        box.clear()
        self.call(lambda: None)  # the client thread drops its references too
        settle()
        return run


def _wait(client: Any, fut: Any) -> None:
    mod = sys.modules[type(client).__module__.split(".")[0]]
    mod.wait([fut])


def run_interleaved(
    systems: list[str], args: argparse.Namespace, plan: list[tuple[str, str, int]]
) -> list[Cell]:
    """Every system's cluster up at once; each cell's runs alternate between systems
    (the first system of a round rotates), so a shared machine's changing load falls
    on all of them alike instead of on whichever ran later."""
    cells = {(s, op, kind, n): Cell(s, op, kind, n) for op, kind, n in plan for s in systems}
    clusters: dict[str, Cluster] = {}
    benches: dict[str, Bench] = {}
    try:
        for s in systems:
            cluster = clusters[s] = Cluster(SYSTEMS[s], n_workers=2, timeout=args.startup_timeout)
            try:
                cluster.start()
                benches[s] = Bench(cluster, args.timeout)
            except Exception as e:
                log(f"!! {s}: {type(e).__name__}: {e}")
                for (sys_, *_), cell in cells.items():
                    if sys_ == s:
                        cell.error = f"cluster: {type(e).__name__}: {e}"
        for op, kind, n in plan:
            log(f"   {op} {kind} {label(n)}")
            live = [s for s in systems if s in benches]
            for s in live:
                _one_run(benches, cells[(s, op, kind, n)], min(n, 1 * MB), warm_up=True)
            for r in range(args.repeat):
                for s in live[r % len(live) :] + live[: r % len(live)]:
                    _one_run(benches, cells[(s, op, kind, n)], n)
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return list(cells.values())


def _one_run(benches: dict[str, Bench], cell: Cell, nbytes: int, warm_up: bool = False) -> None:
    bench = benches.get(cell.system)
    if cell.error or bench is None:
        cell.error = cell.error or "its cluster failed in an earlier cell"
        return
    try:
        run = bench.one(cell.op, cell.kind, nbytes)
    except Exception as e:  # one failing cell must not lose the others
        cell.error = f"{type(e).__name__}: {e}"
        log(f"!! {cell.system} {cell.op} {cell.kind} {label(cell.nbytes)}: {cell.error}")
        log(traceback.format_exc())
        if isinstance(e, ClusterError) or "Timeout" in type(e).__name__:
            del benches[cell.system]  # that system runs no further cell
        return
    if warm_up:
        return
    cell.runs.append(run)
    log(
        f"      {cell.system:6s}{nbytes / MB / run.seconds:8.0f} MB/s  sender "
        f"{run.sender_peak / nbytes:.2f}x  receiver {run.receiver_peak / nbytes:.2f}x"
    )


def run_system(
    system: str, args: argparse.Namespace, plan: list[tuple[str, str, int]]
) -> list[Cell]:
    cells = [Cell(system, op, kind, n) for op, kind, n in plan]
    cluster = Cluster(SYSTEMS[system], n_workers=2, timeout=args.startup_timeout)
    try:
        cluster.start()
        bench = Bench(cluster, args.timeout)
        for cell in cells:
            log(f"   {system} {cell.op} {cell.kind} {label(cell.nbytes)}")
            try:
                bench.one(cell.op, cell.kind, min(cell.nbytes, 1 * MB))  # warm-up
                for _ in range(args.repeat):
                    run = bench.one(cell.op, cell.kind, cell.nbytes)
                    cell.runs.append(run)
                    log(
                        f"      {cell.nbytes / MB / run.seconds:8.0f} MB/s  sender "
                        f"{run.sender_peak / cell.nbytes:.2f}x  receiver "
                        f"{run.receiver_peak / cell.nbytes:.2f}x"
                    )
            except Exception as e:  # one failing cell must not lose the others
                cell.error = f"{type(e).__name__}: {e}"
                log(f"!! {system} {cell.op} {cell.kind} {label(cell.nbytes)}: {cell.error}")
                log(traceback.format_exc())
                if isinstance(e, ClusterError) or "Timeout" in type(e).__name__:
                    break
    except Exception as e:
        log(f"!! {system}: {type(e).__name__}: {e}")
        for cell in cells:
            cell.error = cell.error or f"cluster: {type(e).__name__}: {e}"
    finally:
        cluster.stop()
    return cells


def _fmt(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _ratio(x: float | None, y: float | None) -> str:
    # (a peak of ~0: shoal's receiver reused memory it held before the transfer; a
    # ratio over it would only measure noise)
    return "—" if x is None or y is None or abs(y) < 0.01 else f"{x / y:.2f}"


def _first_runs(
    by: dict[tuple[str, str, str, int], Cell], keys: list[Any], systems: list[str]
) -> list[list[str]]:
    rows = []
    for op, kind, n in keys:
        row = [op, kind, label(n)]
        for s in systems:
            c = by.get((s, op, kind, n))
            row.append(_fmt(n / MB / c.runs[0].seconds) if c is not None and c.runs else "—")
        rows.append(row)
    return rows


def render(cells: list[Cell], systems: list[str], command: str, settings: str) -> tuple[str, str]:
    by = {(c.system, c.op, c.kind, c.nbytes): c for c in cells}
    keys = sorted(
        {(c.op, c.kind, c.nbytes) for c in cells}, key=lambda k: (OPS.index(k[0]), k[1], k[2])
    )
    header = ["op", "payload", "size"]
    for s in systems:
        header += [f"{s} MB/s", f"{s} peak sender", f"{s} peak receiver"]
    both = "shoal" in systems and "dask" in systems
    if both:
        header += ["MB/s shoal/dask", "sender dask/shoal", "receiver dask/shoal"]
    rows = []
    errors = []
    bars = []
    for op, kind, n in keys:
        row = [op, kind, label(n)]
        for s in systems:
            c = by.get((s, op, kind, n))
            if c is None or c.error:
                row += ["failed" if c is not None else "—", "", ""]
                if c is not None:
                    errors.append(f"- {s} {op} {kind} {label(n)}: {c.error}")
                continue
            row += [
                _fmt(c.mbps),
                _fmt(c.peak("sender"), 2) + "x",
                _fmt(c.peak("receiver"), 2) + "x",
            ]
        if both:
            sh, dk = by.get(("shoal", op, kind, n)), by.get(("dask", op, kind, n))
            ok = sh is not None and dk is not None and not sh.error and not dk.error
            row += [
                _ratio(sh.mbps, dk.mbps) if ok else "—",  # type: ignore[union-attr]
                _ratio(dk.peak("sender"), sh.peak("sender")) if ok else "—",  # type: ignore[union-attr]
                _ratio(dk.peak("receiver"), sh.peak("receiver")) if ok else "—",  # type: ignore[union-attr]
            ]
            if ok and n >= 100 * MB:
                assert sh is not None and dk is not None
                speed = sh.mbps / dk.mbps if sh.mbps and dk.mbps else 0.0
                ps, pr = sh.peak("sender") or 0.0, sh.peak("receiver") or 0.0
                speed_ok = op == "scatter" or speed >= BAR_SPEED
                rss_ok = ps <= BAR_RSS and pr <= BAR_RSS
                bars.append(
                    [
                        op,
                        kind,
                        label(n),
                        "—"
                        if op == "scatter"
                        else f"{speed:.2f} {'met' if speed_ok else 'MISSED'}",
                        f"{ps:.2f}x / {pr:.2f}x {'met' if rss_ok else 'MISSED'}",
                    ]
                )
        rows.append(row)
    tables = ["## Transfers", "", *_table(header, rows)]
    firsts = _first_runs(by, keys, systems)
    if firsts:
        tables += [
            "",
            "## First timed run of each cell",
            "",
            "shoal receives large arrays into buffers recycled from earlier transfers "
            "(`shoal/comm/buffer_pool.py`): a cell's first run finds none of its size "
            "idle unless the previous cell left one within `buffer-pool-idle` seconds, "
            "later runs reuse the one before's. MB/s of the first run alone:",
            "",
            *_table(["op", "payload", "size", *[f"{s} first run MB/s" for s in systems]], firsts),
        ]
    if bars:
        tables += [
            "",
            "## Targets",
            "",
            f"At 100 MB and above: shoal's MB/s at least {BAR_SPEED:g}x Dask's for gather and "
            f"w2w; shoal's peak RSS at most {BAR_RSS:g}x the payload on each side.",
            "",
            *_table(
                ["op", "payload", "size", "MB/s shoal/dask", "shoal peak sender / receiver"], bars
            ),
        ]
    if errors:
        tables += ["", "## Failures", "", *errors]
    return document(
        "shoal transfer benchmark",
        command,
        settings,
        (__doc__ or "").split("\n\n", 1)[1].strip(),
        tables,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="shoal vs Dask: gather, scatter, w2w transfer")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per cell (default 3)")
    p.add_argument("--sizes", default="1MB,100MB,1GB", help="numpy and pandas sizes")
    p.add_argument("--kinds", default="numpy,pandas", help="payloads at --sizes")
    p.add_argument("--bytes-sizes", default="1GB", help="bytes payload sizes ('' for none)")
    p.add_argument("--ops", default=",".join(OPS), help="gather,scatter,w2w")
    p.add_argument("--systems", default="shoal,dask", help="comma-separated (default shoal,dask)")
    p.add_argument("--quick", action="store_true", help="1 MB and 100 MB, 2 runs, no bytes")
    p.add_argument(
        "--sequential",
        action="store_true",
        help="one system after the other (default: runs alternate between systems)",
    )
    p.add_argument(
        "--socket-only",
        action="store_true",
        help="shoal without its same-host path: every byte over loopback TCP",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per client call")
    p.add_argument("--startup-timeout", type=float, default=60.0, help="seconds per cluster start")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report path ('' for none)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.bytes_sizes, args.repeat = "1MB,100MB", "100MB", min(args.repeat, 2)
    args.systems = [s for s in args.systems.split(",") if s]
    args.ops = [o for o in args.ops.split(",") if o]
    for o in args.ops:
        if o not in OPS:
            p.error(f"unknown op {o!r} (expected {', '.join(OPS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.socket_only:  # inherited by the shoal processes started below (Dask ignores it)
        os.environ["SHOAL_COMM__SAME_HOST_TRANSFERS"] = "False"
    command = shlex.join(["python", "benchmarks/transfer.py", *(argv or sys.argv[1:])])
    plan = [
        (op, kind, parse_size(size))
        for op in args.ops
        for kind in [k for k in args.kinds.split(",") if k]
        for size in args.sizes.split(",")
        if size
    ]
    plan += [
        (op, "bytes", parse_size(s)) for op in args.ops for s in args.bytes_sizes.split(",") if s
    ]
    load0 = load_average()
    t0 = time.monotonic()
    cells: list[Cell] = []
    available = []
    for s in args.systems:
        why = SYSTEMS[s].available()
        if why:
            log(f"!! skipping {s}: {why}")
            continue
        available.append(s)
    if args.sequential:
        for s in available:
            log(f"== transfer on {s}")
            cells += run_system(s, args, plan)
    elif available:
        log(f"== transfer on {', '.join(available)}, runs alternating")
        cells = run_interleaved(available, args, plan)
    if not cells:
        return 2
    load1 = load_average()
    order = (
        "one after the other"
        if args.sequential
        else "alternating run by run, the first of each round rotating"
    )
    settings = (
        f"1 warm-up (1 MB) + {args.repeat} timed runs per cell, systems "
        f"{', '.join(args.systems)} ({order}), total time {time.monotonic() - t0:.0f} s; "
        f"load average (1/5/15 min) {load0} at start, {load1} at end"
    )
    doc, tables = render(cells, args.systems, command, settings)
    print(tables)
    write_report(args.out, doc, log)
    return 1 if any(c.error for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
