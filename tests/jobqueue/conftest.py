"""A real single-node SLURM (``slurm`` fixture) and Grid Engine (``sge``) for the tests
that need them.

Started once per session, stopped at its end whatever happened. Where it cannot run
(not root, slurm-wlm/munge not installed) those tests skip with the reason, except
under ``CI=true``, where the test command installs it: there a missing SLURM fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, Path(__file__).parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from benchmarks.local_slurm import local_slurm, missing  # noqa: E402


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    reason = missing()
    if reason:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the SLURM tests, but {reason}")
        pytest.skip(reason)
    with local_slurm(tmp_path_factory.mktemp("slurm")) as env:
        yield env


@pytest.fixture
def no_jobs_left(slurm: dict[str, str]) -> Iterator[None]:
    """After the test: no job of ours is left in the queue."""
    yield
    out = subprocess.run(
        ["squeue", "--noheader", "--format", "%i %T"], capture_output=True, text=True, timeout=10
    ).stdout
    if out.strip():
        subprocess.run(["scancel", "--user", "root"], capture_output=True, timeout=10)
        pytest.fail(f"jobs left in the queue: {out.strip()}")


@pytest.fixture(scope="session")
def sge() -> Iterator[dict[str, str]]:
    """A real single-node Grid Engine (see ``local_sge.py``)."""
    from local_sge import local_sge
    from local_sge import missing as sge_missing

    reason = sge_missing()
    if reason:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the Grid Engine tests, but {reason}")
        pytest.skip(reason)
    with local_sge() as info:
        yield info
