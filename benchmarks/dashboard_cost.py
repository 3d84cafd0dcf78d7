"""What open dashboard pages cost the scheduler, shoal vs Dask's Bokeh dashboard.

    python benchmarks/dashboard_cost.py [--systems shoal,dask] [--pages 0,5]
        [--workers 1000] [--tasks 50000] [--repeat 3] [--window 15] [--settle 5]
        [--out benchmarks/RESULTS-dashboard-cost.md]

Two scenarios per system, each with 0 and with N status pages open in headless
Chromium (Debian's /usr/bin/chromium driven by playwright, one browser context per
page, as N people watching):

(a) idle: a real scheduler process (its CLI, dashboard on) with W simulated workers
    (the load generator of ``benchmarks/cluster_state.py``: ``benchmarks/simulated.py``,
    real worker protocol, heartbeats at the scheduler's interval), nothing to run. After
    the pages loaded and a settle period, the scheduler's CPU (% of one core, from
    /proc/PID/task/*/schedstat) is measured over a window.
(b) busy: a scheduler and two one-thread worker processes (``benchmarks/cluster.py``);
    ``client.map(inc, range(T))`` and wait, timed, with the scheduler's CPU seconds.

Every run uses a fresh cluster; the median of ``--repeat`` runs is reported. The bars
(shoal): 5 pages add < 2% of a core at idle with 1,000 workers and slow the map by
< 10%; Dask's pages cost its scheduler at least 10x the CPU they cost shoal's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cluster_state  # noqa: E402
from benchmarks.cluster import PY, SYSTEMS, Cluster, System, cpu_delta, cpu_snapshot  # noqa: E402
from benchmarks.workloads import inc  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
IDLE_BAR = 2.0  # % of one core that 5 pages may add to an idle 1,000-worker shoal scheduler
SLOWDOWN_BAR = 10.0  # % that 5 pages may slow shoal's map
RATIO_BAR = 10.0  # Dask's pages' added CPU / shoal's


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def with_dashboard(system: System) -> System:
    """The system's scheduler command with its dashboard on a free loopback port."""
    base = system.scheduler_cmd
    if system.name == "shoal":

        def cmd(f: Path) -> list[str]:
            return [*base(f), "--dashboard-address", "127.0.0.1:0"]

    else:

        def cmd(f: Path) -> list[str]:
            args = [a for a in base(f) if a != "--no-dashboard"]
            return [*args, "--dashboard-address", "127.0.0.1:0"]

    return dataclasses.replace(system, scheduler_cmd=cmd)


DASH_SYSTEMS = {name: with_dashboard(s) for name, s in SYSTEMS.items()}


def status_url(system: str, scheduler_file: Path) -> str:
    info = json.loads(scheduler_file.read_text())
    if system == "shoal":
        port = info["dashboard_port"]
    else:
        port = info["services"]["dashboard"]
    return f"http://127.0.0.1:{port}/status"


class Pages:
    """N status pages in headless Chromium, each in its own browser context."""

    def __init__(self, url: str, n: int):
        self.url, self.n = url, n
        self._pw: Any = None
        self.browser: Any = None
        self.errors: list[str] = []

    def __enter__(self) -> Pages:
        if self.n == 0:
            return self
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        for _ in range(self.n):
            page = self.browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.on("pageerror", lambda exc: self.errors.append(str(exc)))
            page.goto(self.url, timeout=120_000, wait_until="load")
        return self

    def cpu_procs(self) -> list[psutil.Process]:
        if self.browser is None:
            return []
        procs = []
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "chrom" in p.name():
                    procs.append(p)
        return procs

    def __exit__(self, *exc: Any) -> None:
        if self.browser is not None:
            with contextlib.suppress(Exception):
                self.browser.close()
        if self._pw is not None:
            with contextlib.suppress(Exception):
                self._pw.stop()


@dataclasses.dataclass
class Result:
    system: str
    scenario: str  # "idle" | "map"
    pages: int
    repeat: int
    cpu_pct: float = math.nan  # idle: scheduler % of one core
    seconds: float = math.nan  # map: wall time
    cpu_s: float = math.nan  # map: scheduler CPU seconds
    browser_pct: float = math.nan  # Chromium's CPU, % of one core (not part of the bar)
    error: str = ""


