"""The task stream as Dask's client gives it: ``client.get_task_stream()`` and the
``get_task_stream()`` context manager (the executions that finished inside a block).

The scheduler keeps the last 100,000 executions in a ring numbered by a cursor
(``core/scheduler/task_stream.py``); a block records the cursor at entry and asks for
what came after it at exit, so it gets exactly its own records however long the ring.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from shoal._durations import parse_duration
from shoal.comm.connection import Connection
from shoal.protocol import messages as m

T = TypeVar("T")

_STATUS = {"memory": "OK", "erred": "error"}  # Dask's words


def record_dict(r: m.TaskStreamRecord) -> dict[str, Any]:
    """One execution in Dask's shape (plus its prefix and group)."""
    return {
        "key": r.key,
        "worker": r.worker,
        "status": _STATUS.get(r.status, r.status),
        "nbytes": r.nbytes,
        "startstops": [{"action": "compute", "start": r.start, "stop": r.stop}],
        "prefix": r.prefix,
        "group": r.group,
    }


def _moment(value: float | str | None, now: float) -> float | None:
    """A time (seconds since the epoch), or how long ago as a string ("10s", "5m")."""
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return now - parse_duration(value, "a task stream time", allow_zero=True)
    raise TypeError(f"a task stream time is seconds since the epoch or '10s' ago, not {value!r}")


def select(
    records: list[dict[str, Any]],
    start: float | str | None = None,
    stop: float | str | None = None,
    count: int | None = None,
) -> list[dict[str, Any]]:
    """Dask's selection: the records that started in [start, stop) (times, or strings
    meaning that long ago: "10s", "5m"); ``count``: at most that many, the newest (or,
    with only ``start``, the first after it)."""
    if count is not None and count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    now = time.time()
    begin, end = _moment(start, now), _moment(stop, now)
    chosen = [
        r
        for r in records
        if (begin is None or r["startstops"][0]["start"] >= begin)
        and (end is None or r["startstops"][0]["start"] < end)
    ]
    if count == 0:
        return []
    if count is not None:  # the first after a start alone, else the newest
        chosen = chosen[:count] if begin is not None and end is None else chosen[-count:]
    return chosen


class TaskStreamMixin:
    """``get_task_stream`` of :class:`~shoal.client.client.Client`."""

    asynchronous: bool
    timeout: float
    _conn: Connection | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    async def _task_stream_since(
        self, cursor: int, limit: int | None = None
    ) -> tuple[int, list[m.TaskStreamRecord]]:
        """The records after ``cursor`` (at most ``limit``, the newest) and the cursor
        to ask from next time; ``limit=0``: only the cursor (the start of a block)."""
        conn = self._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        reply, _ = await conn.request(
            lambda rid: m.TaskStreamRequest(rid, cursor, limit), timeout=self.timeout
        )
        assert isinstance(reply, m.TaskStreamReply)
        return reply.cursor, reply.records

    def get_task_stream(
        self,
        start: float | str | None = None,
        stop: float | str | None = None,
        count: int | None = None,
    ) -> Any:
        """The executions the scheduler recorded (its last 100,000), oldest first, as
        Dask's: dicts with ``key``, ``worker``, ``status`` ("OK" / "error"),
        ``nbytes`` and ``startstops`` (``[{"action": "compute", "start", "stop"}]``,
        seconds since the epoch on the worker's clock), plus ``prefix`` and ``group``.
        ``start`` / ``stop``: those that started in that span (times, or strings such
        as ``"10s"``: that long ago); ``count``: at most that many, the newest."""
        # checked here, in the caller's thread: a bad argument is the caller's error
        select([], start, stop, count)

        async def stream() -> list[dict[str, Any]]:
            _, records = await self._task_stream_since(0)
            return select([record_dict(r) for r in records], start, stop, count)

        return stream() if self.asynchronous else self._sync(stream())


class get_task_stream:  # noqa: N801  (Dask's name: used as a function in a with statement)
    """Collect the executions that finish inside a block, as Dask's::

        with get_task_stream() as ts:
            client.map(inc, range(10)).result()
        ts.data  # records, as client.get_task_stream() gives them

    ``client``: the default client if not given. ``async with`` for an asynchronous
    client."""

    def __init__(self, client: Any = None):
        self.client = client
        self.data: list[dict[str, Any]] = []
        self._cursor = 0

    def _client(self) -> Any:
        if self.client is None:
            from shoal.client.client import Client

            self.client = Client.current()
        return self.client

    def __enter__(self) -> get_task_stream:
        client = self._client()
        self._cursor, _ = client._sync(client._task_stream_since(0, 0))
        return self

    def __exit__(self, *exc: Any) -> None:
        client = self._client()
        _, records = client._sync(client._task_stream_since(self._cursor))
        self.data.extend(record_dict(r) for r in records)

    async def __aenter__(self) -> get_task_stream:
        self._cursor, _ = await self._client()._task_stream_since(0, 0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        _, records = await self._client()._task_stream_since(self._cursor)
        self.data.extend(record_dict(r) for r in records)
