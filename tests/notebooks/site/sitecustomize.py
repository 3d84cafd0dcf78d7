"""Loaded by every Python process the notebook tests start (this directory is put on
PYTHONPATH): with NOTEBOOK_SCRIPT and NOTEBOOK_SLEEP_SCALE set, ``time.sleep`` called
from that script's own code (the notebook's simulated work, in the client or in a
worker running its functions) sleeps that fraction of the time, so that the notebooks
fit the CI budget unchanged. Other callers' sleeps are untouched.

The script's code is recognised by its globals' ``__file__`` (run_notebook.py runs it
with ``__file__`` set to the script): in a worker, a function cloudpickle sent by value
has ``<dynamic-code>`` as its code's file name, but keeps its module's ``__file__``."""

import os
import sys
import time

_script = os.environ.get("NOTEBOOK_SCRIPT")
_scale = float(os.environ.get("NOTEBOOK_SLEEP_SCALE", "1") or 1)

if _script and _scale != 1:
    _sleep = time.sleep

    def _scaled_sleep(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__file__") == _script:
            seconds = seconds * _scale
        _sleep(seconds)

    time.sleep = _scaled_sleep
