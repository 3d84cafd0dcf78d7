"""Connection's data plane over real sockets, on the selector loop, uvloop and TLS: large
out-of-band buffers arrive intact and in order with the small messages around them,
the sender never holds more than one chunk in its transport, and nothing of a sent
value stays referenced once it is written."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest
from comm_loops import run_on_loop

from shoal.comm.connection import CHUNK, Connection
from shoal.comm.security import Security
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, message_buffers
from shoal.protocol.serialize import dumps_value, loads_value

MB = 1_000_000


class Recording(Connection):
    """Records the transport's write buffer size each time it pauses the writer."""

    paused_at: list[int]

    def pause_writing(self) -> None:
        self.paused_at.append(self.transport.get_write_buffer_size() if self.transport else 0)
        super().pause_writing()


async def pair(tls: bool) -> tuple[Recording, Recording, asyncio.Queue[Frame], Any]:
    """A connected (sender, receiver) pair on 127.0.0.1; frames the receiver gets go
    to the queue."""
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[Frame] = asyncio.Queue()
    accepted: asyncio.Future[Recording] = loop.create_future()
    security = Security.temporary() if tls else None

    def factory() -> Recording:
        conn = Recording(on_frame=lambda c, f: frames.put_nowait(f))
        conn.paused_at = []
        if not accepted.done():
            accepted.set_result(conn)
        return conn

    server = await loop.create_server(
        factory, "127.0.0.1", 0, ssl=security.listen_context() if security else None
    )
    port = server.sockets[0].getsockname()[1]

    def client_factory() -> Recording:
        conn = Recording()
        conn.paused_at = []
        return conn

    address = f"tls://127.0.0.1:{port}"
    _, sender = await loop.create_connection(
        client_factory,
        "127.0.0.1",
        port,
        ssl=security.connect_context("tls", address) if security else None,
    )
    receiver = await accepted
    return sender, receiver, frames, server


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "loop_kind, tls",
    [("asyncio", False), ("uvloop", False), ("asyncio", True)],
    ids=["selector", "uvloop", "tls"],
)
def test_large_buffers_and_small_messages_keep_their_order(loop_kind: str, tls: bool) -> None:
    np = pytest.importorskip("numpy")
    big = np.arange(30 * MB // 8, dtype="f8")
    raw = bytes(range(256)) * (20 * MB // 256)

    async def main() -> None:
        sender, receiver, frames, server = await pair(tls)
        try:
            sent, expected = [], []
            for i in range(3):
                for value in (big, raw):
                    payload, bufs = dumps_value(value)
                    sender.send(m.DataReply(i, ["k"], [payload]), bufs)
                    sender.flush()  # one frame each
                    sender.send(m.Ack(1000 + i, [i]))
                    sender.flush()
                    sent.append(value)
                    expected += [("data", i), ("ack", 1000 + i)]
            got: list[Any] = []
            seen: list[tuple[str, int]] = []
            while len(seen) < len(expected):
                frame = await frames.get()
                for msg, bufs in message_buffers(frame):
                    if isinstance(msg, m.DataReply):
                        seen.append(("data", msg.request_id))
                        got.append(loads_value(msg.payloads[0], bufs))
                    else:
                        seen.append(("ack", msg.request_id))  # type: ignore[attr-defined]
            assert seen == expected
            for value, back in zip(sent, got):
                if isinstance(value, bytes):
                    assert type(back) is bytes and back == value
                else:
                    assert back.flags.writeable and (back == value).all()
            # the writer only ever left part of one chunk in the transport (TLS: with
            # the records' framing, a few bytes per 16 KiB record)
            bound = CHUNK + (CHUNK // 16384) * 64 if tls else CHUNK
            assert sender.paused_at and max(sender.paused_at) <= bound
            await sender.drain()
            assert sender.bytes_in_flight == 0 and not sender._wqueue
        finally:
            sender.close()
            receiver.close()
            server.close()
            await server.wait_closed()

    run_on_loop(loop_kind, main)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_sent_value_is_not_kept_once_written(loop_kind: str) -> None:
    np = pytest.importorskip("numpy")

    async def main() -> None:
        sender, receiver, frames, server = await pair(False)
        try:
            value = np.ones(40 * MB // 8)
            ref = weakref.ref(value)
            payload, bufs = dumps_value(value)
            sender.send(m.DataReply(1, ["k"], [payload]), bufs)
            del value, bufs
            frame = await frames.get()
            assert frame.buffers[0].nbytes == 40 * MB
            await sender.drain()
            gc.collect()
            assert ref() is None, "the connection still holds the sent array"
        finally:
            sender.close()
            receiver.close()
            server.close()
            await server.wait_closed()

    run_on_loop(loop_kind, main)


@pytest.mark.timeout(60)
def test_closing_with_data_queued_sends_it_first() -> None:
    async def main() -> None:
        sender, receiver, frames, server = await pair(False)
        try:
            payload, bufs = dumps_value(b"z" * (25 * MB))
            sender.send(m.DataReply(1, ["k"], [payload]), bufs)
            sender.flush()
            sender.close()  # most of the 25 MB is still queued
            frame = await frames.get()
            [(msg, got)] = message_buffers(frame)
            assert loads_value(msg.payloads[0], got) == b"z" * (25 * MB)
        finally:
            receiver.close()
            server.close()
            await server.wait_closed()

    run_on_loop("asyncio", main)
