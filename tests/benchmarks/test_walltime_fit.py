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
from benchmarks.walltime_fit import attempts, dask_lifetime, fit_task, job_ids  # noqa: E402


def test_attempts_count_started_finished_and_wasted(tmp_path):
    assert fit_task(3, 0.05, str(tmp_path)) == 9
    killed = tmp_path / "4-deadbeef.run"  # an attempt that never finished
    killed.write_text(f"{time.time() - 30}\n")
    os.utime(killed, (time.time() - 10, time.time() - 10))  # last touched 10 s ago
    started, finished, wasted = attempts(tmp_path)
    assert (started, finished) == (2, 1)
    assert 19 < wasted < 21
    (tmp_path / "logs").mkdir()
    for name in ("shoal-worker-12.out", "dask-worker-13.err", "dask-worker-13.out", "x.txt"):
        (tmp_path / "logs" / name).write_text("")
    assert job_ids(tmp_path / "logs") == {"12", "13"}
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
        assert int(cells[6]) >= 2  # jobs submitted: at least minimum_jobs
    assert "ERROR" not in report
