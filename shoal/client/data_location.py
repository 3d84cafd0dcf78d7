"""Where data is and what workers have, in Dask's shapes: ``who_has``, ``has_what``,
``nthreads``. A mixin of :class:`~shoal.client.client.Client`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from shoal import config
from shoal.client.futures import Future
from shoal.comm.connection import Connection
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

T = TypeVar("T")
HAS_WHAT_PAGE = 100_000  # keys per has_what request
REBALANCE_TIMEOUT = 60.0  # seconds: the scheduler gives up a move after 30


class DataLocationMixin:
    asynchronous: bool
    timeout: float
    _conn: Connection | None
    _states: dict[Key, Any]

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        async def _info(self, start: int = 0, limit: int = -1) -> m.InfoReply: ...

        def _send(self, msg: m.Message) -> None: ...

    async def _who_has(self, keys: list[Key]) -> dict[Key, list[str]]:
        conn = self._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        reply, _ = await conn.request(lambda rid: m.WhoHasRequest(rid, keys), timeout=self.timeout)
        assert isinstance(reply, m.WhoHasReply)
        return {key: list(workers) for key, workers in reply.who_has}

    def who_has(self, futures: Future | Iterable[Future] | None = None) -> Any:
        """``{key: [worker addresses holding it]}`` for ``futures``; without them, as
        Dask's, for every key in memory on the cluster (every client's)."""

        async def who_has() -> dict[Key, list[str]]:
            if futures is None:
                out: dict[Key, list[str]] = {}
                for address, keys in (await self._has_what(None)).items():
                    for key in keys:
                        out.setdefault(key, []).append(address)
                return out
            return await self._who_has(_keys(futures, self._states))

        return who_has() if self.asynchronous else self._sync(who_has())

    async def _has_what(self, workers: str | Iterable[str] | None) -> dict[str, list[Key]]:
        conn = self._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        wanted = _wanted(workers)
        infos = (await self._info()).workers
        out: dict[str, list[Key]] = {}
        for w in infos:
            if wanted is not None and not {w.address, w.name} & wanted:
                continue
            keys: dict[Key, None] = {}  # pages of a live set may repeat a key
            start = 0
            while True:
                reply, _ = await conn.request(
                    _has_what_request(w.address, start), timeout=self.timeout
                )
                assert isinstance(reply, m.HasWhatReply)
                if not reply.address:
                    break  # it left meanwhile
                keys.update(dict.fromkeys(reply.keys))
                start += len(reply.keys)
                if len(reply.keys) < HAS_WHAT_PAGE or start >= reply.total:
                    out[reply.address] = list(keys)
                    break
        return out

    def has_what(self, workers: str | Iterable[str] | None = None) -> Any:
        """``{worker address: [keys it holds]}`` for every worker (or ``workers``,
        addresses or names), every client's keys, as Dask's. Asked of the scheduler in
        pages (a worker may hold millions of keys)."""

        async def has_what() -> dict[str, list[Key]]:
            return await self._has_what(workers)

        return has_what() if self.asynchronous else self._sync(has_what())

    def rebalance(
        self,
        futures: Any = None,
        workers: str | Iterable[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Even out the managed memory of ``workers`` (addresses or names; default:
        all) by moving the results of ``futures`` (default: every key in memory), as
        Dask's. Returns once every move is over: each key is copied to its recipient and
        then dropped from its sender (never its last copy). Dask's thresholds apply, as
        fractions of a worker's memory limit: senders hold over 30% of it and 5% above
        the mean, recipients under 60% and 5% below (config
        ``shoal.worker.memory.rebalance.*``, or Dask's ``distributed.`` keys)."""
        from shoal.client.progress import futures_of

        if kwargs:
            raise TypeError(f"rebalance() got unexpected arguments {sorted(kwargs)}")
        fs = None if futures is None else futures_of(futures)
        names = sorted(_wanted(workers) or ())
        thresholds = [
            float(config.get(f"worker.memory.rebalance.{name}") or 0.0)
            for name in ("sender-min", "recipient-max", "sender-recipient-gap")
        ]

        async def rebalance() -> None:
            from shoal.client.futures import wait_states

            conn = self._conn
            if conn is None or conn.closed:
                raise RuntimeError("the client is closed")
            if fs is not None:
                await wait_states([f._state for f in fs])  # only results in memory move
            keys = None if fs is None else [f.key for f in fs]
            sid = f"rebalance-{uuid.uuid4().hex[:8]}"
            reply, _ = await conn.request(
                lambda rid: m.RebalanceRequest(rid, keys, names, sid, *thresholds),
                timeout=max(4 * self.timeout, REBALANCE_TIMEOUT),
            )
            assert isinstance(reply, m.RebalanceReply)

        return rebalance() if self.asynchronous else self._sync(rebalance())

    def replicate(
        self,
        futures: Any,
        n: int | None = None,
        workers: str | Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Have ``n`` workers (default: every one) among ``workers`` (addresses or
        names; default: all) hold a copy of each future's result, as Dask's; waits until
        they do (TimeoutError after ``timeout``, default 4 x the client's). The copies
        come from the holders (the scheduler picks the emptiest targets) and count as
        any replica: a later release frees them all."""
        from shoal.client.progress import futures_of

        if n is not None and n < 1:
            raise ValueError(f"replicate needs n >= 1 (or None: every worker), not {n}")
        fs = futures_of(futures)
        keys = [f.key for f in fs]
        names = sorted(_wanted(workers) or ())

        async def replicate() -> None:
            from shoal.client.futures import wait_states

            await wait_states([f._state for f in fs])  # only results in memory are copied
            infos = (await self._info()).workers
            wanted = _wanted(workers)
            targets = {w.address for w in infos if wanted is None or {w.address, w.name} & wanted}
            if wanted is not None and not targets:
                raise ValueError(f"no worker among {sorted(wanted)} is connected")
            goal = len(targets) if n is None else min(n, len(targets))
            sid = f"replicate-{uuid.uuid4().hex[:8]}"
            self._send(m.ReplicateKeys(keys, -1 if n is None else n, names, sid))
            limit = timeout if timeout is not None else 4 * self.timeout
            try:
                async with asyncio.timeout(limit):
                    while True:
                        held = await self._who_has(keys)
                        if all(len(set(held.get(k, ())) & targets) >= goal for k in keys):
                            return
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise TimeoutError(
                    f"{len(keys)} keys did not reach {goal} replicas within {limit}s"
                ) from None

        return replicate() if self.asynchronous else self._sync(replicate())

    def nthreads(self, workers: str | Iterable[str] | None = None) -> Any:
        """``{worker address: number of threads}`` for every worker (or ``workers``,
        addresses or names). Dask's ``ncores`` is the same."""

        async def nthreads() -> dict[str, int]:
            wanted = _wanted(workers)
            return {
                w.address: w.nthreads
                for w in (await self._info()).workers
                if wanted is None or {w.address, w.name} & wanted
            }

        return nthreads() if self.asynchronous else self._sync(nthreads())

    ncores = nthreads


def _has_what_request(address: str, start: int) -> Callable[[int], m.Message]:
    return lambda rid: m.HasWhatRequest(rid, address, start, HAS_WHAT_PAGE)


def _keys(futures: Future | Iterable[Future] | None, held: dict[Key, Any]) -> list[Key]:
    if futures is None:
        return list(held)
    if isinstance(futures, Future):
        return [futures.key]
    return [f.key for f in futures]


def _wanted(workers: str | Iterable[str] | None) -> set[str] | None:
    if workers is None:
        return None
    return {workers} if isinstance(workers, str) else set(workers)
