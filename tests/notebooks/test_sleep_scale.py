"""The notebook tests' ``sitecustomize`` (``site/``) scales the sleeps of the notebook's
own functions wherever they run: in the client, and in a worker that received them
from cloudpickle (which renames their code's file to ``<dynamic-code>``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

# Run with the notebook test's environment: defines a function in a "script" the way
# run_notebook.py runs one (exec with __file__ set), sends it through cloudpickle as a
# worker gets it, and prints what each call asked the real time.sleep for.
PROBE = """
import sys, time
import cloudpickle
import sitecustomize

asked = []
sitecustomize._sleep = asked.append  # record instead of sleeping
namespace = {"__name__": "__main__", "__file__": sys.argv[1]}
exec(compile("import time\\ndef work():\\n    time.sleep(2.0)\\n", sys.argv[1], "exec"), namespace)
namespace["work"]()
shipped = cloudpickle.loads(cloudpickle.dumps(namespace["work"]))
assert shipped.__code__.co_filename != sys.argv[1]  # as a worker sees it
shipped()
time.sleep(3.0)  # not the script's code: untouched
print(asked)
"""


def test_the_scripts_sleeps_are_scaled_in_the_client_and_in_a_worker(tmp_path: Path) -> None:
    script = str(tmp_path / "notebook.py")
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE / "site"),
        "NOTEBOOK_SCRIPT": script,
        "NOTEBOOK_SLEEP_SCALE": "0.25",
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[0.5,", "0.5,", "3.0]"]
