"""Sizes of the slow scenarios: a small one that CI runs (the default) and a larger one
to run yourself with ``SHOAL_TEST_SIZE=full`` (README, "Testing").

Both sizes run the same assertions; the larger one only tries more cases (property
tests' examples, hash seeds), so a rare case the CI size misses is found locally."""

from __future__ import annotations

import os

FULL = os.environ.get("SHOAL_TEST_SIZE", "ci") == "full"


def sized(ci: int, full: int) -> int:
    """``ci`` in CI (the default), ``full`` under ``SHOAL_TEST_SIZE=full``."""
    return full if FULL else ci
