"""Closing connections leaves no "Future exception was never retrieved" behind.

asyncio logs that (at ERROR, when the future is collected) for every future failed
with an exception nobody awaited. A connection whose writes were paused (the peer
reads slower than we write: a large result, a big gather) and that then closed used
to fail its pause future, which nothing ever awaits unless ``drain()`` is called.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from shoal.comm.connection import CommClosedError, Connection
from shoal.comm.tcp import connect, listen
from shoal.protocol import messages as m

pytestmark = pytest.mark.timeout(30)


def run_collecting(coro_fn: Any) -> list[str]:
    """Run ``coro_fn()`` on a fresh loop; the messages of every unhandled error the
    loop reported (never-retrieved future exceptions included)."""
    reported: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, ctx: reported.append(str(ctx.get("message"))))
        await coro_fn()
        await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0.05)

    asyncio.run(main())
    gc.collect()
    return reported


async def _pair() -> tuple[asyncio.Server, Connection, list[Connection]]:
    accepted: list[Connection] = []

    def on_connection(conn: Connection) -> None:
        def handshake(conn: Connection, frame: Any) -> None:
            conn.send(m.Welcome(m.PROTOCOL_VERSION, "server"))
            conn.set_handler(lambda conn, frame: None)

        conn.set_handler(handshake)
        accepted.append(conn)

    server, address = await listen("127.0.0.1", 0, on_connection)
    client, _ = await connect(address, m.Hello(m.PROTOCOL_VERSION, "client"))
    return server, client, accepted


def test_a_connection_closed_while_its_writes_are_paused_leaves_no_failed_future() -> None:
    async def scenario() -> None:
        server, client, [conn] = await _pair()
        assert client.transport is not None
        client.transport.pause_reading()  # the peer stops reading: our writes back up
        big = [b"x" * (1 << 20)]
        for i in range(64):
            conn.send(m.Ack(i), big)
            conn.flush()
            if conn._write_paused:
                break
            await asyncio.sleep(0)
        assert conn._write_paused, "writes never paused"
        client.transport.abort()  # the peer goes away with our data unread
        for _ in range(100):
            if conn.closed and conn.transport is not None and conn.transport.is_closing():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert conn.closed
        conn.close()
        server.close()
        await server.wait_closed()

    assert run_collecting(scenario) == []


def test_a_drain_waiting_when_the_connection_closes_is_told_why() -> None:
    async def scenario() -> None:
        server, client, [conn] = await _pair()
        assert client.transport is not None
        client.transport.pause_reading()
        for i in range(64):
            conn.send(m.Ack(i), [b"x" * (1 << 20)])
            conn.flush()
            if conn._write_paused:
                break
            await asyncio.sleep(0)
        draining = asyncio.ensure_future(conn.drain())
        await asyncio.sleep(0.01)
        assert not draining.done()
        client.transport.abort()
        with pytest.raises(CommClosedError):
            await asyncio.wait_for(draining, 5)
        with pytest.raises(CommClosedError):  # and so is one that comes later
            await conn.drain()
        server.close()
        await server.wait_closed()

    assert run_collecting(scenario) == []


def test_pending_requests_on_a_closed_connection_are_answered_with_the_reason() -> None:
    async def scenario() -> None:
        server, client, [conn] = await _pair()
        waiting = asyncio.ensure_future(client.request(lambda rid: m.Heartbeat(rid)))
        await asyncio.sleep(0.05)
        conn.close()  # the server goes away without answering
        with pytest.raises(CommClosedError):
            await waiting
        server.close()
        await server.wait_closed()

    assert run_collecting(scenario) == []


def test_a_request_whose_message_cannot_be_made_awaits_no_reply() -> None:
    """A message refused while being built (bad input raises in its constructor) used
    to leave its reply awaited, failed at close and never retrieved."""

    def refused(rid: int) -> m.Message:
        return m.RebalanceRequest(rid, sender_min=2.0)

    async def scenario() -> None:
        server, client, [conn] = await _pair()
        with pytest.raises(ValueError, match="sender_min must be a fraction"):
            await client.request(refused)
        assert client._pending == {}
        client.close()
        conn.close()
        server.close()
        await server.wait_closed()

    assert run_collecting(scenario) == []
