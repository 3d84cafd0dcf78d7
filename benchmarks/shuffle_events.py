"""Reading what each system records about its shuffles and its adaptive scaling.

shoal: ``client.get_events(topic)`` returns ``[(timestamp, dict), ...]`` for the topics
"p2p" (a shuffle's start, restart with why, failure, finish with bytes moved and
spilled) and "adaptive" (every decision and its reason). Dask: its scheduler logs
"Shuffle ... restarted" (a warning) for each restart, its "p2p" event topic has
"p2p-failed", and its ``Adaptive.log`` holds every decision that was not "same".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

KIND_FIELDS = ("action", "event", "kind", "type", "status", "what")


def event_kind(event: dict[str, Any]) -> str:
    """start, restart, fail, finish, up, down, or '' for an event dict."""
    for field in KIND_FIELDS:
        value = event.get(field)
        if isinstance(value, str):
            v = value.lower()
            for kind, words in (
                ("restart", ("restart",)),
                ("fail", ("fail", "err")),
                ("finish", ("finish", "done", "complete", "end")),
                ("start", ("start", "begin")),
                ("up", ("up",)),
                ("down", ("down", "retire", "close")),
            ):
                if any(w in v for w in words):
                    return kind
    return ""


def _bytes_fields(event: dict[str, Any], words: tuple[str, ...]) -> float:
    return float(
        sum(
            v
            for k, v in event.items()
            if isinstance(v, int | float)
            and not isinstance(v, bool)
            and any(w in k.lower() for w in words)
        )
    )


def p2p_totals(
    events: Iterable[tuple[float, dict[str, Any]]], since: float = 0.0
) -> dict[str, float]:
    """Counts of start/restart/fail/finish events and bytes moved and spilled (from the
    finish events), over the events at or after ``since``."""
    out: Counter[str] = Counter()
    moved = spilled = 0.0
    for ts, event in events:
        if ts < since or not isinstance(event, dict):
            continue
        kind = event_kind(event)
        out[kind] += 1
        if kind == "finish":
            moved += _bytes_fields(event, ("moved", "sent", "transfer"))
            spilled += _bytes_fields(event, ("spill", "disk"))
    return {
        "started": out["start"],
        "restarted": out["restart"],
        "failed": out["fail"],
        "finished": out["finish"],
        "moved": moved,
        "spilled": spilled,
    }


DASK_RESTART = re.compile(r"Shuffle \S+ restarted")


def dask_restarts(log_lines: Iterable[tuple[str, str]]) -> int:
    """ "Shuffle ... restarted" lines in Dask scheduler logs (``get_scheduler_logs``)."""
    return sum(1 for _, line in log_lines if DASK_RESTART.search(line))


def dask_failures(events: Iterable[tuple[float, dict[str, Any]]]) -> int:
    return sum(1 for _, e in events if isinstance(e, dict) and e.get("action") == "p2p-failed")


def scale_counts(decisions: Iterable[tuple[float, dict[str, Any]]]) -> tuple[int, int]:
    """(scale-ups, scale-downs) in an adaptive log: Dask's ``Adaptive.log`` entries
    ``{"status": "up", "n": N}`` / ``{"status": "down", "workers": [...]}``, or shoal's
    "adaptive" events."""
    kinds = Counter(event_kind(d) for _, d in decisions if isinstance(d, dict))
    return kinds["up"], kinds["down"]
