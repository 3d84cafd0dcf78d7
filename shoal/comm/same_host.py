"""Same-host transfers: a holder lends its buffers and the asker copies them out of
its memory (:mod:`shoal.comm.cross_memory`) instead of receiving them by socket.

The exchange, on the one connection the data was asked on::

    asker                               holder
    GetData(keys, host=H)         ->
                                  <-    DataReply(payloads, lease=L, lender=pid, lent=[(address, n)...])
    copy every lent buffer (process_vm_readv) into memory of its own
    ReturnLease(L)                ->
                                  <-    LeaseReturned(held)

The holder lends only when the asker's host identity ``H`` is its own and the
buffers are large enough to be worth it (``LEND_MIN``); otherwise the reply carries
the buffers as ever.

Why the copy is the value's, byte for byte. A lease holds references to the lent
buffers, so the objects behind them stay alive and in place whatever happens to
their keys meanwhile. The holder lets a lease go only when the asker returns it, when
the connection closes, or when it expires (``LEASE_SECONDS``, for an asker that
never returns it). The asker accepts its copy only once ``LeaseReturned(held=True)``
came back: the reply travels on the same ordered connection, so the lease was held
through every byte read. Otherwise (expired, the connection closed first, the holder
died mid-read and its PID went to another process) the copy is discarded and the
data asked for again over the network, never used.

Any refusal of the copy itself (a kernel that forbids cross-process reads, a seccomp
profile) also falls back to the network, and this connection stops offering.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from shoal.comm import cross_memory
from shoal.comm.buffer_pool import process_pool
from shoal.comm.connection import CommClosedError, Connection
from shoal.protocol import messages as m
from shoal.protocol.framing import BYTES_BUFFER, PICKLED_BUFFER, allocate, buffer_roles

logger = logging.getLogger("shoal.comm")

# Replies whose buffers total less go by socket: below this the copy saves less than
# the extra round trip (ReturnLease) costs.
LEND_MIN = 1 << 20
# A lease not returned by then is let go (the asker, if alive, then discards its copy).
LEASE_SECONDS = 300.0
# Reads at least this large run off the event loop.
OFF_LOOP_MIN = 4 << 20
_NO_LENDING = "same-host-off"  # Connection.info flag: this connection fell back once


class DataLeases:
    """A holder's lent buffers, by lease number, until given back."""

    def __init__(
        self, lease_seconds: float = LEASE_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.made = 0  # leases made, and the bytes they lent: what went by this path
        self.lent_bytes = 0
        self._ids = itertools.count(1)
        # lease -> (connection, buffers held, expiry on the monotonic clock)
        self._held: dict[int, tuple[Connection, list[memoryview], float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    @property
    def nbytes(self) -> int:
        return sum(sum(b.nbytes for b in bufs) for _, bufs, _ in self._held.values())

    def lend(
        self, conn: Connection, buffers: list[memoryview]
    ) -> tuple[int, list[tuple[int, int]]] | None:
        """Hold ``buffers`` for ``conn`` and return the lease and where they lie, or
        None if one of them cannot be lent (no address to give)."""
        held = [memoryview(b) for b in buffers]
        lent = []
        for view in held:
            address = cross_memory.buffer_address(view)
            if address is None:
                return None
            lent.append((address, view.nbytes))
        self._expire()
        lease = next(self._ids)
        self._held[lease] = (conn, held, self.clock() + self.lease_seconds)
        self.made += 1
        self.lent_bytes += sum(n for _, n in lent)
        self._watch(conn)
        return lease, lent

    def answer(self, conn: Connection, msg: m.ReturnLease) -> None:
        """Handle the asker's ``ReturnLease`` (request 0 wants no answer)."""
        held = self.give_back(conn, msg.lease)
        if msg.request_id:
            conn.send(m.LeaseReturned(msg.request_id, held))

    def give_back(self, conn: Connection, lease: int) -> bool:
        """The asker is done with ``lease``: True if it was held until now."""
        self._expire()  # first: a lease past its time was not held until now
        held = self._held.get(lease)
        if held is None or held[0] is not conn:  # unknown, expired, or not this asker's
            return False
        del self._held[lease]
        return True

    def connection_closed(self, conn: Connection) -> None:
        for lease in [k for k, (c, _, _) in self._held.items() if c is conn]:
            del self._held[lease]

    def _expire(self) -> None:
        now = self.clock()
        for lease in [k for k, (_, _, t) in self._held.items() if t <= now]:
            del self._held[lease]

    def _watch(self, conn: Connection) -> None:
        if conn.info.get("leases-watched"):
            return
        conn.info["leases-watched"] = True
        before = conn.on_close

        def on_close(c: Connection, exc: BaseException | None) -> None:
            self.connection_closed(c)
            if before is not None:
                before(c, exc)

        conn.on_close = on_close


def reply_with_data(
    conn: Connection,
    leases: DataLeases | None,
    ask: m.GetData,
    reply: m.DataReply,
    buffers: list[memoryview],
) -> None:
    """Send ``reply`` to ``ask``: its buffers lent when the asker shares this host and
    they are worth it, in the frame otherwise."""
    if (
        leases is not None
        and ask.host
        and sum(memoryview(b).nbytes for b in buffers) >= LEND_MIN
        and ask.host == cross_memory.host_identity()
    ):
        lent = leases.lend(conn, buffers)
        if lent is not None:
            reply.lease, reply.lent = lent
            reply.lender = os.getpid()
            conn.send(reply)
            return
    conn.send(reply, buffers)


async def fetch_data(
    conn: Connection, keys: list[m.Key], timeout: float | None = None
) -> tuple[m.DataReply, list[memoryview]]:
    """Ask ``conn``'s worker for ``keys``: the reply and its buffers, copied from the
    holder's memory when it lends them, received by socket otherwise."""
    host = "" if conn.info.get(_NO_LENDING) else (cross_memory.host_identity() or "")
    reply, buffers = await conn.request(lambda rid: m.GetData(rid, keys, host), timeout=timeout)
    if not isinstance(reply, m.DataReply):
        raise CommClosedError(f"{conn.peer} answered GetData with {type(reply).__name__}")
    if not reply.lease:
        return reply, buffers
    try:
        buffers = await _copy_lent(reply)
    except cross_memory.CrossMemoryError as e:
        logger.info(
            "copying from %s (pid %d) failed, using the network: %s", conn.peer, reply.lender, e
        )
        conn.info[_NO_LENDING] = True
        _return(conn, reply.lease)
        return await _fetch_by_socket(conn, keys, timeout)
    done, _ = await conn.request(lambda rid: m.ReturnLease(rid, reply.lease), timeout=timeout)
    if isinstance(done, m.LeaseReturned) and done.held:
        return reply, buffers
    # The lease lapsed before we returned it: what we copied may not be the value.
    logger.warning(
        "lease %d from %s lapsed during the copy; asking again by socket", reply.lease, conn.peer
    )
    return await _fetch_by_socket(conn, keys, timeout)


async def _fetch_by_socket(
    conn: Connection, keys: list[m.Key], timeout: float | None
) -> tuple[m.DataReply, list[memoryview]]:
    reply, buffers = await conn.request(lambda rid: m.GetData(rid, keys, ""), timeout=timeout)
    if not isinstance(reply, m.DataReply) or reply.lease:
        raise CommClosedError(f"{conn.peer} answered GetData with {type(reply).__name__}")
    return reply, buffers


def _return(conn: Connection, lease: int) -> None:
    """Give a lease back without waiting for the answer (request 0: none is sent)."""
    if not conn.closed:
        conn.send(m.ReturnLease(0, lease))


async def _copy_lent(reply: m.DataReply) -> list[memoryview]:
    """Memory of our own for each lent buffer, filled from the lender's."""
    pool = process_pool()
    objects: list[Any] = []  # what the buffers become; the targets only point into them
    targets: list[memoryview] = []
    for (_, n), role in zip(reply.lent, buffer_roles(reply.payloads), strict=True):
        lent = pool.allocate(n) if pool is not None and role == PICKLED_BUFFER else None
        if lent is None:
            lent = allocate(n, role == BYTES_BUFFER)
        objects.append(lent[0])
        targets.append(lent[1])
    if sum(n for _, n in reply.lent) < OFF_LOOP_MIN:
        cross_memory.read_into(reply.lender, reply.lent, targets)
    else:
        copy = asyncio.ensure_future(
            asyncio.to_thread(cross_memory.read_into, reply.lender, reply.lent, targets)
        )
        try:
            await asyncio.shield(copy)
        except asyncio.CancelledError:
            # The thread goes on writing into ``objects``: they live until it is done.
            copy.add_done_callback(_keep_until_done(objects))
            raise
    for t in targets:
        t.release()
    return [memoryview(obj) for obj in objects]


def _keep_until_done(objects: list[Any]) -> Any:
    def done(fut: asyncio.Future[None]) -> None:
        objects.clear()  # now nothing writes into them
        if not fut.cancelled():
            fut.exception()  # retrieved: no "exception was never retrieved" in the log

    return done
