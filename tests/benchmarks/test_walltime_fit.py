"""``benchmarks/walltime_fit.py`` at a tiny size on a real SLURM: both systems run,
every result is checked, and the report is written; plus its attempt accounting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.local_slurm import missing  # noqa: E402
from benchmarks.walltime_fit import (  # noqa: E402
    attempts,
    dask_lifetime,
    fit_task,
    job_ids,
    walltime_killed,
)


def test_attempts_count_started_finished_and_wasted(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "11")
    runs = tmp_path / "attempts"
    runs.mkdir()
    assert fit_task(3, 0.05, str(runs)) == 9
    assert fit_task(3, 0.05, str(runs)) == 9  # recomputed (its result was lost)
    now = time.time()
    for name, job in (("4-deadbeef.run", "12"), ("5-deadbeef.run", "13")):  # unfinished
        (runs / name).write_text(f"{now - 30} {job}\n")
        os.utime(runs / name, (now - 10, now - 10))  # last touched 10 s ago
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "shoal-worker-11.out").write_text("")
    (logs / "shoal-worker-12.out").write_text(
        "slurmstepd: *** JOB 12 CANCELLED AT x DUE TO TIME LIMIT ***"
    )
    (logs / "dask-worker-13.err").write_text("")
    (logs / "dask-worker-13.out").write_text("")
    (logs / "x.txt").write_text("")
    assert job_ids(logs) == {"11", "12", "13"}
    assert walltime_killed(logs) == {"12"}
    counted = attempts(runs, walltime_killed(logs))
    assert (counted.started, counted.finished, counted.by_walltime) == (4, 2, 1)
    assert counted.recomputed == 1
    assert 39.9 < counted.wasted < 41  # two unfinished of 20 s, and one recomputation
    assert dask_lifetime(3600) == ("3300s", "240s")


@pytest.mark.timeout(300)
def test_tiny_run_on_slurm(tmp_path):
    reason = missing()
    if reason:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the SLURM benchmark test, but {reason}")
        pytest.skip(reason)
    out = tmp_path / "report.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "walltime_fit.py"), "--tiny", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.read_text()
    for system in ("shoal", "dask"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {system} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "6/6"  # every result correct
        started, finished = (int(x) for x in cells[3].split(" / "))
        assert started >= finished == 6
        assert cells[4] == "0"  # no attempt killed by the walltime (no job ran that long)
        assert int(cells[8].split()[0]) >= 2  # jobs submitted: at least minimum_jobs
    assert "ERROR" not in report
