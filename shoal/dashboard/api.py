"""The JSON API's answers (``/api/v1/...``), built from what the scheduler keeps as
events happen: each costs O(what it returns), never O(all tasks) (a task's story
scans the bounded story log, as Dask's ``story`` does). Plain dicts and lists, encoded
by the app with msgspec. No web framework here: the app maps routes to these.
"""

from __future__ import annotations

import ast
import contextlib
import time
from typing import TYPE_CHECKING, Any

from shoal.dashboard.deltas import prefix_row, summary_dict
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.core.scheduler.model import TaskState
    from shoal.server.scheduler import Scheduler

MAX_PAGE = 1000  # rows per page at most
MAX_DEPENDENCIES = 100  # of a task's dependencies and dependents listed on its page


class NotFound(LookupError):
    """Nothing by that name (the app answers 404 with the message)."""


class BadRequest(ValueError):
    """A parameter that makes no sense (the app answers 400 with the message)."""


def int_param(
    query: dict[str, str], name: str, default: int, low: int = 0, high: int = 2**31
) -> int:
    text = query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"parameter {name!r} must be an integer, not {text!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"parameter {name!r} must be between {low} and {high}, not {value}")
    return value


def key_text(key: m.Key) -> str:
    """A key as pages show it and as ``/api/v1/tasks/{key}`` takes it back."""
    return key if type(key) is str else repr(key)


def parse_key(text: str) -> list[Any]:
    """The keys ``text`` may name: itself, and the tuple or number it spells."""
    out: list[Any] = [text]
    if text[:1] in "(-0123456789":
        with contextlib.suppress(ValueError, SyntaxError, MemoryError, RecursionError):
            out.append(ast.literal_eval(text))
    return out


def summary(s: Scheduler) -> dict[str, Any]:
    out = summary_dict(s.state.summary())
    out["scheduler"] = {"id": s.id, "address": s.address}
    out["tasks_total"] = len(s.state.tasks)
    return out


def worker_row(w: m.WorkerInfo) -> dict[str, Any]:
    return {
        "address": w.address,
        "name": w.name,
        "host": w.host,
        "nthreads": w.nthreads,
        "memory_limit": w.memory_limit,
        "processing": w.processing,
        "nbytes": w.nbytes,
        "tasks_run": w.tasks_run,
        "resources": w.resources,
        "pid": w.pid,
        "status": w.status,
        "memory": w.memory,
        "spilled": w.spilled,
        "cpu": w.cpu,
        "net_in": w.net_in,
        "net_out": w.net_out,
        "memory_pause": w.memory_pause,
        "memory_terminate": w.memory_terminate,
        "pins": [{"id": p.id, "reason": p.reason, "owner": p.owner} for p in w.pins],
        "lifetime_left": w.lifetime_left,
        "tasks_left": w.tasks_left,
    }


def workers(s: Scheduler, query: dict[str, str]) -> dict[str, Any]:
    start = int_param(query, "start", 0)
    limit = int_param(query, "limit", 100, 1, MAX_PAGE)
    total = len(s.state.workers)
    rows = [worker_row(w) for w in s.state.worker_infos(min(start, total), limit)]
    return {"total": total, "start": start, "workers": rows}


def worker(s: Scheduler, address: str) -> dict[str, Any]:
    info = s.state.worker_info(address)
    if info is None:
        raise NotFound(f"no worker {address!r} (gone, or never joined)")
    ws = s.state.workers[address]
    now = time.monotonic()  # the history's clock: heartbeats are stamped with it
    out = worker_row(info)
    out["history"] = [
        {"ago": round(now - t, 3), "memory": memory, "cpu": cpu, "spilled": spilled}
        for t, memory, cpu, spilled in ws.history
    ]
    return out


