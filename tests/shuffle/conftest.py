"""tests/shuffle: core tests use tests/core's harness; integration tests run under
tests/integration's leak check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS / "core"))  # scheduler_harness
sys.path.insert(0, str(TESTS / "integration"))  # subprocess_env, for its conftest

_spec = importlib.util.spec_from_file_location(
    "shoal_integration_conftest", TESTS / "integration" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_integration = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_integration)
check_leaks = _integration.check_leaks  # autouse there, and so here
cluster = _integration.cluster  # two single-threaded workers, per module
client = _integration.client
