"""The three-host cluster the multi-host tests drive (hosts from netns.py), in a module
of its own: the tests import it by this unique name (``from conftest import`` could
find another test directory's conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from netns import Host, Network

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).with_name("scenarios.py")
C_PORT = 9786  # C's namespace is its own: this port is free there
WORKER_MEMORY = [
    # 100 MB of results in memory, then to disk; no process-memory thresholds (a
    # worker's baseline RSS would trip them at this small limit)
    *("--memory-limit", "1GB", "--memory-target-fraction", "0.1"),
    *("--memory-spill-fraction", "off", "--memory-pause-fraction", "off"),
]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class Cluster:
    def __init__(self, network: Network, logs: Path, env: dict[str, str], c_port: int = C_PORT):
        self.network = network
        self.c_port = c_port  # C's worker listens there (one cluster's worker each)
        self.logs = logs
        self.env = env
        self.a, self.b, self.c = (network.hosts[n] for n in "abc")
        self.address = ""
        self.workers: dict[str, subprocess.Popen[str]] = {}

    def start_scheduler(self) -> None:
        proc = self.a.popen(
            [sys.executable, "-m", "shoal", "scheduler", "--host", self.a.ip, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=self._log("scheduler"),
            env=self.env,
        )
        assert proc.stdout is not None
        self.address = proc.stdout.readline().strip()
        assert self.address, f"the scheduler did not start: {self.log_text('scheduler')}"

    def _log(self, name: str) -> int:
        return os.open(self.logs / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def log_text(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def worker_args(self, host: Host) -> list[str]:
        if host is self.c:
            return [
                *("--listen-address", f"tcp://0.0.0.0:{self.c_port}"),
                *("--contact-address", f"{self.address.split('://')[0]}://{host.ip}:{self.c_port}"),
            ]
        return []

    def start_worker(self, host: Host, *extra: str) -> subprocess.Popen[str]:
        args = [sys.executable, "-m", "shoal", "worker", self.address, "--name", host.name]
        log = self._log(f"worker-{host.name}")
        proc = host.popen(
            [*args, *WORKER_MEMORY, *self.worker_args(host), *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=self.env,
        )
        os.close(log)
        self.workers[host.name] = proc
        return proc

    def ensure_workers(self) -> None:
        """A worker on B and on C (tests kill or retire them)."""
        for host in (self.b, self.c):
            proc = self.workers.get(host.name)
            if proc is None or proc.poll() is not None:
                self.start_worker(host)

    def run_client(self, scenario: str, timeout: float = 90, on_step: dict | None = None) -> dict:
        """Run scenarios.py ``scenario`` on host A; its RESULT. ``on_step``: what to do
        (a callable) when it prints ``STEP name``, before it goes on."""
        proc = self.a.popen(
            [sys.executable, str(SCENARIOS), scenario, self.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        result = None
        for line in proc.stdout:
            if line.startswith("STEP "):
                (on_step or {})[line.split()[1]]()
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        _, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0 or result is None:
            logs = "\n".join(
                f"--- {path.name}:\n{path.read_text(errors='replace')[-1500:]}"
                for path in sorted(self.logs.glob("*.log"))
            )
            raise AssertionError(f"{scenario} failed ({proc.returncode}): {err[-3000:]}\n{logs}")
        return result
