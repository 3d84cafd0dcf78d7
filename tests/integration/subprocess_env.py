"""The environment for processes the tests start, in a module of its own: test modules
import it by this unique name, where ``from conftest import ...`` could find another
directory's conftest (in a worker process importing a test module for its task functions)."""

from __future__ import annotations

import os
import sys


def child_env() -> dict[str, str]:
    """The environment for processes we start: they can import the test modules."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
    return env
