"""``client.restart()``: clear the cluster's state and restart every worker through
its nanny, as Dask's. A mixin of :class:`~shoal.client.client.Client`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from shoal.comm.connection import Connection
from shoal.protocol import messages as m

T = TypeVar("T")


def _under_nanny(dask_worker: Any) -> bool:
    return bool(dask_worker.under_nanny)


def _leave_to_restart(dask_worker: Any) -> None:
    # Spawned: the answer goes out before the worker closes its connections.
    dask_worker._spawn(
        dask_worker.leave("restarted by client.restart()", retire=False, restart=True)
    )


class RestartMixin:
    asynchronous: bool
    timeout: float
    _conn: Connection | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        async def _info(self, start: int = 0, limit: int = -1) -> m.InfoReply: ...

        async def _run_on_worker(self, address: str, call: bytes) -> m.RunReply: ...

        def _send(self, msg: m.Message) -> None: ...

    def retry(self, futures: Any) -> Any:
        """Run the erred tasks of ``futures`` again, with the erred tasks they failed
        through (e.g. after fixing what a task reads); the futures are pending again
        until the new outcome. Futures not in error are left as they are."""
        from shoal.client.progress import futures_of

        erred = [f for f in futures_of(futures) if f.status == "error"]

        async def retry() -> None:
            if not erred:
                return
            for f in erred:
                f._state.reset()
            self._send(m.RetryKeys([f.key for f in erred], f"retry-{uuid.uuid4().hex[:8]}"))

        return retry() if self.asynchronous else self._sync(retry())

    def restart(self, timeout: float | None = None, wait_for_workers: bool = True) -> Any:
        """Cancel every client's futures (they raise ``CancelledError``), drop published
        datasets and fire-and-forget tasks, and restart every worker process through
        its nanny; with ``wait_for_workers``, return once as many workers as before
        have joined again (TimeoutError after ``timeout``, default 4 x the client's).
        RuntimeError, changing nothing, if a worker has no nanny to restart it."""

        async def restart() -> None:
            before = {w.address for w in (await self._info()).workers}
            replies = await asyncio.gather(
                *(self._run_on_worker(a, cloudpickle.dumps((_under_nanny, (), {}))) for a in before)
            )
            alone = sorted(
                a
                for a, r in zip(before, replies, strict=True)
                if r.status != "OK" or not cloudpickle.loads(r.result)
            )
            if alone:
                raise RuntimeError(
                    f"client.restart() needs every worker under a nanny; these have none: {alone}"
                )
            conn = self._conn
            if conn is None or conn.closed:
                raise RuntimeError("the client is closed")
            sid = f"restart-{uuid.uuid4().hex[:8]}"
            await conn.request(lambda rid: m.RestartRequest(rid, sid))
            leave = cloudpickle.dumps((_leave_to_restart, (), {}))
            await asyncio.gather(*(self._run_on_worker(a, leave) for a in before))
            if not wait_for_workers:
                return
            limit = timeout if timeout is not None else 4 * self.timeout
            try:
                async with asyncio.timeout(limit):
                    while True:
                        now = {w.address for w in (await self._info()).workers}
                        if not now & before and len(now) >= len(before):
                            return
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise TimeoutError(
                    f"{len(before)} workers did not all restart within {limit}s"
                ) from None

        return restart() if self.asynchronous else self._sync(restart())
