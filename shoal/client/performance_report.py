"""``performance_report``: one HTML file describing the work done inside a block, as
Dask's ``distributed.performance_report``::

    with performance_report(filename="report.html"):
        client.map(inc, range(1000)).result()

At entry it notes the scheduler's task stream cursor and the workers' transfer
totals, and starts sampling worker memory (``scheduler_info``, every ``interval``
seconds, on the client's loop); at exit it takes the executions recorded since the
cursor and writes the report (shoal/dashboard/report_html.py): the task stream,
per-prefix counts and durations, bytes moved between workers, worker memory over
time, the calling code and a cluster summary. Nothing runs on the scheduler for it
but three kinds of cheap queries.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import inspect
import time
from types import FrameType
from typing import Any

from shoal.protocol import messages as m

DEFAULT_INTERVAL = 0.3  # seconds between two memory samples


class performance_report:  # noqa: N801  (Dask's name)
    """Write an HTML report of the work done in a ``with`` (or ``async with``) block
    to ``filename``. ``client``: the default client if not given; ``stacklevel``: whose
    code to show (1: the block's caller); ``interval``: seconds between memory samples."""

    def __init__(
        self,
        filename: str = "dask-report.html",
        stacklevel: int = 1,
        client: Any = None,
        interval: float = DEFAULT_INTERVAL,
    ):
        if not interval > 0:
            raise ValueError(f"interval must be positive, not {interval}")
        if stacklevel < 1:
            raise ValueError(f"stacklevel must be at least 1, not {stacklevel}")
        self.filename = str(filename)
        self.stacklevel = stacklevel
        self.client = client
        self.interval = interval
        self.code = ""
        self._cursor = 0
        self._start = 0.0
        self._before: dict[str, m.WorkerInfo] = {}  # at entry
        self._latest: dict[str, m.WorkerInfo] = {}  # the newest sample of every worker seen
        self._samples: list[dict[str, Any]] = []
        self._sampler: asyncio.Task[None] | None = None
        self._stopping = False

    # ---------------------------------------------------------------- entry and exit

    def __enter__(self) -> performance_report:
        self.code = _source(inspect.currentframe(), self.stacklevel)
        client = self._client()
        client._sync(self._begin(client))
        return self

    def __exit__(self, *exc: Any) -> None:
        client = self._client()
        client._sync(self._end(client))

    async def __aenter__(self) -> performance_report:
        self.code = _source(inspect.currentframe(), self.stacklevel)
        await self._begin(self._client())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._end(self._client())

    def _client(self) -> Any:
        if self.client is None:
            from shoal.client.client import Client

            self.client = Client.current()
        return self.client

    # ---------------------------------------------------------------- on the client's loop

    async def _begin(self, client: Any) -> None:
        self._cursor, _ = await client._task_stream_since(0, 0)
        self._start = time.time()
        reply = await client._info(0, -1)
        self._before = {w.address: w for w in reply.workers}
        self._sample(reply)
        self._stopping = False
        self._sampler = asyncio.ensure_future(self._sample_memory(client))

    async def _sample_memory(self, client: Any) -> None:
        while not self._stopping:
            await asyncio.sleep(self.interval)
            self._sample(await client._info(0, -1))

    def _sample(self, reply: m.InfoReply) -> None:
        self._latest.update((w.address, w) for w in reply.workers)
        self._samples.append(
            {"time": time.time(), "workers": {w.address: w.memory for w in reply.workers}}
        )

    async def _end(self, client: Any) -> None:
        self._stopping = True
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        from shoal.core.scheduler.membership import heartbeat_interval  # (a large package)

        # Workers report their transfer totals with their heartbeats: wait for one
        # more of each, so that the block's last transfers count.
        await asyncio.sleep(min(2.0, heartbeat_interval(len(self._latest)) + 0.1))
        reply = await client._info(0, -1)
        self._sample(reply)
        cursor, records = await client._task_stream_since(self._cursor)
        report = self._report(reply, records, lost=cursor - self._cursor - len(records))
        from shoal.dashboard.report_html import render_report

        page = render_report(report)
        with open(self.filename, "w", encoding="utf-8") as f:
            f.write(page)

    # ---------------------------------------------------------------- the report's data

    def _report(
        self, reply: m.InfoReply, records: list[m.TaskStreamRecord], lost: int
    ) -> dict[str, Any]:
        stop = time.time()
        prefixes: dict[str, dict[str, Any]] = {}
        for r in records:
            p = prefixes.setdefault(
                r.prefix, {"name": r.prefix, "count": 0, "erred": 0, "total": 0.0, "nbytes": 0}
            )
            p["count"] += 1
            p["erred"] += r.status == "erred"
            p["total"] += max(0.0, r.stop - r.start)
            p["nbytes"] += r.nbytes
        for p in prefixes.values():
            p["mean"] = p["total"] / p["count"]
        workers = reply.workers
        summary = reply.summary
        return {
            "summary": {
                "scheduler": reply.address,
                "workers": len(workers),
                "threads": sum(w.nthreads for w in workers),
                "memory_limit": sum(w.memory_limit for w in workers),
                "tasks_run": len(records),
                "tasks_erred": sum(p["erred"] for p in prefixes.values()),
                "tasks_not_shown": max(0, lost),  # older than the scheduler's ring keeps
                "compute_time": sum(p["total"] for p in prefixes.values()),
                "tasks_now": dict(summary.tasks) if summary is not None else {},
                "start": self._start,
                "stop": stop,
                "duration": stop - self._start,
                "started": datetime.datetime.fromtimestamp(self._start).isoformat(sep=" ")[:19],
                "version": _version(),
            },
            "prefixes": sorted(prefixes.values(), key=lambda p: -p["total"]),
            "records": [
                [str(r.key), r.worker, r.start, r.stop, r.prefix, r.status, r.nbytes]
                for r in records
            ],
            "transfers": self._transfers(),
            "memory": self._samples,
            "code": self.code,
        }

    def _transfers(self) -> list[dict[str, Any]]:
        """Bytes each worker fetched and served during the block (as of its last
        heartbeat: one more is awaited at exit)."""
        out = []
        for address, w in sorted(self._latest.items()):
            before = self._before.get(address)
            out.append(
                {
                    "worker": address,
                    "bytes_in": w.transferred_in - (before.transferred_in if before else 0),
                    "bytes_out": w.transferred_out - (before.transferred_out if before else 0),
                }
            )
        return out


def _source(frame: FrameType | None, stacklevel: int) -> str:
    """The source of the code that opened the block (as Dask's: the calling frame's
    function or module), or "" when there is none (an interactive session)."""
    for _ in range(stacklevel):  # ``frame`` is __enter__'s: 1 is the block's caller
        frame = frame.f_back if frame is not None else None
    if frame is None:
        return ""
    try:
        return inspect.getsource(frame)
    except (OSError, TypeError):
        return ""


def _version() -> str:
    import shoal

    return shoal.__version__