def idle_run(system: str, pages: int, repeat: int, args: argparse.Namespace) -> Result:
    result = Result(system, "idle", pages, repeat)
    cluster_state.SYSTEMS = DASH_SYSTEMS  # ClusterRun starts the scheduler from these
    ns = argparse.Namespace(startup_timeout=600, worker_procs=args.worker_procs, client_procs=1)
    run = cluster_state.ClusterRun(system, args.workers, 0, ns)
    try:
        log(f"{system} idle W={args.workers} pages={pages} run {repeat + 1}: starting")
        run.start()
        url = status_url(system, run.dir / "scheduler.json")
        with Pages(url, pages) as browser:
            time.sleep(args.settle)
            run._check_alive()
            proc = psutil.Process(run.pid)
            chrome = browser.cpu_procs()
            a, ca, t0 = cpu_snapshot([proc]), cpu_snapshot(chrome), time.monotonic()
            time.sleep(args.window)
            b, cb, t1 = cpu_snapshot([proc]), cpu_snapshot(chrome), time.monotonic()
            run._check_alive()
            result.cpu_pct = 100 * cpu_delta(a, b)[0] / (t1 - t0)
            if chrome:
                result.browser_pct = 100 * cpu_delta(ca, cb)[0] / (t1 - t0)
            if browser.errors:
                result.error = f"page errors: {browser.errors[:2]}"
        log(f"  scheduler {result.cpu_pct:.2f}% of a core")
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
        log(f"  failed: {result.error}")
    finally:
        run.stop(keep=False)
    return result


def map_run(system: str, pages: int, repeat: int, args: argparse.Namespace) -> Result:
    result = Result(system, "map", pages, repeat)
    cluster = Cluster(DASH_SYSTEMS[system], n_workers=2, timeout=120)
    try:
        log(f"{system} map({args.tasks}) pages={pages} run {repeat + 1}: starting")
        cluster.start()
        url = status_url(system, cluster.scheduler_file)
        client, api = cluster.client, cluster.api
        assert api is not None
        with Pages(url, pages) as browser:
            time.sleep(args.settle)
            cluster.wait_idle()
            chrome = browser.cpu_procs()
            (a, _), ca, t0 = cluster.cpu_snapshot(), cpu_snapshot(chrome), time.monotonic()

            def work() -> None:
                futures = client.map(inc, range(args.tasks), **api.map_kwargs)
                api.wait(futures)
                del futures

            cluster.call(work, 1800)
            (b, _), cb, t1 = cluster.cpu_snapshot(), cpu_snapshot(chrome), time.monotonic()
            result.seconds = t1 - t0
            result.cpu_s = cpu_delta(a, b)[0]
            if chrome:
                result.browser_pct = 100 * cpu_delta(ca, cb)[0] / (t1 - t0)
            if browser.errors:
                result.error = f"page errors: {browser.errors[:2]}"
        log(f"  {result.seconds:.2f} s, scheduler {result.cpu_s:.2f} CPU-s")
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
        log(f"  failed: {result.error}")
    finally:
        cluster.stop()
    return result


def median(values: list[float]) -> float:
    good = [v for v in values if not math.isnan(v)]
    return statistics.median(good) if good else math.nan


def paired(
    results: list[Result], system: str, scenario: str, lo: int, hi: int, field: str, ratio: bool
) -> float:
    """The median over repeats of (with ``hi`` pages) - (with ``lo``) in the same repeat, or
    their ratio: runs of one repeat are minutes apart, so the machine's load drifts less
    between them than between repeats (a shared machine)."""
    values = []
    for repeat in sorted({r.repeat for r in results}):
        pair = {
            r.pages: getattr(r, field)
            for r in results
            if (r.system, r.scenario, r.repeat) == (system, scenario, repeat) and not r.error
        }
        a, b = pair.get(lo, math.nan), pair.get(hi, math.nan)
        if not (math.isnan(a) or math.isnan(b)) and (not ratio or a > 0):
            values.append(b / a if ratio else b - a)
    return median(values)


