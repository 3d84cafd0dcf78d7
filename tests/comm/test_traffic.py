"""A server's Traffic totals over real loopback connections: what one side counts as
sent, the other counts as received (bytes, including the token preamble and large
out-of-band buffers; frames; messages), and connections opened and closed."""

from __future__ import annotations

import asyncio

from shoal.comm.connection import Connection
from shoal.comm.security import Security
from shoal.comm.tcp import connect, listen
from shoal.comm.traffic import Traffic
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame


def test_both_sides_count_the_same_traffic() -> None:
    async def main() -> tuple[Traffic, Traffic]:
        security = Security(token="a-token")
        server_side, client_side = Traffic(), Traffic()
        got: asyncio.Queue[Frame] = asyncio.Queue()

        def accepted(conn: Connection) -> None:
            def on_frame(conn: Connection, frame: Frame) -> None:
                if isinstance(frame.messages[0], m.Hello):
                    conn.send(m.Welcome(m.PROTOCOL_VERSION, "server"))
                    return
                got.put_nowait(frame)
                conn.send(m.Ack(len(frame.messages)))

            conn.set_handler(on_frame)

        server, address = await listen(
            "127.0.0.1", 0, accepted, security, traffic=server_side
        )
        hello = m.Hello(m.PROTOCOL_VERSION, "client")
        conn, _ = await connect(address, hello, security=security, traffic=client_side)
        replies: asyncio.Queue[Frame] = asyncio.Queue()
        conn.set_handler(lambda c, f: replies.put_nowait(f))
        big = bytearray(3_000_000)  # written in chunks, out of band
        conn.send(m.Heartbeat(1))
        conn.send(m.Heartbeat(2), [memoryview(big)])
        frame = await asyncio.wait_for(got.get(), 10)
        assert len(frame.messages) == 2 and frame.buffers[0].nbytes == len(big)
        await asyncio.wait_for(replies.get(), 10)
        assert client_side.open_connections == server_side.open_connections == 1
        conn.close()
        server.close()
        for _ in range(100):  # the server side sees the close a moment later
            if server_side.closed:
                break
            await asyncio.sleep(0.02)
        return server_side, client_side

    server, client = asyncio.run(main())
    assert client.bytes_sent == server.bytes_received > 3_000_000
    assert server.bytes_sent == client.bytes_received > 0
    assert client.frames_sent == server.frames_received == 2  # Hello, then the batch
    assert server.frames_sent == client.frames_received == 2  # Welcome, then the Ack
    assert client.messages_sent == server.messages_received == 3
    assert server.messages_sent == client.messages_received == 2
    assert (client.opened, client.closed, server.opened, server.closed) == (1, 1, 1, 1)
    assert client.open_connections == server.open_connections == 0
