"""Dask's example notebooks (dask/dask-examples) run on shoal with only their import line
changed, and show what they show on Dask distributed.

Each notebook is a script of its code cells (``scripts/``), run in a subprocess by
``run_notebook.py`` in a fresh directory, with ``from dask.distributed import`` turned
into ``from shoal import``. What its cells showed is compared with what they showed on
Dask distributed (``expected/<notebook>.json``, written by ``record_expected.py`` with
the same seeds): exactly (floats to a relative 1e-9) for notebooks whose data the
seeds fix, by structure for the two whose data is random on every run whatever the
scheduler (mimesis records; ``random`` drawn in worker threads), plus what those
notebooks promise (10,000 records; every processed item in [1, 2)).

Notebooks whose tasks sleep to simulate work run with those sleeps scaled down (a
``sitecustomize`` in ``site/`` scales ``time.sleep`` calls made from the script's own
code only), so that all of them fit in about two minutes on a 2-core CI machine.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from outputs import differences, digests

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@dataclass(frozen=True)
class Notebook:
    sleep_scale: float = 1.0  # of the time.sleep calls in the notebook's own code
    loose: bool = False  # compare structure only (the data is random on every run)
    timeout: float = 240.0


NOTEBOOKS = {
    "array": Notebook(),
    "bag": Notebook(loose=True),
    "dataframe": Notebook(),
    "data_access": Notebook(),
    "xarray_nb": Notebook(),
    "delayed": Notebook(sleep_scale=0.02),
    "futures": Notebook(sleep_scale=0.02),
    "resilience": Notebook(),  # workers are killed every 3 s while it computes: real time
    "evolving": Notebook(sleep_scale=0.02, loose=True),
    "embarrassingly_parallel": Notebook(sleep_scale=0.02),
}


def run_notebook(name: str, flavour: str, directory: Path) -> dict:
    """Run ``scripts/<name>.py`` with ``flavour`` ("shoal" or "dask") in
    ``directory``; what ``run_notebook.py`` saved."""
    spec = NOTEBOOKS[name]
    script = str(HERE / "scripts" / f"{name}.py")
    out = directory / "outputs.pkl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE / "site")]),
        "NOTEBOOK_SCRIPT": script,
        "NOTEBOOK_SLEEP_SCALE": str(spec.sleep_scale),
        "MPLBACKEND": "Agg",
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "run_notebook.py"), script, flavour, str(out)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=spec.timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"notebook {name} failed on {flavour} ({proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    with open(out, "rb") as f:
        result = pickle.load(f)
    result["stderr"] = proc.stderr
    return result


def expected(name: str) -> dict:
    with open(HERE / "expected" / f"{name}.json") as f:
        return json.load(f)


@pytest.mark.notebooks
@pytest.mark.timeout(300)  # the subprocess's own limit is 240 s
@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebook_on_shoal_shows_what_it_shows_on_dask(name: str, tmp_path: Path) -> None:
    spec = NOTEBOOKS[name]
    result = run_notebook(name, "shoal", tmp_path)
    # dask collections computed on shoal's client, not on a local scheduler
    assert result["scheduler"].startswith("shoal."), result["scheduler"]
    got = digests(result["outputs"], spec.loose)
    want = expected(name)
    assert got.keys() == want["outputs"].keys(), "cells with an output differ"
    assert differences(want["outputs"], got) == []
    # A normal run says nothing alarming: no traceback, no lost scheduler.
    assert "Traceback" not in result["stderr"], result["stderr"][-3000:]
    assert "lost the scheduler" not in result["stderr"], result["stderr"][-3000:]
    check = CHECKS.get(name)
    if check is not None:
        check(result["outputs"])


def _bag(outputs: dict) -> None:
    counts = [v for v in outputs.values() if isinstance(v, int) and not isinstance(v, bool)]
    assert counts == [10_000]  # b.count().compute()
    top = [
        v
        for v in outputs.values()
        if isinstance(v, list) and len(v) == 10 and all(isinstance(x, tuple) for x in v)
    ]
    assert len(top) == 1, "topk(10) result missing"
    frequencies = [n for _, n in top[0]]
    assert frequencies == sorted(frequencies, reverse=True)


def _evolving(outputs: dict) -> None:
    lists = [v for v in outputs.values() if isinstance(v, list) and v and isinstance(v[0], float)]
    assert len(lists) == 2  # as_completed, and client.sync(run_all)
    for values in lists:
        assert all(1.0 <= x < 2.0 for x in values)


def _resilience(outputs: dict) -> None:
    printed = "".join(v for k, v in outputs.items() if str(k).endswith(":stdout"))
    assert "on cluster: 159600\t(should be 159600)" in printed


CHECKS = {"bag": _bag, "evolving": _evolving, "resilience": _resilience}
