"""Worker memory on real processes: results past the target go to disk and come back,
a worker over the pause fraction starts nothing until memory falls (and tells the
scheduler both times), a result that cannot be pickled to spill or to send is reported
to the scheduler and dropped while the worker keeps working."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from recording_scheduler import recording_scheduler, wait_for

import shoal
from shoal import Client, LocalCluster
from shoal.protocol import messages as m

MB = 1_000_000


def array(i: int, mb: int) -> Any:
    import numpy as np

    return np.full(mb * MB // 8, float(i))


def head_and_sum(x: Any) -> tuple[float, float]:
    return float(x[0]), float(x.sum())


def hold_memory(mb: int, stop: str) -> int:
    """Hold ``mb`` MB (touched, so resident) until ``stop`` exists."""
    import numpy as np

    hog = np.ones(mb * MB // 8)
    while not os.path.exists(stop):
        time.sleep(0.02)
    del hog
    return mb


def touch(path: str) -> str:
    Path(path).touch()
    return path


def lock_with_memory(mb: int) -> Any:
    import threading

    import numpy as np

    return [threading.Lock(), np.ones(mb * MB // 8)]


def lock() -> Any:
    import threading

    return [threading.Lock()]


def inc(x: int) -> int:
    return x + 1


def spill_files(root: Path) -> list[Path]:
    return list(root.rglob("*.spill"))


def written(root: Path, size: int, n: int) -> list[Path] | None:
    """At least ``n`` spill files of more than ``size`` bytes, or None."""
    done = []
    for f in spill_files(root):
        with contextlib.suppress(FileNotFoundError):  # (read back meanwhile)
            if f.stat().st_size > size:
                done.append(f)
    return done if len(done) >= n else None


@pytest.mark.timeout(60)
def test_results_past_the_target_go_to_disk_and_come_back(tmp_path: Path) -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit="400MB", local_directory=str(tmp_path)
        ) as cluster,
        Client(cluster) as client,
    ):
        n, mb = 10, 30  # 300 MB of results, the target is 240 MB
        arrays = client.map(array, range(n), mb=mb)
        shoal.wait(arrays, timeout=30)
        # (a file appears when its writing starts: wait until two are written whole)
        files = wait_for(lambda: written(tmp_path, mb * MB, 2), 5, "spill files written")
        assert len(files) >= 2, files
        # dependents read them (the spilled ones from disk), and so does the client
        heads = client.gather(client.map(head_and_sum, arrays))
        assert heads == [(float(i), float(i) * mb * MB // 8) for i in range(n)]
        for i, fut in enumerate(arrays):
            value = fut.result(timeout=30)
            assert value.shape == (mb * MB // 8,) and value[0] == i and value[-1] == i
        del arrays, fut
    assert spill_files(tmp_path) == []


@pytest.mark.timeout(60)
def test_worker_over_the_pause_fraction_starts_nothing_until_memory_falls(
    spawn: Callable[..., Any], tmp_path: Path, stop_file: Path
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        spawn(
            "worker",
            s.address,
            "--nthreads",
            "2",
            "--memory-limit",
            "400MB",  # pauses past 320 MB
            "--memory-terminate-fraction",
            "off",
        )
        client.wait_for_workers(1, timeout=20)
        hog = client.submit(hold_memory, 300, str(stop_file))
        wait_for(lambda: s.recorded(m.WorkerStatus), 20, "the worker to pause")
        assert [x.status for x in s.recorded(m.WorkerStatus)] == ["paused"]
        marker = tmp_path / "ran"
        later = client.submit(touch, str(marker))
        time.sleep(1.0)
        assert not marker.exists(), "a paused worker started a task (a thread was free)"
        stop_file.touch()
        assert hog.result(timeout=20) == 300
        assert later.result(timeout=20) == str(marker)
        assert [x.status for x in s.recorded(m.WorkerStatus)] == ["paused", "running"]


@pytest.mark.timeout(60)
def test_result_that_cannot_be_spilled_is_reported_and_dropped(spawn: Callable[..., Any]) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        spawn(
            "worker",
            s.address,
            "--memory-limit",
            "300MB",  # spills past 210 MB of process memory
            "--memory-terminate-fraction",
            "off",
        )
        client.wait_for_workers(1, timeout=20)
        bad = client.submit(lock_with_memory, 200)
        (report,) = wait_for(lambda: s.recorded(m.KeyUnserializable), 20, "a report")
        assert report.key == bad.key and "lock" in report.reason
        # the scheduler errs the task with the reason
        with pytest.raises(shoal.SerializationError, match="cannot be pickled.*lock"):
            bad.result(timeout=20)
        assert bad.status == "error" and task_state(s, bad.key) == "erred"
        assert client.submit(inc, 1).result(timeout=20) == 2  # the worker keeps working
        # dropped: the memory it held is free again, so the worker is not paused
        statuses = [x.status for x in s.recorded(m.WorkerStatus)]
        assert statuses in ([], ["paused", "running"]), statuses


def task_state(s: Any, key: Any) -> str:
    ts = s.state.tasks.get(key)
    return "forgotten" if ts is None else str(ts.state)


@pytest.mark.timeout(60)
def test_result_that_cannot_be_sent_is_reported(spawn: Callable[..., Any]) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        spawn("worker", s.address)
        client.wait_for_workers(1, timeout=20)
        bad = client.submit(lock)
        with pytest.raises(shoal.SerializationError, match="lock"):
            bad.result(timeout=20)
        (report,) = wait_for(lambda: s.recorded(m.KeyUnserializable), 10, "a report")
        assert report.key == bad.key and "lock" in report.reason
        # and the scheduler errs the task itself, with the reason
        wait_for(lambda: task_state(s, bad.key) == "erred", 10, "the task to err")
        assert bad.status == "error"
        assert client.submit(inc, 2).result(timeout=20) == 3


@pytest.mark.timeout(30)
def test_memory_metrics_count_spilled_bytes() -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, memory_limit="100MB"
        ) as cluster,
        Client(cluster) as client,
    ):
        (worker,) = cluster._workers
        rss, spilled = worker.memory_metrics()
        assert rss > 10 * MB and spilled == 0
        arrays = client.map(array, range(4), mb=20)  # 80 MB: the target is 60 MB
        assert [a[0] for a in client.gather(arrays)] == [0.0, 1.0, 2.0, 3.0]
        rss, spilled = worker.memory_metrics()
        assert spilled > 20 * MB