def prefixes(s: Scheduler, query: dict[str, str]) -> dict[str, Any]:
    """The prefixes with tasks alive, newest first, a page of them."""
    start = int_param(query, "start", 0)
    limit = int_param(query, "limit", 100, 1, MAX_PAGE)
    alive = [p for p in reversed(s.state.summary().prefixes)]
    return {
        "total": len(alive),
        "start": start,
        "prefixes": [prefix_row(p) for p in alive[start : start + limit]],
    }


def groups(s: Scheduler, query: dict[str, str]) -> dict[str, Any]:
    start = int_param(query, "start", 0)
    limit = int_param(query, "limit", 100, 1, MAX_PAGE)
    prefix = query.get("prefix", "")
    rows, total = s.state.task_groups(prefix, limit, start)
    return {
        "total": total,
        "start": start,
        "prefix": prefix,
        "groups": [prefix_row(g) for g in rows],
    }


def _first_keys(tasks: Any) -> dict[str, Any]:
    listed = []
    for i, dts in enumerate(tasks):
        if i == MAX_DEPENDENCIES:
            break
        listed.append({"key": key_text(dts.key), "state": dts.state})
    return {"count": len(tasks), "tasks": listed}


def task(s: Scheduler, text: str) -> dict[str, Any]:
    ts: TaskState | None = None
    for key in parse_key(text):
        try:
            ts = s.state.tasks.get(key)
        except TypeError:  # an unhashable literal
            continue
        if ts is not None:
            break
    if ts is None:
        raise NotFound(f"no task {text!r} (never submitted, or forgotten)")
    traceback = ts.traceback or ""
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    story = []
    for entry in s.state.story(ts.key)[-200:]:
        story.append([key_text(e) if i == 0 else _plain(e) for i, e in enumerate(entry)])
    return {
        "key": key_text(ts.key),
        "state": ts.state,
        "prefix": ts.prefix.name,
        "group": str(ts.group.name),
        "nbytes": ts.nbytes,
        "type": ts.type_name,
        "retries": ts.retries,
        "priority": list(ts.priority),
        "who_has": [ws.address for ws in ts.who_has],
        "processing_on": None if ts.processing_on is None else ts.processing_on.address,
        "who_wants": [cs.id for cs in ts.who_wants],
        "dependencies": _first_keys(ts.dependencies),
        "dependents": _first_keys(ts.dependents),
        "error": lines[-1] if ts.state == "erred" and lines else None,
        "blamed": None if ts.exception_blame is None else key_text(ts.exception_blame.key),
        "traceback": traceback if ts.state == "erred" else None,
        "story": story,
    }


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def events(s: Scheduler, query: dict[str, str]) -> dict[str, Any]:
    topic = query.get("topic") or None
    limit = int_param(query, "limit", 200, 1, 10_000)
    found = s.state.get_events(topic)
    out: dict[str, Any] = {}
    for name, evs in found.items():
        out[name] = [{"time": t, "data": data} for t, data in evs[-limit:]][::-1]
    return {"topics": sorted(s.state.events.topics), "events": out}


def stream_record(r: m.TaskStreamRecord, lane: int | None = None) -> dict[str, Any]:
    out = {
        "key": key_text(r.key),
        "prefix": r.prefix,
        "group": str(r.group),
        "worker": r.worker,
        "start": r.start,
        "stop": r.stop,
        "status": r.status,
        "nbytes": r.nbytes,
    }
    if lane is not None:
        out["lane"] = lane
    return out


def task_stream(s: Scheduler, query: dict[str, str]) -> dict[str, Any]:
    cursor = int_param(query, "cursor", 0, 0, 2**62)
    limit = int_param(query, "limit", 1000, 1, 100_000)
    cursor, records = s.state.task_stream.since(cursor, limit)
    return {"cursor": cursor, "records": [stream_record(r) for r in records]}


def system(s: Scheduler, query: dict[str, str]) -> dict[str, Any]:
    monitor = s.monitor
    if monitor is None:
        raise NotFound("this scheduler runs no monitor")
    return {"latest": monitor.latest(), "history": list(monitor.history)}
