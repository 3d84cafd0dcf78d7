"""The scheduler's part of the shuffle is as pure as shoal/core, which it extends: no
asyncio, sockets, threads, clocks or config (checked as tests/test_layering.py does)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import shoal

SHUFFLE = Path(shoal.__file__).resolve().parent / "shuffle"
_spec = importlib.util.spec_from_file_location(
    "shoal_layering_test", Path(__file__).resolve().parent.parent / "test_layering.py"
)
assert _spec is not None and _spec.loader is not None
layering = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layering)


@pytest.mark.parametrize("name", ["_scheduler", "_plan"])
def test_the_scheduler_side_is_pure(name):
    path = SHUFFLE / f"{name}.py"
    assert layering.violations(path.read_text(), f"shoal.shuffle.{name}") == []
