"""A single-node SLURM on this machine, for the tests and the walltime benchmark.

``local_slurm(directory)`` writes a ``slurm.conf`` (this host as the only node, its
CPUs or as many as asked (``config_overrides``), memory from what is free; jobs purged 2 s after they end, a 5 s kill wait) and a
munge key in ``directory``, starts ``munged``, ``slurmctld`` and ``slurmd`` there
(everything on loopback, on free ports), waits until ``sinfo`` shows the node idle,
sets ``SLURM_CONF`` for this process (``sbatch``/``squeue`` read it, and jobs inherit
it), and stops everything on exit, whatever happened. It needs root (``SlurmUser=root``)
and Debian's ``slurm-wlm`` and ``munge``: :func:`missing` says what is missing.

In a container this works with ``proctrack/linuxproc`` and ``task/none``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")


def missing() -> str:
    """Why a local SLURM cannot run here ("" if it can)."""
    if os.geteuid() != 0:
        return "a local SLURM needs root (SlurmUser=root)"
    absent = [c for c in (*DAEMONS, *CLIENTS) if _which(c) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed (Debian: apt-get install slurm-wlm munge; "
            "scripts/install-system-deps.sh does it)"
        )
    return ""


def _which(command: str) -> str | None:
    return shutil.which(command, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_conf(directory: Path, node: str, cpus: int, memory_mb: int, munge_socket: Path) -> str:
    return f"""\
ClusterName=shoaltest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CryptoType=crypto/munge
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd.pid
SlurmctldLogFile={directory}/slurmctld.log
SlurmdLogFile={directory}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MinJobAge=2
KillWait=5
InactiveLimit=0
OverTimeLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def local_slurm(
    directory: Path, timeout: float = 60.0, cpus: int | None = None
) -> Iterator[dict[str, str]]:
    """Run a single-node SLURM in ``directory``; yield the environment it needs. The node
    declares ``cpus`` CPUs (default: this machine's)."""
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    directory = Path(directory).resolve()
    for sub in ("state", "spool", "munge"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(directory / "munge", 0o700)
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    munge_socket = directory / "munge" / "munge.socket"
    node = socket.gethostname().split(".")[0]
    memory_mb = max(1024, int(psutil.virtual_memory().available / 2**20 * 0.8))
    conf = directory / "slurm.conf"
    conf.write_text(
        slurm_conf(directory, node, cpus or os.cpu_count() or 1, memory_mb, munge_socket)
    )
    env = {"SLURM_CONF": str(conf)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    started: list[subprocess.Popen[bytes]] = []
    logs = directory / "daemons.out"
    try:
        with open(logs, "ab") as out:
            started.append(
                _spawn(
                    [
                        _which("munged") or "munged",
                        "--foreground",
                        "--force",
                        f"--key-file={key}",
                        f"--socket={munge_socket}",
                        f"--pid-file={directory}/munge/munged.pid",
                        f"--log-file={directory}/munge/munged.log",
                        f"--seed-file={directory}/munge/munged.seed",
                    ],
                    out,
                )
            )
            _wait(lambda: munge_socket.exists(), timeout, "munged to open its socket", directory)
            started.append(_spawn([_which("slurmctld") or "slurmctld", "-D", "-i"], out))
            _wait(lambda: _ok(["scontrol", "ping"]), timeout, "slurmctld to answer", directory)
            started.append(_spawn([_which("slurmd") or "slurmd", "-D", "-N", node], out))
            _wait(lambda: _node_idle(node), timeout, f"node {node} to be idle", directory)
        yield env
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--user", "root"], timeout=10, capture_output=True)
        for proc in reversed(started):
            _stop(proc)
        for key_, value in old.items():
            if value is None:
                os.environ.pop(key_, None)
            else:
                os.environ[key_] = value


def _spawn(args: list[str], out: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL; and every process it left (slurmstepd, job processes)."""
    children = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(proc.pid).children(recursive=True)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _ok(args: list[str]) -> bool:
    try:
        return subprocess.run(args, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _node_idle(node: str) -> bool:
    try:
        out = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format", "%N %t"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.split() == [node, "idle"] for line in out.splitlines())


def _wait(ready: object, timeout: float, what: str, directory: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            tails = []
            for name in ("daemons.out", "slurmctld.log", "slurmd.log", "munge/munged.log"):
                path = directory / name
                if path.exists():
                    tails.append(f"--- {name}:\n" + "\n".join(path.read_text().splitlines()[-15:]))
            raise RuntimeError(f"timed out waiting for {what}\n" + "\n".join(tails))
        time.sleep(0.2)
