"""The test groups of ``tests/conftest.py`` hold under ``-n 2 --dist loadgroup`` (as
``scripts/test.sh`` runs the suite): the tests sharing a machine-wide resource run on
one process, one at a time, and so do the tests of a module sharing a module-scoped
fixture (which then starts once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

HERE = Path(__file__).parent

RECORD = """
import os, pytest

def record(name):
    with open(os.path.join(os.environ["GROUPS_OUT"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""

ONE_AT_A_TIME = (
    RECORD
    + """
@pytest.mark.parametrize("i", range(6))
def test_queue(i):
    record(f"queue-{i}")
"""
)

SHARED = (
    RECORD
    + """
@pytest.fixture(scope="module")
def cluster():
    return object()

@pytest.mark.parametrize("i", range(6))
def test_shared(cluster, i):
    record(f"shared-{i}")
"""
)

# The ungrouped tests take a moment each: a process is handed a new test once it has
# two or fewer left, so instant ones all went to whichever process reported first
# (one CI run under load ran all six on one process while the other ran its group).
FREE = (
    RECORD
    + """
import time

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    record(f"free-{i}")
    time.sleep(0.3)
"""
)


def test_groups_run_on_one_process_each(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    (suite / "jobqueue").mkdir(parents=True)
    shutil.copy(HERE / "conftest.py", suite / "conftest.py")
    (suite / "jobqueue" / "test_queue.py").write_text(ONE_AT_A_TIME)
    (suite / "test_shared.py").write_text(SHARED)
    (suite / "test_free.py").write_text(FREE)
    out = tmp_path / "out"
    out.mkdir()
    # not this run's xdist worker, if it is one
    outer_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "loadgroup", str(suite)],
        cwd=tmp_path,
        env={**outer_env, "GROUPS_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran_on = {p.name: p.read_text() for p in out.iterdir()}
    assert len(ran_on) == 18
    for group in ("queue", "shared"):
        workers = {w for name, w in ran_on.items() if name.startswith(group)}
        assert len(workers) == 1, (group, ran_on)
    # the ungrouped tests are spread: the check above would see a split
    assert len({w for name, w in ran_on.items() if name.startswith("free")}) == 2, ran_on
