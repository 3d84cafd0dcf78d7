"""What an idle cluster costs its scheduler: W workers, C clients, nothing to run.

    python benchmarks/cluster_state.py [--points 100x10,1000x200] [--systems shoal,dask]
        [--dask-points 100x10] [--repeat 3] [--window 30] [--settle 10] [--out PATH]

A real scheduler process (the CLI of ``SYSTEMS[...]`` in ``benchmarks/cluster.py``)
gets W simulated workers and C idle clients with default settings (load generators in
``benchmarks/simulated.py``, a few processes each). Once all are registered and a
settle period has passed, the scheduler's CPU (% of one core, from
/proc/PID/task/*/schedstat) and the bytes it sends (per socket, ``ss -tinpH``) are
measured over a window. Every run uses a fresh cluster; the median of ``--repeat`` runs
is reported. Progress goes to stderr, the table to stdout and a markdown report to
``--out``.

The bars (checked at W=1000, C=200 and at every (W, C) both systems reached): the
shoal scheduler under 5% of one core and 50 KB/s sent, and at most 1/10 of Dask's
scheduler CPU at equal (W, C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import (  # noqa: E402
    PY,
    ROOT,
    SYSTEMS,
    CallThread,
    _kill_group,
    cpu_delta,
    cpu_snapshot,
    spawn,
    tail,
)

CPU_BAR = 5.0  # % of one core, shoal at W=1000, C=200
BYTES_BAR = 50_000  # bytes/s sent by the shoal scheduler at W=1000, C=200
RATIO_BAR = 10.0  # dask CPU / shoal CPU at equal (W, C)
BAR_POINT = (1000, 200)
DEFAULT_POINTS = "100x10,100x200,1000x10,1000x200"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- sockets


@dataclass
class Sock:
    local: str
    peer: str
    pids: frozenset[int]
    sent: int
    received: int


_PID = re.compile(r"pid=(\d+)")
_SENT = re.compile(r"\bbytes_sent:(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def ss_snapshot() -> dict[tuple[str, str], Sock]:
    """Every TCP socket of this network namespace: (local, peer) -> owner pids and the
    kernel's per-socket byte counters (``tcpi_bytes_sent``, ``tcpi_bytes_received``)."""
    out = subprocess.run(
        ["ss", "-tinpH"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    socks: dict[tuple[str, str], Sock] = {}
    head: list[str] | None = None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # State Recv-Q Send-Q Local Peer [users:(...)]
            head = line.split()
            continue
        if head is None or len(head) < 5:
            continue
        sent, received = _SENT.search(line), _RECEIVED.search(line)
        pids = frozenset(int(p) for p in _PID.findall(" ".join(head[5:])))
        key = (head[3], head[4])
        socks[key] = Sock(
            head[3],
            head[4],
            pids,
            int(sent.group(1)) if sent else 0,
            int(received.group(1)) if received else 0,
        )
        head = None
    return socks


@dataclass
class ByteCount:
    sent: int  # by the scheduler, over its sockets
    received: int  # by the load generators, over their ends of those sockets
    sockets_start: int
    sockets_end: int
    opened: int  # sockets of the scheduler that appeared during the window
    closed: int  # ... and that disappeared (bytes after the first snapshot unknown)


def count_bytes(
    a: dict[tuple[str, str], Sock], b: dict[tuple[str, str], Sock], sched: int, gens: set[int]
) -> ByteCount:
    def mine(s: dict[tuple[str, str], Sock]) -> dict[tuple[str, str], Sock]:
        return {k: v for k, v in s.items() if sched in v.pids}

    sa, sb = mine(a), mine(b)
    sent = received = 0
    for key, end in sb.items():
        start = sa.get(key)
        sent += end.sent - (start.sent if start is not None else 0)
        # the generator's end of the same connection: (peer, local)
        g_end, g_start = b.get((key[1], key[0])), a.get((key[1], key[0]))
        if g_end is not None and g_end.pids & gens:
            received += g_end.received - (
                g_start.received if g_start is not None and start is not None else 0
            )
    return ByteCount(
        sent, received, len(sa), len(sb), len(sb.keys() - sa.keys()), len(sa.keys() - sb.keys())
    )


# --------------------------------------------------------------------------- one run


class RunError(RuntimeError):
    pass


@dataclass
class Run:
    system: str
    w: int
    c: int
    repeat: int
    cpu_pct: float = math.nan
    precise: bool = True
    kernel_share: float = math.nan  # % of the scheduler's CPU spent in the kernel (psutil)
    sent_per_s: float = math.nan
    ss_recv_per_s: float = math.nan  # generator side, from ss
    app_recv_per_s: float | None = None  # shoal: counted by the connections themselves
    # counted by the generators in the window: shoal messages received, by type; Dask
    # requests made (heartbeats, scheduler-info polls)
    window_msgs: dict[str, int] = field(default_factory=dict)
    req_per_s: float = math.nan  # requests the scheduler answered (shoal) / Dask got

    @property
    def us_per_req(self) -> float:
        """Scheduler CPU µs per request (fixed costs, e.g. timers, included)."""
        return self.cpu_pct * 1e4 / self.req_per_s if self.req_per_s > 0 else math.nan

    bytes: ByteCount | None = None
    registered: int = 0
    clients_seen: int | None = None
    startup_s: float = math.nan
    rss_mb: float = math.nan
    gens_cpu_pct: float = math.nan
    profile: str = ""
    error: str = ""


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


class ClusterRun:
    def __init__(self, system: str, w: int, c: int, args: argparse.Namespace):
        self.system, self.w, self.c, self.args = system, w, c, args
        self.dir = Path(tempfile.mkdtemp(prefix=f"cstate-{system}-{w}x{c}-"))
        self.sched: subprocess.Popen | None = None
        self.gens: list[tuple[str, int, subprocess.Popen]] = []  # name, n, process
        self.address = ""
        self.pid = 0

    # -- lifecycle --

    def start(self) -> float:
        t0 = time.monotonic()
        deadline = t0 + self.args.startup_timeout
        sfile = self.dir / "scheduler.json"
        self.sched = spawn(SYSTEMS[self.system].scheduler_cmd(sfile), self.dir / "scheduler.log")
        while True:
            self._check_alive()
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(sfile.read_text())
                if info.get("address"):
                    break
            if time.monotonic() > deadline:
                raise RunError("the scheduler wrote no scheduler file in time")
            time.sleep(0.05)
        self.address = info["address"]
        self.pid = int(info.get("pid") or self.sched.pid)
        nw = min(self.args.worker_procs, max(1, self.w // 50))
        nc = min(self.args.client_procs, max(1, self.c // 10))
        first = 0
        for i, n in enumerate(split(self.w, nw)):
            self._spawn_gen(f"w{i}", f"{self.system}-workers", n, first)
            first += n
        for i, n in enumerate(split(self.c, nc)):
            self._spawn_gen(f"c{i}", f"{self.system}-clients", n, 0)
        last = 0.0
        while True:
            self._check_alive()
            states = [self._status(name) for name, _, _ in self.gens]
            ready = sum(s.get("ready", 0) for s in states)
            failed = [e for s in states for e in s.get("errors", [])]
            if failed:
                raise RunError(f"load generator errors: {failed[:3]}")
            if all(s.get("done") for s in states):
                break
            if time.monotonic() - last >= 10:
                log(f"  starting: {ready}/{self.w + self.c} workers+clients ready")
                last = time.monotonic()
            if time.monotonic() > deadline:
                raise RunError(
                    f"only {ready}/{self.w + self.c} workers+clients ready after "
                    f"{self.args.startup_timeout:g} s"
                )
            time.sleep(0.2)
        return time.monotonic() - t0

    def _spawn_gen(self, name: str, mode: str, n: int, first: int) -> None:
        cmd = [PY, "-m", "benchmarks.simulated", mode, "--address", self.address]
        cmd += ["--n", str(n), "--first", str(first), "--dir", str(self.dir), "--name", name]
        self.gens.append((name, n, spawn(cmd, self.dir / f"{name}.log")))

    def _status(self, name: str) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((self.dir / f"{name}.json").read_text())
        return {}

    def _check_alive(self) -> None:
        procs = [("scheduler", "scheduler.log", self.sched)]
        procs += [(f"generator {n}", f"{n}.log", p) for n, _, p in self.gens]
        for what, logname, p in procs:
            if p is not None and p.poll() is not None:
                raise RunError(
                    f"{what} exited with code {p.returncode}:\n{tail(self.dir / logname, 8)}"
                )

    def gen_pids(self) -> set[int]:
        pids = set()
        for name, _, p in self.gens:
            pids.add(int(self._status(name).get("pid") or p.pid))
        return pids

    def stop(self, keep: bool) -> None:
        for _, _, p in self.gens:
            _kill_group(p)
        if self.sched is not None:
            _kill_group(self.sched)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- checks --

    def registered(self) -> tuple[int, int | None]:
        """(workers the scheduler lists, clients it counts or None) through a client of
        the system opened for the check and closed again (not a subscriber in shoal)."""
        thread = CallThread("check")
        try:
            if self.system == "shoal":
                from shoal import Client

                def check() -> tuple[int, int | None]:
                    client = Client(self.address, subscribe=False, set_as_default=False)
                    try:
                        info = client.scheduler_info()
                        assert len(info["workers"]) == info["n_workers"]
                        return info["n_workers"], None
                    finally:
                        client.close()

            else:
                from distributed import Client as DaskClient

                def check() -> tuple[int, int | None]:
                    with DaskClient(self.address, set_as_default=False) as client:
                        n = len(client.scheduler_info(n_workers=-1)["workers"])

                        def n_clients(dask_scheduler: Any) -> int:
                            return sum(1 for c in dask_scheduler.clients if c != "fire-and-forget")

                        return n, client.run_on_scheduler(n_clients) - 1  # not this one

            return thread.call(check, 120.0)
        finally:
            thread.close()

    # -- measuring --

    def snapshot(self, proc: psutil.Process, gens: list[psutil.Process]) -> dict[str, Any]:
        cpu = cpu_snapshot([proc])
        times = proc.cpu_times()
        t = time.monotonic()
        socks = ss_snapshot()
        seqs = {name: self._counts(name).get("seq", 0) for name, _, _ in self.gens}
        for name, _, p in self.gens:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(self._status(name).get("pid") or p.pid), signal.SIGUSR1)
        counts = {}
        deadline = time.monotonic() + 10
        for name in seqs:
            while True:
                cur = self._counts(name)
                if cur.get("seq", 0) > seqs[name] or time.monotonic() > deadline:
                    counts[name] = cur
                    break
                time.sleep(0.01)
        return {
            "cpu": cpu,
            "times": times,
            "t": t,
            "socks": socks,
            "counts": counts,
            "gens": cpu_snapshot(gens),
        }

    def _counts(self, name: str) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((self.dir / f"{name}.counts.json").read_text())
        return {}


def run_one(system: str, w: int, c: int, repeat: int, args: argparse.Namespace) -> Run:
    run = Run(system, w, c, repeat)
    cr = ClusterRun(system, w, c, args)
    ok = False
    try:
        log(f"{system} W={w} C={c} run {repeat + 1}: starting ({cr.dir})")
        run.startup_s = cr.start()
        run.registered, run.clients_seen = cr.registered()
        if run.registered != w:
            raise RunError(f"the scheduler lists {run.registered} workers, not {w}")
        if run.clients_seen is not None and run.clients_seen != c:
            raise RunError(f"the scheduler counts {run.clients_seen} clients, not {c}")
        log(
            f"  {w} workers registered, {c} clients ready in {run.startup_s:.1f} s; "
            f"settling {args.settle:g} s"
        )
        time.sleep(args.settle)
        cr._check_alive()
        proc = psutil.Process(cr.pid)
        gens = [psutil.Process(p) for p in cr.gen_pids()]
        spy = None
        if args.py_spy and system in args.py_spy_systems:
            out = Path(args.py_spy) / f"{system}-{w}x{c}-{repeat}.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                ["py-spy", "record", "--pid", str(cr.pid), "--duration", str(int(args.window)),
                 "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            run.profile = str(out)
        a = cr.snapshot(proc, gens)
        time.sleep(args.window)
        b = cr.snapshot(proc, gens)
        if spy is not None:
            spy.wait(timeout=args.window + 60)
        cr._check_alive()
        elapsed = b["t"] - a["t"]
        cpu, run.precise = cpu_delta(a["cpu"], b["cpu"])
        run.cpu_pct = 100 * cpu / elapsed
        user = b["times"].user - a["times"].user
        system_ = b["times"].system - a["times"].system
        run.kernel_share = 100 * system_ / (user + system_) if user + system_ > 0 else math.nan
        gcpu, _ = cpu_delta(a["gens"], b["gens"])
        run.gens_cpu_pct = 100 * gcpu / elapsed
        run.bytes = count_bytes(a["socks"], b["socks"], cr.pid, {p.pid for p in gens})
        run.sent_per_s = run.bytes.sent / elapsed
        run.ss_recv_per_s = run.bytes.received / elapsed
        msgs: dict[str, int] = {}
        for n in a["counts"]:
            before = a["counts"][n].get("msgs", {})
            for k, v in b["counts"][n].get("msgs", {}).items():
                if v - before.get(k, 0):
                    msgs[k] = msgs.get(k, 0) + v - before.get(k, 0)
        run.window_msgs = msgs
        if system != "shoal":
            run.req_per_s = sum(msgs.values()) / elapsed
        else:  # each reply answers one request (heartbeats, when idle)
            run.req_per_s = sum(v for k, v in msgs.items() if k.endswith("Reply")) / elapsed
            recv = sum(
                b["counts"][n].get("recv_bytes", 0) - a["counts"][n].get("recv_bytes", 0)
                for n in a["counts"]
            )
            run.app_recv_per_s = recv / elapsed
            closed = sum(b["counts"][n].get("closed", 0) for n in b["counts"])
            unexpected = [b["counts"][n].get("unexpected") for n in b["counts"]]
            if closed or any(unexpected):
                raise RunError(f"connections closed: {closed}; unexpected messages {unexpected}")
        run.rss_mb = proc.memory_info().rss / 1e6
        again, _ = cr.registered()
        if again != w:
            raise RunError(f"after the window the scheduler lists {again} workers, not {w}")
        ok = True
        log(
            f"  {system} W={w} C={c}: scheduler {run.cpu_pct:.2f}% of a core, "
            f"{run.sent_per_s:,.0f} B/s sent (receivers: ss {run.ss_recv_per_s:,.0f} B/s"
            + (f", counted {run.app_recv_per_s:,.0f} B/s" if run.app_recv_per_s is not None else "")
            + f"), generators {run.gens_cpu_pct:.0f}%"
            + (f", in the window: {run.window_msgs}" if run.window_msgs else "")
        )
    except Exception as e:
        run.error = f"{type(e).__name__}: {e}"
        log(f"  FAILED: {run.error}\n  logs kept in {cr.dir}")
    finally:
        cr.stop(keep=not ok or args.keep_logs)
    return run


# --------------------------------------------------------------------------- report


def parse_points(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        if item.strip():
            w, _, c = item.strip().lower().partition("x")
            out.append((int(w), int(c)))
    return out


def med(runs: list[Run], attr: str) -> float:
    vals = [getattr(r, attr) for r in runs if not r.error and getattr(r, attr) is not None]
    return statistics.median(vals) if vals else math.nan


def fmt(x: float, spec: str = ",.0f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summarize(
    runs: list[Run], points: list[tuple[int, int]], systems: list[str]
) -> tuple[list[str], list[tuple[str, str, str, bool | None]]]:
    """The markdown table lines and the bars (what, measured, bar, met or None)."""
    by: dict[tuple[str, int, int], list[Run]] = {}
    for r in runs:
        by.setdefault((r.system, r.w, r.c), []).append(r)
    lines = [
        "| system | W | C | sched CPU % of a core (median) | min–max | bytes/s sent (median) "
        "| receivers: ss / counted B/s | requests/s | CPU µs/request | pushes in window | runs ok "
        "| dask/shoal CPU |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    cpu: dict[tuple[str, int, int], float] = {}
    sent: dict[tuple[str, int, int], float] = {}
    for w, c in points:
        for system in systems:
            rs = by.get((system, w, c))
            if not rs:
                continue
            good = [r for r in rs if not r.error]
            cpu[(system, w, c)] = med(rs, "cpu_pct")
            sent[(system, w, c)] = med(rs, "sent_per_s")
            lo = min((r.cpu_pct for r in good), default=math.nan)
            hi = max((r.cpu_pct for r in good), default=math.nan)
            recv = fmt(med(rs, "ss_recv_per_s"))
            if system == "shoal":
                recv += f" / {fmt(med(rs, 'app_recv_per_s'))}"
            pushes = (
                fmt(statistics.median([r.window_msgs.get("ClusterState", 0) for r in good]))
                if system == "shoal" and good
                else "–"
            )
            ratio = ""
            if system == "dask":
                s, d = cpu.get(("shoal", w, c), math.nan), cpu[(system, w, c)]
                ratio = f"{d / s:.1f}×" if s and not math.isnan(s) and not math.isnan(d) else "–"
            lines.append(
                f"| {system} | {w:,} | {c:,} | {fmt(cpu[(system, w, c)], '.2f')} "
                f"| {fmt(lo, '.2f')}–{fmt(hi, '.2f')} | {fmt(sent[(system, w, c)])} | {recv} "
                f"| {fmt(med(rs, 'req_per_s'))} | {fmt(med(rs, 'us_per_req'))} | {pushes} | {len(good)}/{len(rs)} | {ratio} |"
            )
    bars: list[tuple[str, str, str, bool | None]] = []
    key = ("shoal", *BAR_POINT)
    wb, cb = BAR_POINT
    if "shoal" in systems:
        s_cpu, s_sent = cpu.get(key, math.nan), sent.get(key, math.nan)
        bars.append(
            (
                f"shoal scheduler CPU at W={wb:,}, C={cb}",
                f"{fmt(s_cpu, '.2f')}% of a core",
                f"< {CPU_BAR:g}%",
                None if math.isnan(s_cpu) else s_cpu < CPU_BAR,
            )
        )
        bars.append(
            (
                f"shoal scheduler bytes sent at W={wb:,}, C={cb}",
                f"{fmt(s_sent)} B/s",
                f"< {BYTES_BAR:,} B/s",
                None if math.isnan(s_sent) else s_sent < BYTES_BAR,
            )
        )
    if "shoal" in systems and "dask" in systems:
        for w, c in points:
            s, d = cpu.get(("shoal", w, c), math.nan), cpu.get(("dask", w, c), math.nan)
            if math.isnan(s) or math.isnan(d):
                if (w, c) == BAR_POINT:
                    bars.append(
                        (f"dask/shoal CPU at W={w:,}, C={c}", "Dask not measured", "≥ 10×", None)
                    )
                continue
            bars.append(
                (
                    f"dask/shoal scheduler CPU at W={w:,}, C={c}",
                    f"{d / s:.1f}×",
                    f"≥ {RATIO_BAR:g}×",
                    d / s >= RATIO_BAR,
                )
            )
    return lines, bars


def bar_lines(bars: list[tuple[str, str, str, bool | None]]) -> list[str]:
    out = ["| bar | measured | target | met |", "|---|---:|---:|---|"]
    for what, val, target, met in bars:
        out.append(
            f"| {what} | {val} | {target} | {'–' if met is None else 'yes' if met else 'NO'} |"
        )
    return out


def run_lines(runs: list[Run]) -> list[str]:
    out = [
        "| system | W | C | run | CPU % | precise | kernel % | sent B/s | ss recv B/s | counted recv B/s "
        "| sockets start/end (opened, closed) | startup s | sched RSS MB | generators CPU % "
        "| generators counted in the window | error |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for r in runs:
        b = r.bytes
        socks = f"{b.sockets_start}/{b.sockets_end} ({b.opened}, {b.closed})" if b else "–"
        msgs = ", ".join(f"{k} {v}" for k, v in sorted(r.window_msgs.items()))
        out.append(
            f"| {r.system} | {r.w:,} | {r.c:,} | {r.repeat + 1} | {fmt(r.cpu_pct, '.2f')} "
            f"| {'yes' if r.precise else 'no'} | {fmt(r.kernel_share, '.0f')} | {fmt(r.sent_per_s)} | {fmt(r.ss_recv_per_s)} "
            f"| {fmt(r.app_recv_per_s) if r.app_recv_per_s is not None else '–'} | {socks} "
            f"| {fmt(r.startup_s, '.1f')} | {fmt(r.rss_mb, '.0f')} | {fmt(r.gens_cpu_pct, '.0f')} "
            f"| {msgs or '–'} | {r.error.splitlines()[0][:200] if r.error else ''} |"
        )
    return out


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} cores ({model}), {mem:.0f} GiB, Linux {platform.release()}"


def git_rev() -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    return "unknown"


def write_report(
    path: Path,
    args: argparse.Namespace,
    runs: list[Run],
    table: list[str],
    bars: list[str],
    skipped: list[str],
    wall: float,
) -> None:
    import distributed

    lines = [
        "# cluster_state: what an idle cluster costs its scheduler",
        "",
        f"Generated by `python benchmarks/cluster_state.py {' '.join(sys.argv[1:])}`"
        f" on {time.strftime('%Y-%m-%d %H:%M')}, {wall / 60:.0f} min.",
        f"shoal {git_rev()}, distributed {distributed.__version__}, Python "
        f"{platform.python_version()}; {machine()}.",
        "",
        f"W simulated workers and C idle clients with default settings; after all are "
        f"registered and {args.settle:g} s of settling, the scheduler's CPU and the bytes it "
        f"sends are measured over {args.window:g} s; median of {args.repeat} runs, a fresh "
        "cluster each. Method: `benchmarks/README.md`, section cluster_state.",
        "",
        "- **sched CPU %**: CPU time of the scheduler process over the window / window, "
        "from /proc/PID/task/*/schedstat (100 = one core).",
        "- **kernel %** (every run): the share of that CPU spent in the kernel (psutil "
        "user/system times, clock-tick resolution).",
        "- **bytes/s sent**: the kernel's `bytes_sent` of every TCP socket of the scheduler "
        "(`ss -tinpH`), end − start of the window.",
        "- **receivers**: the same connections seen from the load generators: `bytes_received` "
        "of their ends (ss), and for shoal also the bytes its connections counted in "
        "`data_received` (the two must agree with the sent column).",
        "- **requests/s**: requests the scheduler got in the window, counted by the load "
        "generators (shoal: replies received; Dask: worker heartbeats, client heartbeats and "
        "scheduler-info polls made).",
        "- **CPU µs/request**: scheduler CPU / requests (what the scheduler does besides "
        "answering them, e.g. its timers, included).",
        "- **pushes in window**: `ClusterState` messages the shoal clients received during "
        "the window (an idle cluster's summary does not change: expected 0).",
        "",
        *table,
        "",
        "## Bars",
        "",
        *bars,
        "",
    ]
    if skipped:
        lines += ["## Not measured", "", *[f"- {s}" for s in skipped], ""]
    lines += ["## Every run", "", *run_lines(runs), ""]
    errors = [r for r in runs if r.error]
    if errors:
        lines += ["## Errors", ""]
        for r in errors:
            lines += [f"{r.system} W={r.w} C={r.c} run {r.repeat + 1}:", "", "```", r.error, "```"]
        lines.append("")
    path.write_text("\n".join(lines))


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--points", default=DEFAULT_POINTS, help=f"WxC,... (default {DEFAULT_POINTS})")
    p.add_argument("--dask-points", default=None, help="Dask's points (default: --points)")
    p.add_argument("--systems", default="shoal,dask")
    p.add_argument("--repeat", type=int, default=3, help="runs per point and system (median)")
    p.add_argument("--window", type=float, default=30.0, help="measurement window, s")
    p.add_argument("--settle", type=float, default=10.0, help="wait after startup, s")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--worker-procs", type=int, default=4, help="processes for workers (max)")
    p.add_argument("--client-procs", type=int, default=4, help="processes for clients (max)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-cluster-state.md"))
    p.add_argument("--keep-logs", action="store_true", help="keep every run's log directory")
    p.add_argument(
        "--py-spy",
        default="",
        metavar="DIR",
        help="profile the scheduler during each window with py-spy (raw stacks into DIR); "
        "perturbs the measurement a little",
    )
    p.add_argument("--py-spy-systems", default="shoal")
    args = p.parse_args(argv)
    args.py_spy_systems = args.py_spy_systems.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}")
    points = parse_points(args.points)
    want = {"shoal": points, "dask": parse_points(args.dask_points or args.points)}
    all_points = sorted({p for s in systems for p in want[s]})
    runs: list[Run] = []
    skipped: list[str] = []
    failed_points: set[tuple[str, int, int]] = set()
    for w, c in all_points:
        for r in range(args.repeat):
            order = systems if r % 2 == 0 else systems[::-1]
            for system in order:
                if (w, c) not in want[system]:
                    continue
                if (system, w, c) in failed_points:
                    continue
                run = run_one(system, w, c, r, args)
                runs.append(run)
                if run.error and "ready after" in run.error:  # startup too slow: not again
                    failed_points.add((system, w, c))
                    skipped.append(
                        f"{system} W={w} C={c}: further runs skipped after: {run.error[:300]}"
                    )
    if "dask" in systems:
        for w, c in points:
            if (w, c) not in want["dask"]:
                skipped.append(f"dask W={w:,} C={c}: not in --dask-points")
    table, bars = summarize(runs, all_points, systems)
    print("\n".join(table))
    print()
    blines = bar_lines(bars)
    print("\n".join(blines))
    for what, val, target, met in bars:
        state = "not measured" if met is None else "MET" if met else "NOT MET"
        print(f"bar: {what}: {val} (target {target}): {state}")
    if args.out:
        write_report(Path(args.out), args, runs, table, blines, skipped, time.monotonic() - t0)
        log(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
