"""What changed between two pushes, as the pages apply it (pure functions).

A page receives one full snapshot when it subscribes, then deltas: the rows that
changed (replaced whole, by name) and the names of those removed. Each delta is
computed and encoded once per tick, whatever the number of pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.protocol import messages as m


def prefix_row(p: m.PrefixCounts) -> dict[str, Any]:
    return {
        "name": p.name,
        "states": p.states,
        "nbytes": p.nbytes,
        "duration_sum": p.duration_sum,
        "duration_count": p.duration_count,
    }


def summary_dict(s: m.ClusterState) -> dict[str, Any]:
    """A full summary as a page reads it (``base`` -1)."""
    return {
        "version": s.version,
        "base": -1,
        "workers": s.workers,
        "nthreads": s.nthreads,
        "memory_limit": s.memory_limit,
        "nbytes": s.nbytes,
        "paused": s.paused,
        "tasks": s.tasks,
        "prefixes": [prefix_row(p) for p in s.prefixes],
        "removed": [],
    }


def summary_delta(before: m.ClusterState, now: m.ClusterState) -> dict[str, Any]:
    """``now`` as a delta on ``before``: the totals, the prefixes whose counters moved,
    and those gone. O(prefixes)."""
    old = {p.name: p for p in before.prefixes}
    current = {p.name for p in now.prefixes}
    out = summary_dict(now)
    out["base"] = before.version
    out["prefixes"] = [prefix_row(p) for p in now.prefixes if old.get(p.name) != p]
    out["removed"] = [name for name in old if name not in current]
    return out


def rows_delta(
    before: Mapping[str, Any], now: Mapping[str, Any]
) -> tuple[list[Any], list[str]] | None:
    """(rows of ``now`` new or changed, names gone), or None when nothing changed."""
    changed = [row for name, row in now.items() if before.get(name) != row]
    removed = [name for name in before if name not in now]
    if not changed and not removed:
        return None
    return changed, removed


def apply_rows(
    rows: dict[str, Any], changed: list[dict[str, Any]], removed: list[str], key: str
) -> None:
    """What a page does with a rows delta (used by tests to check the round trip)."""
    for name in removed:
        rows.pop(name, None)
    for row in changed:
        rows[row[key]] = row


def apply_summary(state: dict[str, Any] | None, delta: dict[str, Any]) -> dict[str, Any]:
    """What a page does with a summary push: a full one replaces its state; a delta
    must build on the version it holds (else it raises: the page re-subscribes)."""
    if delta["base"] == -1:
        out = dict(delta)
        out["prefixes"] = {p["name"]: p for p in delta["prefixes"]}
        return out
    if state is None or state["version"] != delta["base"]:
        raise ValueError(
            f"a delta on version {delta['base']} cannot apply to "
            f"{None if state is None else state['version']}"
        )
    prefixes = dict(state["prefixes"])
    for name in delta["removed"]:
        prefixes.pop(name, None)
    for p in delta["prefixes"]:
        prefixes[p["name"]] = p
    out = dict(delta)
    out["prefixes"] = prefixes
    return out
