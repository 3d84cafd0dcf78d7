"""Encoding a Delayed compute does not import dask.array: the Blockwise expansion
(``blockwise_expand``) applies to array graphs only, and before dask.array is loaded no
graph can be one. Importing it costs a notebook's first compute ~0.3 s (much more on a
busy machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import sys
import dask
from shoal.client.graph import collections
from specs_client import SpecsClient

cell = dask.delayed(sum)([1, 2, 3])
client = SpecsClient()
collections.submit_graph(client, cell.__dask_graph__(), [cell.key], collections._options({}))
(spec,) = client.specs
assert spec.key == cell.key, spec
print("dask.array" in sys.modules)
"""


def test_a_delayed_compute_does_not_import_dask_array():
    here = Path(__file__).parent  # (specs_client) and the repository's root (shoal)
    path = os.pathsep.join([str(here), str(here.parent.parent)])
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
