"""Durations and task budgets as users write them: ``"4h"``, ``"30s"``, ``"200ms"``,
or a number of seconds (as Dask). Pure (no clock), so the client, the CLI, deployments
and the scheduler core share one parser; a bad value is a ValueError naming the option.
"""

from __future__ import annotations

import math
import re
from typing import Any

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_duration(value: Any, option: str, allow_zero: bool = False) -> float:
    """Seconds from ``value``: a number of seconds, or a string such as ``"5s"``,
    ``"200ms"``, ``"1m"``, ``"1.5h"``. Anything else, or a duration that is not > 0
    (>= 0 with ``allow_zero``), is a ValueError naming ``option``."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value.lower())
        if match and match.group(2) in ("", *_UNITS):
            seconds = float(match.group(1)) * _UNITS.get(match.group(2), 1.0)
    if (
        seconds is None
        or not math.isfinite(seconds)
        or seconds < 0
        or (seconds == 0 and not allow_zero)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(
            f"{option} must be a duration {bound} such as '5s', '200ms', '1m' or '4h' "
            f"(or a number of seconds), not {value!r}"
        )
    return seconds


def parse_task_budget(value: Any, option: str) -> int:
    """A number of tasks >= 1 (an int, or a str of one); else a ValueError naming ``option``."""
    n: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value.strip())
    if n is None or n < 1:
        raise ValueError(f"{option} must be a whole number of tasks >= 1, not {value!r}")
    return n
