"""Start and stop one scheduler + N worker processes of a system, robustly.

* Every process runs in its own session (process group); the whole group is
  killed on stop, and on interpreter exit (``atexit``) for anything still alive.
* Ports are chosen by the OS (``--port 0``); the address is read back from the
  scheduler file.
* Every client call runs on a dedicated daemon thread per cluster and is awaited
  with a timeout (:class:`CallThread`), so a hung system cannot hang the runner.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import inspect
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.workloads import Api, dask_executed_count

ROOT = Path(__file__).resolve().parent.parent

# --- process registry -----------------------------------------------------------------

_LIVE: set[subprocess.Popen] = set()


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    # Children of the group may outlive the leader: always finish with SIGKILL.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    _LIVE.discard(proc)


@atexit.register
def _kill_all() -> None:
    for proc in list(_LIVE):
        _kill_group(proc, grace=2.0)


def _sigterm(signum, frame):  # turn SIGTERM into SystemExit so finally/atexit run
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _sigterm)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    path = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=_child_env(),
            start_new_session=True,
        )
    _LIVE.add(proc)
    return proc


def tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


# --- calls with a timeout --------------------------------------------------------------


class CallTimeout(TimeoutError):
    pass


class CallThread:
    """A daemon thread that runs calls one at a time; callers wait with a timeout.

    After a timeout the thread is considered stuck and refuses further calls.
    """

    def __init__(self, name: str):
        self._q: queue.Queue = queue.Queue()
        self.stuck = False
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box["value"] = fn()
            except BaseException as e:  # handed back to the caller
                box["error"] = e
            done.set()

    def call(self, fn: Callable[[], Any], timeout: float) -> Any:
        if self.stuck:
            raise CallTimeout("client thread is stuck in an earlier call")
        box: dict[str, Any] = {}
        done = threading.Event()
        self._q.put((fn, box, done))
        if not done.wait(timeout):
            self.stuck = True
            raise CallTimeout(f"call did not finish within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self):
        """Let the thread end once it is idle (a stuck one stays stuck, as a daemon)."""
        self._q.put(None)


# --- systems -------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    name: str
    client_module: str  # module exporting Client and wait
    scheduler_cmd: Callable[[Path], list[str]]
    worker_cmd: Callable[[Path, str, bool], list[str]]  # (scheduler file, name, zero)
    supports_zero: bool
    tasks_run: Callable[[Any], int]  # (client) -> tasks run by all workers so far

    def version(self) -> str:
        try:
            mod = importlib.import_module(self.version_module)
        except Exception as e:
            return f"not importable ({type(e).__name__}: {e})"
        return str(getattr(mod, "__version__", "unknown"))

    @property
    def version_module(self) -> str:
        return "distributed" if self.name == "dask" else self.name

    def available(self) -> str | None:
        """None if usable, else the reason why not."""
        try:
            mod = importlib.import_module(self.client_module)
            for attr in ("Client", "wait"):
                getattr(mod, attr)
        except Exception as e:
            return f"`import {self.client_module}; {self.client_module}.Client/wait` failed: {e!r}"
        return None


PY = sys.executable

SYSTEMS: dict[str, System] = {
    "shoal": System(
        name="shoal",
        client_module="shoal",
        scheduler_cmd=lambda f: [
            PY, "-m", "shoal", "scheduler",
            "--host", "127.0.0.1", "--port", "0", "--scheduler-file", str(f),
        ],
        worker_cmd=lambda f, name, zero: [
            PY, "-m", "shoal", "worker",
            "--scheduler-file", str(f), "--nthreads", "1", "--name", name,
            *(["--zero"] if zero else []),
        ],
        supports_zero=True,
        tasks_run=lambda client: sum(
            w.get("tasks_run", 0) for w in client.scheduler_info()["workers"].values()
        ),
    ),
    "dask": System(
        name="dask",
        client_module="distributed",
        scheduler_cmd=lambda f: [
            PY, "-m", "distributed.cli.dask_scheduler",
            "--host", "127.0.0.1", "--port", "0", "--scheduler-file", str(f),
            "--no-dashboard",
        ],
        worker_cmd=lambda f, name, zero: [
            PY, "-m", "distributed.cli.dask_worker",
            "--scheduler-file", str(f), "--nthreads", "1", "--name", name,
            "--no-nanny", "--no-dashboard",
        ],
        supports_zero=False,
        tasks_run=lambda client: sum(client.run(dask_executed_count).values()),
    ),
}


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """user + system CPU seconds of the given processes (dead ones count as 0)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _thread_runtimes(pid: int) -> dict[int, int] | None:
    """Nanoseconds on CPU per thread, from /proc/PID/task/TID/schedstat (None if unreadable)."""
    try:
        out = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            path = f"/proc/{pid}/task/{tid}/schedstat"
            with contextlib.suppress(FileNotFoundError), open(path) as fh:  # may just exit
                out[int(tid)] = int(fh.read().split()[0])
        return out
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class CpuSnapshot:
    ticks: float  # psutil user+system seconds (clock-tick resolution, 10 ms)
    threads: list[dict[int, int] | None]  # per process: ns on CPU per thread


def cpu_snapshot(procs: list[psutil.Process]) -> CpuSnapshot:
    return CpuSnapshot(cpu_seconds(procs), [_thread_runtimes(p.pid) for p in procs])


def cpu_delta(a: CpuSnapshot, b: CpuSnapshot) -> tuple[float, bool]:
    """CPU seconds between two snapshots and whether the precise source was used.

    Precise: the per-thread scheduler runtimes (ns) summed over the threads alive at
    the end, valid if no thread alive at the start has exited (its time would be
    lost). Otherwise the psutil user+system figure, with clock-tick resolution.
    """
    total = 0
    for before, after in zip(a.threads, b.threads, strict=True):
        if before is None or after is None or not before.keys() <= after.keys():
            return b.ticks - a.ticks, False
        total += sum(ns - before.get(tid, 0) for tid, ns in after.items())
    return total / 1e9, True


