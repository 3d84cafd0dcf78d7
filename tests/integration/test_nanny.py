"""The nanny, on real processes with real signals: it restarts a worker that dies
(SIGKILL, os._exit in a task, a memory blow-up with SIGINT ignored) under the same
name, tells the scheduler, cleans the worker's directory, gives up on a worker that
keeps dying, exits with its worker, and never leaves an orphan worker behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from recording_scheduler import recording_scheduler, wait_for
from test_lifecycle import read_scheduler_file

from shoal import Client, KilledWorker, LocalCluster
from shoal.protocol import messages as m
from shoal.server.nanny import Nanny

MB = 1_000_000


def getpid(_: object = None) -> int:
    return os.getpid()


def exit_once(marker: str) -> str:
    """Kill the worker process the first time (os._exit skips every cleanup)."""
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return "survived"


def blow_up_once(marker: str) -> str:
    """The first time: ignore SIGINT, the nanny's "close at once" (the libc call works
    from any thread, unlike signal.signal), then take memory past the terminate
    threshold and hold it."""
    import ctypes

    import numpy as np

    if os.path.exists(marker):
        return "survived"
    Path(marker).touch()
    ctypes.CDLL(None).signal(signal.SIGINT, 1)  # SIG_IGN
    hog = np.ones(400 * MB // 8)
    time.sleep(60)
    return str(hog.sum())


def array(i: int, mb: int) -> Any:
    import numpy as np

    return np.full(mb * MB // 8, float(i))


def worker_child(nanny: subprocess.Popen[bytes] | int, timeout: float = 20) -> psutil.Process:
    """The worker process a nanny runs now."""
    pid = nanny if isinstance(nanny, int) else nanny.pid

    def child() -> psutil.Process | None:
        try:
            children = psutil.Process(pid).children()
        except psutil.Error:
            return None
        return children[0] if children else None

    return wait_for(child, timeout, f"a worker under nanny {pid}")  # type: ignore[no-any-return]


def workers_named(client: Client, name: str) -> list[str]:
    return [a for a, w in client.scheduler_info()["workers"].items() if w["name"] == name]


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def spill_files(root: Path) -> list[Path]:
    return list(root.rglob("*.spill"))


def stop_nanny(nanny: subprocess.Popen[bytes]) -> None:
    nanny.send_signal(signal.SIGTERM)
    assert nanny.wait(15) == 0


@pytest.mark.timeout(60)
def test_sigkilled_worker_is_restarted_under_its_name(spawn: Callable[..., Any]) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w")
        first = worker_child(nanny)
        client.wait_for_workers(1, timeout=20)
        (old_address,) = workers_named(client, "w")
        assert client.submit(getpid, 1, pure=False).result(timeout=20) == first.pid
        first.send_signal(signal.SIGKILL)
        (report,) = wait_for(lambda: s.recorded(m.WorkerExited), 10, "a WorkerExited report")
        assert report.address == old_address and report.name == "w"
        assert "SIGKILL" in report.reason and report.restarting
        second = worker_child(nanny)
        assert second.pid != first.pid
        wait_for(lambda: workers_named(client, "w") not in ([], [old_address]), 20, "rejoined")
        assert client.submit(getpid, 2, pure=False).result(timeout=20) == second.pid
        assert nanny.poll() is None
        stop_nanny(nanny)
        assert gone(second)


@pytest.mark.timeout(60)
def test_os_exit_in_a_task_restarts_the_worker_and_the_task_runs_again(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w")
        first = worker_child(nanny)
        client.wait_for_workers(1, timeout=20)
        fut = client.submit(exit_once, str(tmp_path / "exited"))
        assert fut.result(timeout=30) == "survived"  # run again on the restarted worker
        (report,) = s.recorded(m.WorkerExited)
        assert report.reason == "exited with code 1" and report.restarting
        assert worker_child(nanny).pid != first.pid
        stop_nanny(nanny)


@pytest.mark.timeout(60)
def test_worker_ignoring_sigint_over_the_terminate_threshold_is_sigkilled_and_restarted(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    workdir = tmp_path / "local"
    workdir.mkdir()
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nanny = spawn(
            "worker",
            s.address,
            "--nanny",
            "--name",
            "w",
            "--nthreads",
            "2",
            "--memory-limit",
            "300MB",
            "--memory-target-fraction",
            "0.1",  # 30 MB of results in memory, the rest on disk
            "--local-directory",
            str(workdir),
        )
        first = worker_child(nanny)
        client.wait_for_workers(1, timeout=20)
        arrays = client.map(array, range(3), mb=20)
        client.gather(arrays)
        assert len(spill_files(workdir)) == 2
        hog = client.submit(blow_up_once, str(tmp_path / "blown"))
        # reported before the kill (so the scheduler knows why), then with how it ended
        wait_for(lambda: s.recorded(m.WorkerExited)[1:], 20, "two reports")
        early, report = s.recorded(m.WorkerExited)
        assert early.reason.startswith("killed for memory") and early.restarting
        assert report.reason.startswith(early.reason), report.reason
        assert "ignored SIGINT" in report.reason and "SIGKILL" in report.reason
        assert report.restarting
        assert gone(first)
        assert spill_files(workdir) == []  # the nanny cleaned the dead worker's directory
        second = worker_child(nanny)
        assert second.pid != first.pid
        assert hog.result(timeout=30) == "survived"
        # the results lost with the first worker are computed again
        assert [a[0] for a in client.gather(arrays)] == [0.0, 1.0, 2.0]
        stop_nanny(nanny)
    assert list(workdir.iterdir()) == []  # the nanny removed its directory on exit


@pytest.mark.timeout(60)
def test_local_cluster_restarts_a_sigkilled_worker() -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        nannies = cluster.nanny_pids
        assert len(nannies) == 2 and len(cluster.worker_pids) == 2
        victim = psutil.Process(cluster.worker_pids[0])
        assert victim.ppid() == nannies[0]
        (old_address,) = workers_named(client, "0")
        victim.send_signal(signal.SIGKILL)
        wait_for(lambda: workers_named(client, "0") not in ([], [old_address]), 20, "rejoined")
        new = worker_child(nannies[0])
        assert new.pid != victim.pid and cluster.worker_pids == [new.pid, cluster.worker_pids[1]]
        assert cluster.nanny_pids == nannies
        pids = set(client.gather(client.map(getpid, range(20), pure=False)))
        assert pids <= set(cluster.worker_pids)


@pytest.mark.timeout(30)
def test_killed_nanny_leaves_no_orphan_worker(spawn: Callable[..., Any]) -> None:
    with recording_scheduler() as s:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w")
        worker = worker_child(nanny)
        nanny.send_signal(signal.SIGKILL)
        nanny.wait(10)
        wait_for(lambda: gone(worker), 5, "the orphaned worker to exit")


@pytest.mark.timeout(30)
def test_nanny_exits_with_a_worker_that_lost_its_scheduler(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    with recording_scheduler() as s:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w")
        worker = worker_child(nanny)
        wait_for(lambda: s.state.workers, 20, "the worker to join")
    # the scheduler is closed: the worker exits normally, the nanny does not restart it
    assert nanny.wait(15) == 0
    assert gone(worker)
    assert s.recorded(m.WorkerExited) == []


@pytest.mark.timeout(30)
def test_sigterm_to_the_nanny_stops_the_worker_and_cleans_up(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    with recording_scheduler() as s:
        nanny = spawn("worker", s.address, "--nanny", "--local-directory", str(tmp_path))
        worker = worker_child(nanny)
        wait_for(lambda: s.state.workers, 20, "the worker to join")
        assert list(tmp_path.iterdir())  # the nanny's directory for its worker
        stop_nanny(nanny)
        assert gone(worker)
        assert list(tmp_path.iterdir()) == []
        assert s.recorded(m.WorkerExited) == []  # asked to stop: nothing abnormal


@pytest.mark.timeout(30)
def test_nanny_gives_up_on_a_worker_that_keeps_dying(tmp_path: Path) -> None:
    with recording_scheduler() as s:
        # --nthreads 0 is refused: the worker exits with code 2 at every start
        nanny = Nanny(
            s.address,
            "doomed",
            ["--nthreads", "0"],
            local_directory=str(tmp_path),
            max_restarts=2,
            restart_window=60,
        )
        start = time.monotonic()
        assert asyncio.run(nanny.run()) == 1
        assert time.monotonic() - start < 15
        reports = wait_for(lambda: s.recorded(m.WorkerExited)[2:], 5, "three reports")
        reports = s.recorded(m.WorkerExited)
        assert [r.restarting for r in reports] == [True, True, False]
        assert all(r.reason == "exited with code 2" and r.address == "" for r in reports)
        assert nanny.restarts == 2
    assert list(tmp_path.iterdir()) == []


def hog(mb: int) -> None:
    import numpy as np

    held = np.ones(mb * MB // 8)
    time.sleep(60)
    del held


@pytest.mark.timeout(90)
def test_killed_worker_after_memory_kills_says_it_was_memory() -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit="300MB", allowed_failures=1
        ) as cluster,
        Client(cluster) as client,
    ):
        fut = client.submit(hog, 400)
        with pytest.raises(KilledWorker) as info:
            fut.result(timeout=60)
        exc = info.value
        assert len(exc.workers) == 2
        assert set(exc.reasons) == set(exc.workers), exc.reasons
        assert all("killed for memory" in why for why in exc.reasons.values()), exc.reasons
        assert "killed for memory" in str(exc) and "more memory than a worker has" in str(exc)
        assert client.submit(getpid, 1, pure=False).result(timeout=20) in cluster.worker_pids


def test_a_nanny_stopped_while_its_worker_starts_leaves_no_traceback(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    """A cluster closed right after ``scale(10)`` (Dask's futures notebook) stops
    nannies whose workers are still importing: SIGINT there printed a KeyboardInterrupt
    traceback per worker. A worker that has not connected has nothing to close: it is
    killed outright, quietly."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    sched = spawn("scheduler", "--port", "0", "--scheduler-file", str(tmp_path / "s.json"), **quiet)
    address = read_scheduler_file(tmp_path / "s.json", sched)
    nanny = spawn("worker", address, "--nanny", stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not psutil.Process(nanny.pid).children():  # the worker process exists...
        assert nanny.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    nanny.send_signal(signal.SIGTERM)  # ...and is still importing shoal
    assert nanny.wait(20) is not None
    err = nanny.stderr.read().decode()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
