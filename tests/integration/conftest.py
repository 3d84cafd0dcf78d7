"""Fixtures for the integration tests: a shared process cluster and a leak check.

Every test runs under :func:`check_leaks`: whatever child processes, threads and
sockets of this process appeared during the test must be gone shortly after it ends
(a test closes every client, cluster and process it starts). What existed before the
test (the module-scoped cluster's processes, for instance) is not counted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from subprocess_env import child_env

from shoal import Client, LocalCluster

# Seconds for closed things to finish going away (test_leak_check.py shortens it).
LEAK_GRACE = float(os.environ.get("SHOAL_TEST_LEAK_GRACE", "5"))


# ------------------------------------------------------------------------ leak check


def _children() -> dict[tuple[int, float], psutil.Process]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            out[(p.pid, p.create_time())] = p
    return out


def _threads() -> dict[int, threading.Thread]:
    return {id(t): t for t in threading.enumerate() if t.is_alive()}


def _connections() -> set[tuple]:
    conns = psutil.Process().net_connections(kind="inet")
    return {(c.fd, c.laddr, c.raddr, c.status) for c in conns}


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ({p.status()}): {' '.join(p.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {p.pid}"


def _leaks(
    children: dict[tuple[int, float], psutil.Process], threads: set[int], conns: set[tuple]
) -> tuple[list[psutil.Process], list[threading.Thread], list[tuple]]:
    new_children = [p for k, p in _children().items() if k not in children]
    new_threads = [t for k, t in _threads().items() if k not in threads]
    new_conns = sorted(_connections() - conns, key=repr)
    return new_children, new_threads, new_conns


@pytest.fixture(autouse=True)
def check_leaks() -> Iterator[None]:
    """Fail the test if it leaves a child process, a thread or a socket behind."""
    children = _children()
    threads = set(_threads())
    conns = _connections()
    yield
    deadline = time.monotonic() + LEAK_GRACE
    while True:
        procs, thrs, socks = _leaks(children, threads, conns)
        if not (procs or thrs or socks) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    if procs:
        problems.append("child processes: " + "; ".join(_describe(p) for p in procs))
        for p in procs:  # do not let one test's leak fail every later test
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(procs, timeout=5)
        for p in procs:  # reap our own direct children (no zombies left behind)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, os.WNOHANG)
    if thrs:
        problems.append("threads: " + ", ".join(f"{t.name} (daemon={t.daemon})" for t in thrs))
    if socks:
        problems.append("sockets: " + "; ".join(map(repr, socks)))
    if problems:
        pytest.fail("the test leaked " + " | ".join(problems), pytrace=False)


# ------------------------------------------------------------------------ clusters


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two single-threaded worker processes and a scheduler process, per test module."""
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as c:
        yield c


@pytest.fixture
def inproc_cluster() -> Iterator[LocalCluster]:
    """A scheduler and two workers on a background loop in this process."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, timeout=30, validate=True
    ) as c:
        yield c


# ------------------------------------------------------------------------ processes


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``python -m shoal ARGS...``; whatever is still running at the end is killed."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, **kwargs: object) -> subprocess.Popen[bytes]:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("env", child_env())
        p = subprocess.Popen([sys.executable, "-m", "shoal", *args], **kwargs)  # type: ignore[call-overload]
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(10)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    """A client of the module's shared cluster, closed after the test."""
    with Client(cluster, timeout=30) as c:
        yield c


@pytest.fixture
def stop_file(tmp_path: Path) -> Iterator[Path]:
    """A file whose creation releases ``wait_for_file`` tasks (created at teardown too,
    so no worker thread stays blocked for the next test)."""
    path = tmp_path / "stop"
    yield path
    path.touch()
