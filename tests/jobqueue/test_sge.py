"""SGECluster on a real single-node Grid Engine (the ``sge`` fixture): jobs submitted
with qsub, deleted with qdel, listed with qstat."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from shoal import Client
from shoal.jobqueue import SGECluster

pytestmark = pytest.mark.timeout(120)


def queued() -> set[str]:
    out = subprocess.run(["qstat", "-u", "root"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in out.stdout.splitlines()[2:] if line.strip()}


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def add(x: int, y: int) -> int:
    return x + y


def test_sge_scale_compute_replace_close(sge, tmp_path, monkeypatch):
    here = str(Path(__file__).parent)  # jobs get this environment (qsub -V): add() imports
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    )
    cluster = SGECluster(
        cores=1,
        memory="500MB",
        walltime="00:10:00",
        queue=sge["queue"],
        interface="lo",
        log_directory=str(tmp_path),
        poll_interval="0.5s",
    )
    try:
        cluster.scale(2)
        assert len(cluster.jobs) == 2 and set(cluster.jobs) <= queued()
        cluster.wait_for_workers(2, timeout=60)
        names = {ws.name for ws in cluster._scheduler.state.workers.values()}
        assert names == {f"shoal-worker-{j}-0" for j in cluster.jobs}
        with Client(cluster) as client:
            assert client.gather(client.map(add, range(10), range(10))) == list(range(0, 20, 2))
        first = set(cluster.jobs)
        victim = min(first)
        subprocess.run(["qdel", victim], check=True, capture_output=True, timeout=10)
        wait_until(
            lambda: victim not in cluster.jobs and len(cluster.jobs) == 2, 30, "a replacement"
        )
        assert cluster.jobs_submitted == 3
        cluster.wait_for_workers(2, timeout=60)
        assert Path(cluster.log_path(min(first - {victim}))).exists()  # "NAME.oID" in log_directory
    finally:
        cluster.close()
    assert queued() == set()