def summarize(results: list[Result], args: argparse.Namespace) -> str:
    def med(system: str, scenario: str, pages: int, field: str) -> float:
        rs = [r for r in results if (r.system, r.scenario, r.pages) == (system, scenario, pages)]
        return median([getattr(r, field) for r in rs if not r.error])

    lo, hi = min(args.pages), max(args.pages)
    lines = [
        f"| system | idle CPU %, {lo} pages | idle CPU %, {hi} pages | added by the pages "
        f"(paired) | map({args.tasks}) s, {lo} pages | map s, {hi} pages | slowdown (paired) | "
        f"map scheduler CPU-s, {lo} / {hi} pages | added CPU-s (paired) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    added: dict[str, float] = {}
    verdicts = []
    for system in args.systems:
        i0, i1 = med(system, "idle", lo, "cpu_pct"), med(system, "idle", hi, "cpu_pct")
        m0, m1 = med(system, "map", lo, "seconds"), med(system, "map", hi, "seconds")
        c0, c1 = med(system, "map", lo, "cpu_s"), med(system, "map", hi, "cpu_s")
        added[system] = paired(results, system, "idle", lo, hi, "cpu_pct", ratio=False)
        slow = 100 * (paired(results, system, "map", lo, hi, "seconds", ratio=True) - 1)
        extra = paired(results, system, "map", lo, hi, "cpu_s", ratio=False)
        lines.append(
            f"| {system} | {i0:.2f} | {i1:.2f} | {added[system]:+.2f} | {m0:.2f} | {m1:.2f} | "
            f"{slow:+.1f}% | {c0:.2f} / {c1:.2f} | {extra:+.2f} |"
        )
        if system == "shoal":
            verdicts.append(
                f"- shoal: {hi} pages add {added[system]:.2f}% of a core at idle "
                f"(bar < {IDLE_BAR}%): {'PASS' if added[system] < IDLE_BAR else 'FAIL'}"
            )
            verdicts.append(
                f"- shoal: {hi} pages change the map's wall time by {slow:+.1f}% (bar < "
                f"{SLOWDOWN_BAR}%): {'PASS' if slow < SLOWDOWN_BAR else 'FAIL'}; their "
                f"scheduler CPU: {extra:+.2f} s"
            )
    if "shoal" in added and "dask" in added:
        d_idle = added["dask"]
        s_idle = max(added["shoal"], 0.01)  # measured noise can be <= 0
        verdicts.append(
            f"- idle: Dask's pages add {d_idle:.2f}% of a core, shoal's {added['shoal']:.2f}% "
            f"(ratio {d_idle / s_idle:.0f}x with shoal's floored at 0.01%; bar >= "
            f"{RATIO_BAR:g}x): {'PASS' if d_idle / s_idle >= RATIO_BAR else 'FAIL'}"
        )
    return "\n".join(lines + [""] + verdicts)


def report(results: list[Result], args: argparse.Namespace, table: str) -> str:
    rows = [
        "| system | scenario | pages | run | scheduler CPU % (idle) | map s | map scheduler CPU-s | Chromium CPU % | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.system} | {r.scenario} | {r.pages} | {r.repeat + 1} | {r.cpu_pct:.2f} | "
            f"{r.seconds:.2f} | {r.cpu_s:.2f} | {r.browser_pct:.1f} | {r.error} |"
        )
    import distributed

    import shoal

    return "\n".join(
        [
            "# dashboard_cost: what open status pages cost the scheduler",
            "",
            f"`{' '.join([Path(PY).name, *sys.argv])}`",
            "",
            f"Machine: {platform.node()}, {os.cpu_count()} CPUs (shared), Python "
            f"{platform.python_version()}; shoal {shoal.__version__ if hasattr(shoal, '__version__') else '(tree)'}, "
            f"distributed {distributed.__version__}. Idle: W={args.workers} simulated workers, "
            f"window {args.window:g} s after {args.settle:g} s settling with the pages open. "
            f"Map: map(inc, {args.tasks}) on two one-thread workers. Medians of "
            f"{args.repeat} runs, each a fresh cluster.",
            "",
            table,
            "",
            "## Every run",
            "",
            *rows,
            "",
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default="shoal,dask")
    p.add_argument("--pages", default="0,5", help="page counts to compare (comma-separated)")
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--worker-procs", type=int, default=4, help="load generator processes")
    p.add_argument("--tasks", type=int, default=50_000)
    p.add_argument("--scenarios", default="idle,map")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--out", default="benchmarks/RESULTS-dashboard-cost.md")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.pages = [int(n) for n in args.pages.split(",")]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)} (known: {sorted(SYSTEMS)})")
    if not os.path.exists(CHROMIUM):
        p.error(f"no Chromium at {CHROMIUM}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results: list[Result] = []
    for repeat in range(args.repeat):
        for system in args.systems:  # interleaved: drift in the machine's load hits both
            for scenario in args.scenarios:
                for pages in args.pages:
                    run = idle_run if scenario == "idle" else map_run
                    results.append(run(system, pages, repeat, args))
                    # after every run: an interrupted benchmark keeps what it measured
                    Path(args.out).write_text(report(results, args, summarize(results, args)))
    table = summarize(results, args)
    print(table)
    Path(args.out).write_text(report(results, args, table))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
