"""Running a benchmark script as a user would, from the benchmark smoke tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> *args`` from the repository root, with the root
    importable; fails the test (with the script's stderr) if it runs past ``timeout``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the benchmark stops its clusters on the way out
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=20)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{script} did not finish within {timeout:g} s\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
