"""One multiplexed connection per peer address, opened on first use.

Requests carry ids, so many can share a connection; a closed or failed connection
is replaced on the next request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shoal.comm.connection import Connection
from shoal.comm.security import Security
from shoal.comm.tcp import DEFAULT_CONNECT_TIMEOUT, connect
from shoal.comm.traffic import Traffic
from shoal.protocol import messages as m


class ConnectionPool:
    def __init__(
        self,
        hello: Callable[[], m.Hello],
        timeout: float = DEFAULT_CONNECT_TIMEOUT,
        security: Security | None = None,
        traffic: Traffic | None = None,
    ) -> None:
        self._hello = hello
        self.traffic = traffic  # the owner's totals (shoal/comm/traffic.py)
        self._timeout = timeout
        self.security = security
        self._conns: dict[str, asyncio.Future[Connection]] = {}

    async def get(self, address: str) -> Connection:
        fut = self._conns.get(address)
        if (
            fut is not None
            and fut.done()
            and (fut.cancelled() or fut.exception() or fut.result().closed)
        ):
            fut = None
        if fut is None:
            fut = self._conns[address] = asyncio.ensure_future(self._open(address))
        # Shielded: a caller that gives up (a timeout) must not cancel the connection
        # attempt that other callers share.
        return await asyncio.shield(fut)

    async def _open(self, address: str) -> Connection:
        conn, _ = await connect(
            address,
            self._hello(),
            timeout=self._timeout,
            security=self.security,
            traffic=self.traffic,
        )
        return conn

    def close(self) -> None:
        for fut in self._conns.values():
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().close()
            elif not fut.done():
                fut.cancel()
        self._conns.clear()
