"""Queries and replies: what a client (or the dashboard) asks the scheduler about the
cluster: who_has, workers' info, task groups, progress, pushed cluster summaries,
the event log, the task stream and has_what.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shoal.protocol.message_families.base import (
    Key,
    Message,
)
from shoal.protocol.message_families.elastic import PinInfo

# --- client -> scheduler -------------------------------------------------------------


class WhoHasRequest(Message):
    request_id: int
    keys: list[Key]


class InfoRequest(Message):
    """The scheduler's identity, its summary and a page of its workers (all of them by
    default: ``limit`` -1)."""

    request_id: int
    start: int = 0
    limit: int = -1


# --- scheduler -> client -------------------------------------------------------------


class WhoHasReply(Message):
    request_id: int
    who_has: list[tuple[Key, list[str]]]


class WorkerInfo(msgspec.Struct, array_like=True, gc=False):
    address: str
    name: str
    host: str
    nthreads: int
    memory_limit: int
    processing: int
    nbytes: int
    tasks_run: int
    resources: dict[str, float] = {}
    pid: int = 0
    status: str = "running"  # "running" | "paused" | "retiring"
    memory: int = 0  # process memory at the last heartbeat
    pins: list[PinInfo] = []  # the pins holding it
    lifetime_left: float | None = None  # seconds to its deadline (None: no lifetime)
    tasks_left: int | None = None  # tasks it may still be given (None: no budget)
    http_address: str = ""  # its HTTP port, e.g. "http://10.0.0.5:40123" ("": none)
    transferred_in: int = 0  # bytes of dependencies it fetched from peers, in all
    transferred_out: int = 0  # bytes it sent to peers that fetched from it, in all
    # Telemetry from its last heartbeat, for the dashboard.
    spilled: int = 0  # bytes of results spilled to disk
    cpu: float = 0.0  # process CPU, percent of one core
    net_in: float = 0.0  # host network bytes/s received
    net_out: float = 0.0  # host network bytes/s sent
    memory_pause: float | None = None  # fractions of memory_limit (None: off)
    memory_terminate: float | None = None


class InfoReply(Message):
    request_id: int
    scheduler_id: str
    address: str
    workers: list[WorkerInfo]  # the page asked for
    tasks: int
    summary: ClusterState | None = None


class PrefixCounts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """One task prefix's counters (e.g. every ``inc``): tasks per state, bytes held,
    and the durations measured."""

    name: str
    states: dict[str, int]
    nbytes: int = 0
    duration_sum: float = 0.0
    duration_count: int = 0


class GroupsRequest(Message):
    """Client -> scheduler: the counters of the newest ``limit`` task groups (of one
    prefix, if given): the answer costs O(limit), however many groups there are."""

    request_id: int
    prefix: str = ""
    limit: int = 100


class GroupsReply(Message):
    request_id: int
    groups: list[PrefixCounts]  # newest first
    total: int  # groups alive (of the prefix, if one was asked for)


class WatchProgress(Message):
    """Client -> scheduler: count, per prefix, the tasks these keys need until every
    one is done; the counts come back as :class:`ProgressCounts` when they change."""

    watch_id: int
    keys: list[Key]
    stimulus_id: str = ""


class StopProgress(Message):
    watch_id: int
    stimulus_id: str = ""


class PrefixProgress(msgspec.Struct, array_like=True, gc=False):
    name: str
    total: int
    memory: int  # done: reached memory (they count as done after being released)
    erred: int


class ProgressCounts(Message):
    """Scheduler -> the watching client, at most once an interval while they change."""

    watch_id: int
    prefixes: list[PrefixProgress]
    forgotten: int = 0  # tasks forgotten before they finished (cancelled, released)
    finished: bool = False  # nothing left to wait for: the last message of this watch


class ClusterState(Message):
    """Scheduler -> subscribed clients, when it changed (at most once an interval): the
    cluster in numbers kept up to date as events happen, never the list of workers."""

    version: int
    workers: int
    nthreads: int
    memory_limit: int
    nbytes: int  # results held by workers
    paused: int  # workers paused or retiring
    tasks: dict[str, int]  # per state
    prefixes: list[PrefixCounts] = []
    # A delta, pushed to subscribers: ``prefixes`` lists only those that changed since
    # the summary of version ``base`` (the previous push), ``removed`` those now gone.
    base: int = -1  # -1: a full summary
    removed: list[str] = []


# --- the task stream and the event log -----------------------------------------------


class TaskStreamRecord(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """One finished execution of a task (see ``core/scheduler/task_stream.py``).
    ``start``/``stop`` are the worker's wall clock (seconds since the epoch)."""

    key: Key
    prefix: str
    group: str
    worker: str
    start: float
    stop: float
    status: str  # "memory" or "erred"
    nbytes: int = 0


class TaskStreamRequest(Message):
    """Client -> scheduler: the task stream records after ``cursor`` (0: all kept), at
    most ``limit`` of them (the newest)."""

    request_id: int
    cursor: int = 0
    limit: int | None = None


class TaskStreamReply(Message):
    request_id: int
    cursor: int  # to ask from next time
    records: list[TaskStreamRecord] = []


class EventsRequest(Message):
    """Client -> scheduler: the structured events of ``topic``, or of every topic."""

    request_id: int
    topic: str | None = None


class EventsReply(Message):
    request_id: int
    events: dict[str, list[tuple[float, dict[str, Any]]]]  # topic -> (timestamp, data)


# --- has_what ------------------------------------------------------------------------


class HasWhatRequest(Message):
    """Client -> scheduler (``client.has_what``): a page of the keys in memory on one
    worker (name or address), every client's; ``limit`` keys from ``start``."""

    request_id: int
    worker: str
    start: int = 0
    limit: int = 100_000


class HasWhatReply(Message):
    """The page asked for; ``total`` keys the worker holds now (pages are read from a
    live set: a key that moves between two pages may be missed or seen twice)."""

    request_id: int
    address: str  # "" when no such worker is connected
    keys: list[Key]
    total: int