class ClusterError(RuntimeError):
    pass


class Cluster:
    """One scheduler, ``n_workers`` single-threaded workers and a client."""

    def __init__(
        self,
        system: System,
        *,
        n_workers: int = 2,
        zero: bool = False,
        timeout: float = 60.0,
        logdir: Path | None = None,
    ):
        self.system = system
        self.n_workers = n_workers
        self.zero = zero
        self.timeout = timeout
        tag = f"{system.name}{'-zero' if zero else ''}-"
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-{tag}", dir=logdir))
        self.scheduler_file = self.dir / "scheduler.json"
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.thread = CallThread(f"client-{system.name}")
        self.client: Any = None
        self.api: Api | None = None
        self.address: str | None = None
        self.scheduler_proc: psutil.Process | None = None
        self.worker_procs: list[psutil.Process] = []

    # -- lifecycle --

    def start(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.stop(remove_logs=False)
            raise
        return self

    def _start(self):
        deadline = time.monotonic() + self.timeout
        self.scheduler = spawn(self.system.scheduler_cmd(self.scheduler_file), self.dir / "scheduler.log")
        info = self._wait_scheduler_file(deadline)
        self.address = info["address"]
        pid = int(info.get("pid") or self.scheduler.pid)
        self.scheduler_proc = psutil.Process(pid)
        for i in range(self.n_workers):
            name = f"w{i}"
            cmd = self.system.worker_cmd(self.scheduler_file, name, self.zero)
            self.workers.append(spawn(cmd, self.dir / f"worker-{name}.log"))
        self.worker_procs = [psutil.Process(w.pid) for w in self.workers]

        mod = importlib.import_module(self.system.client_module)
        remaining = max(1.0, deadline - time.monotonic())
        self.client = self.thread.call(lambda: mod.Client(self.address), remaining)
        map_kwargs = {}
        if "pure" in inspect.signature(self.client.map).parameters:
            map_kwargs["pure"] = False  # unique keys, no tokenising: same as submit(pure=False)
        self.api = Api(
            wait=mod.wait, map_kwargs=map_kwargs, check=not self.zero, scheduler_pid=pid
        )
        self._wait_workers(deadline)

    def _named_procs(self) -> list[tuple[str, str, subprocess.Popen]]:
        named = [("scheduler", "scheduler.log", self.scheduler)]
        named += [(f"worker w{i}", f"worker-w{i}.log", w) for i, w in enumerate(self.workers)]
        return [(what, log, p) for what, log, p in named if p is not None]

    def diagnose(self) -> str:
        """Which processes died (exit code, command, log tail); '' if none."""
        lines = []
        for what, log, p in self._named_procs():
            if p.poll() is not None:
                lines.append(
                    f"{self.system.name} {what} exited with code {p.returncode}: "
                    f"{' '.join(map(str, p.args))}\n{tail(self.dir / log)}"
                )
        return "\n".join(lines)

    def _check_alive(self):
        dead = self.diagnose()
        if dead:
            raise ClusterError(dead)

    def _wait_scheduler_file(self, deadline: float) -> dict:
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(self.scheduler_file.read_text())
                if isinstance(info, dict) and info.get("address"):
                    return info
            time.sleep(0.05)
        raise ClusterError(
            f"{self.system.name} scheduler did not write {self.scheduler_file} in time\n"
            f"{tail(self.dir / 'scheduler.log')}"
        )

    def _wait_workers(self, deadline: float):
        n = 0
        while time.monotonic() < deadline:
            self._check_alive()
            remaining = max(1.0, deadline - time.monotonic())
            info = self.thread.call(self.client.scheduler_info, remaining)
            n = len(info.get("workers", {}))
            if n >= self.n_workers:
                return
            time.sleep(0.1)
        raise ClusterError(f"{self.system.name}: only {n}/{self.n_workers} workers connected in time")

    def stop(self, remove_logs: bool = True):
        """Close the client, kill the processes; delete the log directory if asked."""
        if self.client is not None and not self.thread.stuck:
            with contextlib.suppress(Exception):
                self.thread.call(self.client.close, 20.0)
        self.client = None
        self.thread.close()
        for proc in [*self.workers, self.scheduler]:
            if proc is not None:
                _kill_group(proc)
        if remove_logs:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- measuring --

    def call(self, fn: Callable[[], Any], timeout: float) -> Any:
        return self.thread.call(fn, timeout)

    def tasks_run(self, timeout: float = 60.0) -> int:
        """Tasks run by all workers so far (as the system counts them)."""
        return self.thread.call(lambda: self.system.tasks_run(self.client), timeout)

    def cpu_snapshot(self) -> tuple[CpuSnapshot, CpuSnapshot]:
        """(scheduler, workers) CPU snapshots."""
        assert self.scheduler_proc is not None
        return cpu_snapshot([self.scheduler_proc]), cpu_snapshot(self.worker_procs)

    def wait_idle(self, timeout: float = 10.0, window: float = 0.2, threshold: float = 0.02):
        """Wait until scheduler and workers use < ``threshold`` CPU-s per ``window``.

        Lets the previous run's release/cleanup traffic drain before timing.
        """
        procs = [p for p in [self.scheduler_proc, *self.worker_procs] if p is not None]
        deadline = time.monotonic() + timeout
        before = cpu_seconds(procs)
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:
            time.sleep(window)
            now = cpu_seconds(procs)
            quiet = quiet + 1 if now - before <= threshold else 0
            before = now
        self._check_alive()
