"""Placement options of tasks (``workers=``, ``allow_other_workers=``, ``resources=``),
checked on the client with Dask's rules, so that a mistake fails the call rather than
the connection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shoal._durations import parse_duration
from shoal.protocol import messages as m


def task_restrictions(
    workers: Any, allow_other_workers: Any, resources: Any
) -> m.TaskRestrictions | None:
    """The wire form of submit's placement options (None: run anywhere), checked here so
    that a mistake fails the call, with Dask's rules, rather than the connection."""
    if allow_other_workers not in (True, False):
        raise TypeError(f"allow_other_workers= must be True or False, not {allow_other_workers!r}")
    if allow_other_workers and workers is None:
        raise ValueError("allow_other_workers= only makes sense with workers=")
    names: list[str] = []
    if workers is not None:
        # a worker's name may be given as a number: names are strings on the wire
        items = [workers] if isinstance(workers, str | int) else workers
        if not isinstance(items, Iterable) or isinstance(items, bytes | dict):
            raise TypeError(
                f"workers= takes an address, name or host, or a list of them: {workers!r}"
            )
        for w in items:
            if isinstance(w, bool) or not isinstance(w, str | int):
                raise TypeError(f"workers= takes addresses, names or hosts, not {w!r}")
            names.append(str(w))
        if not names:
            raise ValueError("workers= names no worker")
    if resources is not None and not isinstance(resources, dict):
        raise TypeError(f"resources= takes a dict such as {{'GPU': 1}}, not {resources!r}")
    amounts = m.check_resources(resources or {})
    if not names and not amounts:
        return None
    return m.TaskRestrictions(names, bool(allow_other_workers), amounts)


def duration_hint(duration: Any, option: str = "duration=") -> float | None:
    """The wire form of ``duration=`` (``"4h"``, ``"30s"``, ``"200ms"`` or seconds):
    seconds, or None when not given; a negative or unparsable value is a ValueError
    naming the option, raised by the call."""
    if duration is None:
        return None
    return parse_duration(duration, option, allow_zero=True)
