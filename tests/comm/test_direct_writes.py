"""Frames written straight on a connection's socket from other threads
(``Connection.write_direct``, a client's calling thread) while the loop writes its own:
every frame arrives whole, each writer's frames in the order written, also when the
kernel takes a direct write only in part (its rest is written by the loop, before
anything written after it)."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest
from comm_loops import run_on_loop

from shoal.comm.connection import Connection
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame

WRITERS = 4


async def pair(small_buffers: bool) -> tuple[Connection, Connection, list[Frame], Any]:
    """A connected (sender, receiver) pair on 127.0.0.1, direct writes enabled on the
    sender; the frames the receiver gets are appended to the list."""
    loop = asyncio.get_running_loop()
    frames: list[Frame] = []
    accepted: asyncio.Future[Connection] = loop.create_future()

    def factory() -> Connection:
        conn = Connection(on_frame=lambda c, f: frames.append(f))
        if not accepted.done():
            accepted.set_result(conn)
        return conn

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sock = socket.socket()
    if small_buffers:  # so that the kernel takes a direct write only in part
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.connect(("127.0.0.1", port))
    _, sender = await loop.create_connection(Connection, sock=sock)
    receiver = await accepted
    while receiver.transport is None:
        await asyncio.sleep(0.001)
    assert sender.enable_direct_writes()
    return sender, receiver, frames, server


def message(writer: str, number: int, pad: int) -> m.ReleaseKeys:
    # The padding makes frames larger than what a small socket buffer takes at once.
    return m.ReleaseKeys([f"{writer}:{number}"], stimulus_id="x" * pad)


def check_frames(frames: list[Frame], expected: dict[str, int]) -> None:
    """Every message decoded (frames whole), each writer's numbers 0, 1, 2... in order."""
    seen: dict[str, list[int]] = {w: [] for w in expected}
    for frame in frames:
        for msg in frame.messages:
            assert type(msg) is m.ReleaseKeys
            writer, number = msg.keys[0].split(":")
            seen[writer].append(int(number))
    for writer, count in expected.items():
        assert seen[writer] == list(range(count)), writer


async def write_concurrently(small_buffers: bool, per_writer: int, pad: int) -> Connection:
    sender, receiver, frames, server = await pair(small_buffers)
    loop = asyncio.get_running_loop()
    start = threading.Barrier(WRITERS)

    def writer(name: str) -> None:
        start.wait()
        for i in range(per_writer):
            # Busy connection (the loop's frames, the rest of a partial write): wait
            # for it, as a caller falls back to the loop; order is per writer.
            while not sender.write_direct([message(name, i, pad)]):
                threading.Event().wait(0.0002)

    threads = [threading.Thread(target=writer, args=(f"t{k}",)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    if small_buffers:
        receiver.transport.pause_reading()  # type: ignore[union-attr]  # fill the socket buffers
    # The loop writes too, meanwhile: queued sends, a frame per loop iteration.
    for i in range(per_writer):
        sender.send(message("loop", i, pad))
        await asyncio.sleep(0)
        if small_buffers and i == per_writer // 2:
            receiver.transport.resume_reading()  # type: ignore[union-attr]
    while any(t.is_alive() for t in threads):
        await asyncio.sleep(0.005)
    if small_buffers:
        receiver.transport.resume_reading()  # type: ignore[union-attr]
    expected = {f"t{k}": per_writer for k in range(WRITERS)} | {"loop": per_writer}
    total = sum(expected.values())
    while sum(len(f.messages) for f in frames) < total:
        await asyncio.sleep(0.005)
    check_frames(frames, expected)
    assert not receiver.closed  # nothing it received broke the protocol
    sender.close()
    receiver.close()
    server.close()
    await loop.shutdown_default_executor()
    return sender


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_direct_writes_from_threads_and_the_loops_writes_arrive_whole_and_in_order(
    loop_kind: str,
) -> None:
    sender = run_on_loop(loop_kind, lambda: write_concurrently(False, per_writer=300, pad=10))
    assert sender.traffic.frames_sent >= 5 * 300 / 2  # (loop frames may hold several)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_direct_write_taken_in_part_is_finished_before_anything_written_after_it(
    loop_kind: str,
) -> None:
    sender = run_on_loop(loop_kind, lambda: write_concurrently(True, per_writer=60, pad=20_000))
    assert sender.direct_partial_writes > 0  # the path this test is about was taken


def test_no_direct_write_while_the_loop_has_frames_queued() -> None:
    async def main() -> None:
        sender, receiver, frames, server = await pair(False)
        sender.send(message("loop", 0, 0))  # queued for the end of this loop iteration
        assert not sender.write_direct([message("t", 0, 0)])  # it would overtake it
        await asyncio.sleep(0.01)
        assert sender.write_direct([message("t", 0, 0)])
        while sum(len(f.messages) for f in frames) < 2:
            await asyncio.sleep(0.005)
        assert [f.messages[0].keys for f in frames] == [["loop:0"], ["t:0"]]  # type: ignore[attr-defined]
        sender.close()
        await asyncio.sleep(0.01)
        assert not sender.write_direct([message("t", 1, 0)])  # closed: nothing written
        receiver.close()
        server.close()

    run_on_loop("uvloop", main)


def test_direct_writes_are_refused_on_tls() -> None:
    from shoal.comm.security import Security

    async def main() -> None:
        loop = asyncio.get_running_loop()
        security = Security.temporary()
        server = await loop.create_server(Connection, "127.0.0.1", 0, ssl=security.listen_context())
        port = server.sockets[0].getsockname()[1]
        address = f"tls://127.0.0.1:{port}"
        _, sender = await loop.create_connection(
            Connection, "127.0.0.1", port, ssl=security.connect_context("tls", address)
        )
        assert not sender.enable_direct_writes()  # the transport encrypts: never bypassed
        assert not sender.write_direct([message("t", 0, 0)])
        sender.close()
        server.close()

    run_on_loop("asyncio", main)
