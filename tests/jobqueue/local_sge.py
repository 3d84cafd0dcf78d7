"""A single-node Grid Engine on this machine, from Debian's gridengine-* packages.

Their install makes a cell in /var/lib/gridengine/default (spool in
/var/spool/gridengine). ``local_sge()`` names this host as the master (and maps the
name 127.0.0.1 reverse-resolves to onto it, as SGE insists the two agree), starts
``sge_qmaster`` and ``sge_execd``, makes it a submit host, lets root run jobs, makes
the scheduler run every second, adds a queue ``shoal.q`` (slots = CPUs), and at the end
deletes every job and the queue, stops both daemons and puts the files it changed back.
The cell's global settings it changed (min_uid, min_gid, schedule_interval) stay.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

SGE_ROOT = Path("/var/lib/gridengine")
CELL = "default"
QUEUE = "shoal.q"


def missing() -> str:
    if os.geteuid() != 0:
        return "a local Grid Engine needs root"
    absent = [c for c in ("qsub", "qstat", "qdel", "qconf") if shutil.which(c) is None]
    if absent or not Path("/usr/sbin/sge_qmaster").exists() or not (SGE_ROOT / CELL).exists():
        return (
            "Grid Engine not installed (Debian: apt-get install gridengine-master "
            "gridengine-exec gridengine-client; scripts/install-system-deps.sh does it)"
        )
    if _daemons():
        return "a Grid Engine daemon is already running on this machine"
    return ""


def _daemons() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in ("sge_qmaster", "sge_execd"):
            found.append(p)
    return found


def _run(args: list[str], env: dict[str, str], check: bool = True, **kw: object) -> str:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30, **kw)  # type: ignore[call-overload]
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return str(proc.stdout)


def _edit(args: list[str], env: dict[str, str], sed: str) -> None:
    """``qconf -mconf``/``-msconf`` through an EDITOR that applies ``sed``."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(f"#!/bin/sh\nsed -i '{sed}' \"$1\"\n")
    os.chmod(f.name, stat.S_IRWXU)
    try:
        _run(args, {**env, "EDITOR": f.name})
    finally:
        os.unlink(f.name)


def _wait(ready: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.3)


QUEUE_CONF = """\
qname {queue}
hostlist {host}
seq_no 0
load_thresholds NONE
suspend_thresholds NONE
nsuspend 1
suspend_interval 00:05:00
priority 0
min_cpu_interval 00:05:00
processors UNDEFINED
qtype BATCH INTERACTIVE
ckpt_list NONE
pe_list NONE
rerun FALSE
slots {slots}
tmpdir /tmp
shell /bin/bash
prolog NONE
epilog NONE
shell_start_mode unix_behavior
starter_method NONE
suspend_method NONE
resume_method NONE
terminate_method NONE
notify 00:00:60
owner_list NONE
user_lists NONE
xuser_lists NONE
subordinate_list NONE
complex_values NONE
projects NONE
xprojects NONE
calendar NONE
initial_state default
s_rt INFINITY
h_rt INFINITY
s_cpu INFINITY
h_cpu INFINITY
s_fsize INFINITY
h_fsize INFINITY
s_data INFINITY
h_data INFINITY
s_stack INFINITY
h_stack INFINITY
s_core INFINITY
h_core INFINITY
s_rss INFINITY
h_rss INFINITY
s_vmem INFINITY
h_vmem INFINITY
"""


@contextlib.contextmanager
def local_sge(timeout: float = 60.0) -> Iterator[dict[str, str]]:
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    common = SGE_ROOT / CELL / "common"
    host = socket.gethostname().split(".")[0]
    names = {host}
    with contextlib.suppress(OSError):
        for address in {"127.0.0.1", socket.gethostbyname(host)}:
            name, aliases, _ = socket.gethostbyaddr(address)
            names.update([name.split(".")[0], *aliases])
    saved = {
        p: p.read_bytes() if p.exists() else None
        for p in (common / "act_qmaster", common / "host_aliases")
    }
    env = {**os.environ, "SGE_ROOT": str(SGE_ROOT), "SGE_CELL": CELL}
    old_env = {k: os.environ.get(k) for k in ("SGE_ROOT", "SGE_CELL")}
    try:
        (common / "act_qmaster").write_text(host + "\n")
        (common / "host_aliases").write_text(" ".join([host, *sorted(names - {host})]) + "\n")
        _run(["/usr/sbin/sge_qmaster"], env)
        _wait(lambda: _run(["qconf", "-sh"], env, check=False).strip(), timeout, "sge_qmaster")
        if host not in _run(["qconf", "-ss"], env, check=False).split():
            _run(["qconf", "-as", host], env)
        _edit(["qconf", "-mconf"], env, "s/^min_uid.*/min_uid 0/;s/^min_gid.*/min_gid 0/")
        _edit(["qconf", "-msconf"], env, "s/^schedule_interval.*/schedule_interval 0:0:1/")
        _run(["/usr/sbin/sge_execd"], env)
        if QUEUE not in _run(["qconf", "-sql"], env, check=False).split():
            with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
                f.write(QUEUE_CONF.format(queue=QUEUE, host=host, slots=os.cpu_count() or 1))
            try:
                _run(["qconf", "-Aq", f.name], env)
            finally:
                os.unlink(f.name)
        _wait(lambda: _queue_ready(env), timeout, f"queue {QUEUE} on {host}")
        os.environ.update({"SGE_ROOT": str(SGE_ROOT), "SGE_CELL": CELL})
        yield {"queue": QUEUE}
    finally:
        _run(["qdel", "-u", "root"], env, check=False)
        _run(["qconf", "-dq", QUEUE], env, check=False)
        _run(["qconf", "-ke", "all"], env, check=False)
        _run(["qconf", "-km"], env, check=False)
        with contextlib.suppress(RuntimeError):
            _wait(lambda: not _daemons(), 30, "the Grid Engine daemons to stop")
        for p in _daemons():
            with contextlib.suppress(psutil.Error):
                p.kill()
        for path, content in saved.items():
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(content)
        for key, value in old_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _queue_ready(env: dict[str, str]) -> bool:
    """The queue instance is listed without a state letter (a, u, E, d: not usable)."""
    out = _run(["qstat", "-f", "-q", QUEUE], env, check=False)
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith(f"{QUEUE}@"):
            return len(parts) == 5  # queuename qtype resv/used/tot load arch [states]
    return False
