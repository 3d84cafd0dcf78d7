"""Parsing and checking a job-queue cluster's options (pure: no processes, no I/O).

Walltimes are ``"HH:MM:SS"`` or ``"D-HH:MM:SS"``; memory is bytes or a string such as
``"1GB"``/``"4GiB"``. Every bad value is a ValueError naming the option and the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from shoal._durations import parse_duration
from shoal.server.memory import parse_bytes

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def parse_walltime(value: Any) -> int:
    """Seconds from ``"HH:MM:SS"`` or ``"D-HH:MM:SS"`` (minutes and seconds < 60)."""
    match = _walltime_match(value)
    if match is None:
        raise ValueError(
            f"walltime must be 'HH:MM:SS' or 'D-HH:MM:SS' (e.g. '00:30:00'), not {value!r}"
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    if minutes >= 60 or seconds >= 60:
        raise ValueError(f"walltime {value!r}: minutes and seconds must be below 60")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ValueError(f"walltime must be longer than zero, not {value!r}")
    return total


def _walltime_match(value: Any) -> re.Match[str] | None:
    return _WALLTIME.match(value.strip()) if isinstance(value, str) else None


def format_hms(seconds: int) -> str:
    """``"HH:MM:SS"`` (hours may pass 24), as SGE, PBS and SLURM all read it."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def parse_memory(value: Any) -> int:
    """Bytes from a number or a string such as ``"1GB"``, ``"4GiB"``, ``"2e9"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(parse_bytes(value))
        except ValueError:
            raise ValueError(
                f"memory must be an amount such as '1GB', '4GiB' or '2e9', not {value!r}"
            ) from None
    else:
        raise ValueError(f"memory must be an amount such as '1GB' or '4GiB', not {value!r}")
    if not math.isfinite(number) or number < 1:
        raise ValueError(f"memory must be at least one byte, not {value!r}")
    return int(number)


def positive_int(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{option} must be an integer >= 1, not {value!r}")
    return value


def lines(value: Iterable[str] | None, option: str) -> list[str]:
    """A list of strings (a lone string is a mistake: it would be read letter by letter)."""
    if value is None:
        return []
    if isinstance(value, str):
        raise ValueError(f"{option} must be a list of strings, not the string {value!r}")
    out = list(value)
    for item in out:
        if not isinstance(item, str):
            raise ValueError(f"{option} must be a list of strings, not containing {item!r}")
    return out


def worker_lifetime(walltime: int, margin: Any = None, stagger: Any = None) -> tuple[int, int]:
    """(lifetime, stagger) in seconds for a worker in a job of ``walltime`` seconds.

    A worker leaves (gracefully, its data handed off) at its lifetime, moved by up to
    ``stagger`` either way so that workers started together do not all leave together.
    Even the latest departure, ``lifetime + stagger``, comes ``margin`` before the
    walltime: that margin covers the job's start-up and the hand-off. Defaults: a margin
    of 10% of the walltime (between 10 s and 5 min) and a stagger of 5% (at most 4 min).
    """
    margin_s = (
        min(max(walltime * 0.1, 10.0), 300.0)
        if margin is None
        else parse_duration(margin, "lifetime_margin")
    )
    stagger_s = (
        min(walltime * 0.05, 240.0)
        if stagger is None
        else parse_duration(stagger, "lifetime_stagger", allow_zero=True)
    )
    lifetime = walltime - margin_s - stagger_s
    if lifetime - stagger_s < 1:
        raise ValueError(
            f"walltime {format_hms(walltime)} is too short for a lifetime margin of "
            f"{margin_s:g}s and a stagger of {stagger_s:g}s: a worker would have no time"
        )
    return int(lifetime), int(stagger_s)
