"""P2P merges with idle gaps on an aggressively adaptive cluster: shoal vs Dask.

    python benchmarks/adaptive_shuffle.py [--duration 120] [--rows 10000000]
        [--partition-rows 100000] [--gaps 1,5,0.5,3] [--systems shoal,dask]
        [--out benchmarks/RESULTS-adaptive-shuffle.md]

Each system gets a ``LocalCluster(n_workers=0, processes=True, threads_per_worker=1)``
(Dask: ``dashboard_address=None``; both with a nanny per worker) and
``cluster.adapt(minimum=1, maximum=4, target_duration="1s", interval="0.2s",
wait_count=1)``, as aggressive as both allow, and a client in this process. Layouts
differ in one point: a Dask LocalCluster runs its scheduler (and the adaptive loop) in
the client's process; shoal's scheduler is a process of its own.

Once the cluster has its first worker, merges run one after the other for
``--duration`` seconds, separated by idle gaps (``--gaps``, cycled): each is an inner
merge on ``id`` of an events frame of ``--rows`` rows (``--partition-rows`` per
partition) with its keys frame, both made in the workers from a seed
(``benchmarks/shuffle_data.py``), with P2P (Dask ``shuffle_method="p2p"``; shoal its default), reduced on the cluster to one
row per partition and compared with the same merge done by pandas in the client (four
seeds, cycled). A merge that raises counts as failed. Restarted shuffles: Dask, the
"Shuffle ... restarted" warnings in its scheduler log (``get_scheduler_logs``) and its
"p2p-failed" events; shoal, the restart and fail events of ``get_events("p2p")``. Scale
events: the decisions in the adaptive log (Dask ``Adaptive.log``, shoal
``get_events("adaptive")``), and the changes of the worker count seen by a sampler
(every 0.1 s: Dask, the scheduler's worker table; shoal, ``scheduler_info()`` through a
second client). After the last merge, the sampler keeps going until the cluster is back
at 1 worker (at most ``--settle-timeout`` s) and 2 s more: "back to 1 after" is the time
from the end of the last merge to the first sample at 1 worker.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import statistics
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import shuffle_data as sd  # noqa: E402
from benchmarks.cluster import ROOT, CallThread  # noqa: E402
from benchmarks.p2p_shuffle import shoal_p2p_missing  # noqa: E402
from benchmarks.report import _table, document, load_average, write_report  # noqa: E402
from benchmarks.shuffle_events import (  # noqa: E402
    dask_failures,
    dask_restarts,
    p2p_totals,
    scale_counts,
)
from benchmarks.transfer import log  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "RESULTS-adaptive-shuffle.md"
ADAPT: dict[str, Any] = dict(
    minimum=1, maximum=4, target_duration="1s", interval="0.2s", wait_count=1
)
SEEDS = 4
BAR_WORKERS, BAR_BACK_S = 3, 10.0


class NotAvailable(RuntimeError):
    pass


@dataclass
class Outcome:
    system: str
    merges: list[tuple[float, str]] = field(default_factory=list)  # (seconds, "ok"/why)
    spans: list[tuple[float, float]] = field(default_factory=list)  # each merge (monotonic)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, workers)
    work_start: float = 0.0
    work_end: float = 0.0
    restarted: int | None = None
    failed_events: int | None = None
    scale_ups: int | None = None
    scale_downs: int | None = None
    error: str | None = None

    @property
    def wrong(self) -> int:
        return sum(1 for _, r in self.merges if r.startswith("wrong"))

    @property
    def failed(self) -> int:
        return sum(1 for _, r in self.merges if r not in ("ok",) and not r.startswith("wrong"))

    def max_workers(self) -> int | None:
        during = [n for t, n in self.samples if self.work_start <= t <= self.work_end]
        return max(during) if during else None

    def back_to_one(self) -> float | None:
        for t, n in self.samples:
            if t >= self.work_end and n <= 1:
                return t - self.work_end
        return None

    def timeline(self) -> str:
        """The largest worker count sampled in each second from the start of the work,
        one digit per second."""
        counts: dict[int, int] = {}
        for t, w in self.samples:
            if t >= self.work_start:
                i = int(t - self.work_start)
                counts[i] = max(counts.get(i, 0), w)
        return "".join(str(counts.get(i, "?")) for i in range(max(counts, default=-1) + 1))

    def merge_spans(self) -> str:
        return ", ".join(
            f"{a - self.work_start:.0f}–{b - self.work_start:.0f}" for a, b in self.spans
        )

    def changes(self) -> tuple[int, int]:
        ups = downs = 0
        for (_, a), (_, b) in zip(self.samples, self.samples[1:]):
            ups, downs = ups + (b > a), downs + (b < a)
        return ups, downs


class Dask:
    name = "dask"
    method: str | None = "p2p"
    cluster: Any = None
    adaptive: Any = None
    client: Any = None

    def start(self) -> None:
        import distributed

        self.cluster = distributed.LocalCluster(
            n_workers=0, processes=True, threads_per_worker=1, dashboard_address=None
        )
        self.adaptive = self.cluster.adapt(**ADAPT)
        self.client = distributed.Client(self.cluster)
        quiet_dask_console()

    def workers(self) -> int:
        return len(self.cluster.scheduler.workers)

    def finish(self, out: Outcome) -> None:
        out.restarted = dask_restarts(self.client.get_scheduler_logs(n=100_000))
        out.failed_events = dask_failures(self.client.get_events("p2p"))
        out.scale_ups, out.scale_downs = scale_counts(self.adaptive.log)

    def close(self) -> None:
        steps = (
            getattr(self.adaptive, "stop", None),
            getattr(self.client, "close", None),
            getattr(self.cluster, "close", None),
        )
        for step in steps:
            if step is not None:
                with contextlib.suppress(Exception):
                    step()


class Shoal(Dask):
    name = "shoal"
    method = None  # its default: P2P
    monitor: Any = None

    def start(self) -> None:
        import shoal

        if not hasattr(shoal.LocalCluster, "adapt"):
            raise NotAvailable("shoal has no LocalCluster.adapt")
        self.cluster = shoal.LocalCluster(n_workers=0, processes=True, threads_per_worker=1)
        self.adaptive = self.cluster.adapt(**ADAPT)
        self.client = shoal.Client(self.cluster)
        why = shoal_p2p_missing()
        if why:
            raise NotAvailable(why)
        self.monitor = shoal.Client(self.cluster, subscribe=False, set_as_default=False)

    def workers(self) -> int:
        return len(self.monitor.scheduler_info()["workers"])

    def finish(self, out: Outcome) -> None:
        if not hasattr(self.client, "get_events"):
            out.error = "not available: Client.get_events (restarts and adaptive decisions unread)"
            return
        p2p = p2p_totals(self.client.get_events("p2p"))
        out.restarted, out.failed_events = int(p2p["restarted"]), int(p2p["failed"])
        out.scale_ups, out.scale_downs = scale_counts(self.client.get_events("adaptive"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.monitor.close()
        super().close()


SYSTEMS = {"shoal": Shoal, "dask": Dask}


def quiet_dask_console() -> None:
    """Dask's in-process scheduler logs a warning per shuffle to stderr; keep stderr for
    progress. Its log deque (``get_scheduler_logs``, where restarts are counted) is not a
    StreamHandler and keeps every line."""
    for handler in logging.getLogger("distributed").handlers:
        if type(handler) is logging.StreamHandler:
            handler.setLevel(logging.ERROR)


class Sampler:
    """Samples the worker count every ``interval`` seconds on a thread."""

    def __init__(self, count: Any, out: Outcome, interval: float = 0.1):
        self.count, self.out, self.interval = count, out, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="worker-sampler", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            with contextlib.suppress(Exception):  # a lost sample is a gap, not a failure
                self.out.samples.append((time.monotonic(), self.count()))
            self.stopped.wait(self.interval)

    def latest(self) -> int | None:
        return self.out.samples[-1][1] if self.out.samples else None

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)


def wait_for(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def run_system(name: str, refs: dict[int, sd.Summary], args: Any) -> Outcome:
    out = Outcome(name)
    system = SYSTEMS[name]()
    thread = CallThread(f"adaptive-{name}")
    sampler = None
    try:
        thread.call(system.start, args.startup_timeout)
        sampler = Sampler(system.workers, out)
        if not wait_for(lambda: (sampler.latest() or 0) >= 1, args.startup_timeout):
            raise TimeoutError(f"no worker within {args.startup_timeout:g} s of adapt(minimum=1)")
        out.work_start = time.monotonic()
        deadline = out.work_start + args.duration
        i = 0
        while True:
            seed = i % SEEDS
            began = time.monotonic()
            out.merges.append(merge_once(system, thread, seed, refs[seed], args))
            out.spans.append((began, time.monotonic()))
            log(
                f"   {name} merge {i + 1}: {out.merges[-1][0]:.2f} s {out.merges[-1][1][:200]}"
                f" (workers {sampler.latest()})"
            )
            out.work_end = time.monotonic()
            if out.work_end >= deadline:
                break
            time.sleep(min(args.gaps[i % len(args.gaps)], max(0.0, deadline - out.work_end)))
            i += 1
        wait_for(lambda: sampler.latest() == 1, args.settle_timeout)
        time.sleep(2.0)  # does it stay at 1?
        sampler.stop()
        thread.call(lambda: system.finish(out), 60)
    except NotAvailable as e:
        out.error = f"not available: {e}"
        log(f"!! {name}: {out.error}")
    except Exception as e:
        out.error = f"{type(e).__name__}: {e}"
        log(f"!! {name}: {out.error}\n{traceback.format_exc()}")
    finally:
        if sampler is not None:
            sampler.stop()
        with contextlib.suppress(Exception):
            thread.call(system.close, 60)
        thread.close()
    return out


def merge_once(system: Any, thread: CallThread, seed: int, want: sd.Summary, args: Any):
    tag = uuid.uuid4().hex[:8]

    def go() -> sd.Summary:
        events, keys = sd.frames(args.rows, seed, tag, args.partition_rows)
        collection = sd.merge_summary(events, keys, system.method)
        return sd.Summary.of(system.client.compute(collection).result())

    t0 = time.monotonic()
    try:
        got = thread.call(go, args.timeout)
    except Exception as e:
        if "CallTimeout" in type(e).__name__:
            raise
        return time.monotonic() - t0, f"failed: {type(e).__name__}: {e}"
    wrong = got.mismatch(want)
    return time.monotonic() - t0, "ok" if wrong is None else f"wrong: {wrong}"


def _fmt(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def render(outs: list[Outcome], args: Any, command: str, settings: str) -> tuple[str, str]:
    header = [
        "system",
        "merges",
        "wrong results",
        "failed merges",
        "shuffles restarted / failed",
        "scale ups / downs (adaptive log)",
        "worker count ups / downs (sampled)",
        "max workers under load",
        "workers at the end",
        "back to 1 worker after s",
        "median merge s",
    ]
    rows, bars, notes = [], [], []
    for o in outs:
        if o.error and not o.merges:
            rows.append(
                [
                    o.system,
                    *(
                        ["not available" if o.error.startswith("not av") else "failed"]
                        + ["—"] * (len(header) - 2)
                    ),
                ]
            )
            notes.append(f"- {o.system}: **{o.error}**")
            continue
        ups, downs = o.changes()
        end = o.samples[-1][1] if o.samples else None
        back = o.back_to_one()
        restarted = None if o.restarted is None else f"{o.restarted} / {o.failed_events}"
        scale = None if o.scale_ups is None else f"{o.scale_ups} / {o.scale_downs}"
        rows.append(
            [
                o.system,
                str(len(o.merges)),
                str(o.wrong),
                str(o.failed),
                restarted or "—",
                scale or "—",
                f"{ups} / {downs}",
                _fmt(o.max_workers()),
                _fmt(end),
                _fmt(back) if back is not None else f"> {args.settle_timeout:g}",
                _fmt(statistics.median(s for s, _ in o.merges), 2),
            ]
        )
        ok_shuffles = o.failed == 0 and (o.restarted or 0) == 0 and (o.failed_events or 0) == 0
        checks = [
            ("no shuffle restarted or failed", ok_shuffles),
            ("every result equal to pandas", o.wrong == 0 and o.failed == 0),
            (f"reached at least {BAR_WORKERS} workers", (o.max_workers() or 0) >= BAR_WORKERS),
            (f"back to 1 worker within {BAR_BACK_S:g} s", back is not None and back <= BAR_BACK_S),
        ]
        bars += [[o.system, what, "yes" if met else "**no**"] for what, met in checks]
        notes.append(
            f"- {o.system}: workers per second (the largest count sampled in each second "
            f"from the start of the work): `{o.timeline()}`; merges (s): {o.merge_spans()}"
        )
        for seconds, result in o.merges:
            if result != "ok":
                notes.append(f"- {o.system}: a merge ({seconds:.1f} s): {result[:500]}")
        if o.error:
            notes.append(f"- {o.system}: **{o.error}**")
    tables = ["## Results", "", *_table(header, rows), "", "## Bar", ""]
    tables += _table(["system", "bar", "met"], bars) if bars else ["(no system ran)"]
    if notes:
        tables += ["", "## Notes", "", *notes]
    return document(
        "shoal adaptive P2P shuffle benchmark",
        command,
        settings,
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        tables,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="P2P merges on an adaptive cluster: shoal vs Dask")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of merges and gaps")
    p.add_argument("--rows", type=int, default=10_000_000, help="events rows per merge")
    p.add_argument("--partition-rows", type=int, default=sd.ROWS_PER_PARTITION)
    p.add_argument("--gaps", default="1,5,0.5,3", help="idle seconds between merges, cycled")
    p.add_argument("--systems", default="shoal,dask")
    p.add_argument("--settle-timeout", type=float, default=60.0, help="wait for 1 worker (s)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per merge")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report path ('' for none)")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r} (expected {', '.join(SYSTEMS)})")
    try:
        args.gaps = [float(g) for g in args.gaps.split(",") if g]
    except ValueError:
        p.error(f"--gaps must be comma-separated seconds, got {args.gaps!r}")
    if not args.gaps or min(args.gaps) < 0 or args.duration <= 0:
        p.error("--gaps must be seconds >= 0 and --duration > 0")
    if args.rows < sd.MIN_PARTITIONS * 10:
        p.error(f"--rows must be at least {sd.MIN_PARTITIONS * 10}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/adaptive_shuffle.py", *(argv or sys.argv[1:])])
    log(f"== pandas references: {SEEDS} merges of {args.rows:,} rows")
    refs = {
        s: sd.reference(args.rows, s, pandas_check=True, per_partition=args.partition_rows).merge
        for s in range(SEEDS)
    }
    load0, t0 = load_average(), time.monotonic()
    outs = []
    for name in args.systems:
        log(f"== {name}")
        outs.append(run_system(name, refs, args))
    settings = (
        f"adapt({', '.join(f'{k}={v!r}' for k, v in ADAPT.items())}); {args.duration:g} s of "
        f"merges of {args.rows:,} rows, gaps {args.gaps} s; total time "
        f"{time.monotonic() - t0:.0f} s; load average (1/5/15 min) {load0} at start, "
        f"{load_average()} at end"
    )
    doc, tables = render(outs, args, command, settings)
    print(tables)
    write_report(args.out, doc, log)
    return 1 if any(o.error and not o.error.startswith("not available") for o in outs) else 0


if __name__ == "__main__":
    sys.exit(main())
