"""``scale`` and ``adapt`` for any cluster class: a mixin over a small interface.

A cluster class provides (see :class:`ElasticCluster`):

- ``_start_workers(n)``: start ``n`` new workers, each under a new name;
- ``_worker_names()``: the names of the workers it runs, joined or still starting
  (reaping those whose process has exited);
- ``_stop_workers(names)``: stop these (workers that have not joined yet: the
  scheduler retires joined ones itself, and they exit on their own);
- ``_control_loop()``: the event loop its scheduler connection lives on.

The scheduler decides (``ScaleRequest``: the core counts, picks the workers to close
and retires them); the cluster only starts and stops processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec

from shoal.client.loop import LoopRunner
from shoal.comm.connection import Connection
from shoal.comm.security import Security
from shoal.comm.tcp import connect
from shoal.deploy.adaptive import DEFAULT_TASK_DURATION, Adaptive
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame

logger = logging.getLogger("shoal.deploy")
T = TypeVar("T")
REQUEST_TIMEOUT = 30.0
REAP_INTERVAL = 0.2  # seconds between looks at workers told to go, until they are gone


class ElasticCluster:
    """Mixin: ``scale(n)`` and ``adapt(...)`` over the interface in the module doc."""

    scheduler_address: str
    security: Security
    threads_per_worker: int
    n_workers: int

    # ------------------------------------------------------------ what a cluster provides

    async def _start_workers(self, n: int) -> None:
        raise NotImplementedError

    def _worker_names(self) -> list[str]:
        raise NotImplementedError

    async def _stop_workers(self, names: list[str]) -> None:
        raise NotImplementedError

    def _control_runner(self) -> LoopRunner:
        raise NotImplementedError

    def _replace_ahead(self) -> float:
        """Seconds before a worker's lifetime ends at which its replacement should be
        started (0: when it has gone); a job-queue cluster says its jobs' start-up."""
        return 0.0

    # ------------------------------------------------------------ the public API

    def _init_elastic(self) -> None:
        self._adaptive: Adaptive | None = None
        self._control: Connection | None = None
        self._scale_lock: asyncio.Lock | None = None
        self._leaving: set[str] = set()  # told to go (stop or closing) and not yet gone
        self._reaper: asyncio.Task[None] | None = None

    def scale(self, n: int) -> None:
        """Run ``n`` workers: start new ones, or have the scheduler retire the extra
        ones gracefully (their data copied to the others first; idle ones and those
        holding the least data go first; pinned ones never). Stops ``adapt``. Returns
        once the decision is carried out, without waiting for new workers to join
        (``wait_for_workers``) nor for retiring ones to finish copying."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"scale(n) needs an integer n >= 0, not {n!r}")
        self._stop_adaptive()
        self.n_workers = n
        self._run(self._scale(lambda names: lambda rid: m.ScaleRequest(rid, names, n)))

    def adapt(
        self,
        minimum: int = 0,
        maximum: int | float | None = None,
        target_duration: str | float = "5s",
        wait_count: int = 3,
        interval: str | float = "1s",
        default_task_duration: str | float = DEFAULT_TASK_DURATION,
    ) -> Adaptive:
        """Scale between ``minimum`` and ``maximum`` workers (None: no maximum) as the
        work asks: every ``interval`` the scheduler computes the workers that would
        finish the queued and processing tasks in about ``target_duration`` (from
        each task prefix's measured mean duration, ``default_task_duration`` for a
        prefix never measured) and scales up at once, or down after ``wait_count``
        lower proposals in a row. Replaces an earlier ``adapt``; ``scale`` stops it.
        Durations are seconds or strings such as ``"5s"``, ``"200ms"``, ``"1m"``.
        Every decision and its reason: ``client.get_events("adaptive")``."""
        adaptive = Adaptive(
            self, minimum, maximum, target_duration, wait_count, interval, default_task_duration
        )
        self._stop_adaptive()
        self._adaptive = adaptive
        runner = self._control_runner()

        async def begin() -> None:
            adaptive._task = asyncio.ensure_future(adaptive._run())

        runner.run_sync(begin())
        return adaptive

    @property
    def adaptive(self) -> Adaptive | None:
        """The ``adapt`` running, if any."""
        return self._adaptive if self._adaptive is not None and self._adaptive.running else None

    # ------------------------------------------------------------ carrying out

    def _stop_adaptive(self, which: Adaptive | None = None) -> None:
        """Stop ``which`` (default: the running ``adapt``), waiting for its loop to end."""
        adaptive = which or self._adaptive
        if adaptive is None:
            return
        if self._adaptive is adaptive:
            self._adaptive = None
        try:
            runner = self._control_runner()
        except RuntimeError:  # the cluster is closed: its loop, and the task, are gone
            return
        if adaptive._task is not None and not runner.loop.is_closed():
            runner.run_sync(adaptive._stop(), REQUEST_TIMEOUT)

    async def _adapt_once(self, adaptive: Adaptive) -> m.ScaleReply:
        threads = self.threads_per_worker
        return await self._scale(lambda names: adaptive.request(names, threads))

    async def _scale(self, make: Any) -> m.ScaleReply:
        """One request and what its answer says to do, one at a time."""
        if self._scale_lock is None:
            self._scale_lock = asyncio.Lock()
        async with self._scale_lock:
            conn = await self._connection()
            names = self._worker_names()  # those leaving too: the core knows them
            build, ahead = make(names), self._replace_ahead()
            if ahead:
                build = _with_replace_ahead(build, ahead)
            reply, _ = await conn.request(build, timeout=REQUEST_TIMEOUT)
            assert isinstance(reply, m.ScaleReply)
            if reply.error:
                raise ValueError(reply.error)
            self._leaving.difference_update(reply.resumed)
            self._leaving.update(reply.closing)
            self._leaving.update(reply.stop)
            if reply.stop:
                await self._stop_workers(list(reply.stop))
            if reply.start:
                await self._start_workers(reply.start)
            if self._leaving and (self._reaper is None or self._reaper.done()):
                self._reaper = asyncio.ensure_future(self._reap())
            return reply

    async def _reap(self) -> None:
        """Until the workers told to go have exited, look (and reap their processes)."""
        while self._leaving:
            await asyncio.sleep(REAP_INTERVAL)
            self._leaving.intersection_update(self._worker_names())

    async def _connection(self) -> Connection:
        conn = self._control
        if conn is None or conn.closed:
            hello = m.Hello(m.PROTOCOL_VERSION, "client", name="cluster-control", subscribe=False)
            conn, _ = await connect(self.scheduler_address, hello, security=self.security)
            conn.set_handler(_ignore)
            self._control = conn
        return conn

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._control_runner().run_sync(coro, REQUEST_TIMEOUT + 10)

    def _close_elastic(self) -> None:
        """Stop adapting and drop the scheduler connection (the cluster is closing)."""
        adaptive, self._adaptive = self._adaptive, None
        if adaptive is None and self._control is None and self._reaper is None:
            return  # never scaled: nothing to stop (and no control loop to start)

        async def stop() -> None:
            if adaptive is not None:
                await adaptive._stop()
            if self._reaper is not None:
                self._reaper.cancel()
            if self._control is not None:
                self._control.close()

        with contextlib.suppress(Exception):
            self._run(stop())


def _with_replace_ahead(build: Any, ahead: float) -> Any:
    return lambda rid: msgspec.structs.replace(build(rid), replace_ahead=ahead)


def _ignore(conn: Connection, frame: Frame) -> None:
    logger.debug("cluster control connection ignores %s", frame.messages)
