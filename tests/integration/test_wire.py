"""Bad peers: garbage on a connection and a wrong protocol version are refused,
and the scheduler (a real process) keeps serving everyone else."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import msgspec
import pytest
from rawsock import authenticated_socket

from shoal import Client, LocalCluster
from shoal.comm.security import Security
from shoal.comm.tcp import HandshakeError, connect
from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder, encode_frame

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


def frame(*msgs: m.Message) -> bytes:
    return b"".join(bytes(piece) for piece in encode_frame(list(msgs)))


def raw_frame(body: object) -> bytes:
    """A frame with a well-formed header around an arbitrary msgpack body."""
    data = msgspec.msgpack.encode(body)
    return struct.pack("!2sHI", b"SH", 0, len(data)) + data


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the peer sends until it closes the connection."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
        assert time.monotonic() < deadline, "the peer kept the connection open"


def _hello() -> m.Hello:
    # not subscribed: no cluster summary is pushed between the replies these tests read
    return m.Hello(m.PROTOCOL_VERSION, "client", name="raw-socket-test", subscribe=False)


GARBAGE = {
    "http-request": [b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"],
    "random-bytes": [bytes(range(256)) * 4],
    "bad-msgpack-body": [struct.pack("!2sHI", b"SH", 0, 6) + b"\xc1" * 6],
    "huge-frame": [struct.pack("!2sHI", b"SH", 0, 0xFFFFFFFF)],
    "not-hello-first": [frame(m.InfoRequest(1))],
    "garbage-after-handshake": [frame(_hello()), b"\x00\xff" * 50],
    "unknown-message-after-handshake": [frame(_hello()), raw_frame([["NoSuchMessage", 1]])],
    "wrong-field-types-after-handshake": [frame(_hello()), raw_frame([["InfoRequest", "x"]])],
    "worker-message-from-a-client": [
        frame(_hello()),
        frame(m.TaskFinished("inc-123", 8, 0.0, 1.0, stimulus_id="forged")),
    ],
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_malformed_connection_is_closed(cluster: LocalCluster, client: Client, case: str) -> None:
    # a client connected before the garbage arrives keeps working through it
    assert client.submit(inc, 1).result(timeout=30) == 2
    sock, start = authenticated_socket(cluster.scheduler_address, cluster.security)
    with sock:
        for chunk in GARBAGE[case]:
            sock.sendall(chunk)
            time.sleep(0.05)
        reply = start + read_until_closed(sock, timeout=10)
    # the scheduler says why before it closes (after a Welcome, if the Hello was fine)
    messages = [msg for f in FrameDecoder().feed(reply) for msg in f.messages]
    assert messages, "the connection was closed without a Refused message"
    assert isinstance(messages[-1], m.Refused), messages
    assert messages[-1].reason
    assert all(isinstance(msg, m.Welcome) for msg in messages[:-1]), messages
    assert client.submit(inc, 2).result(timeout=30) == 3
    assert len(client.scheduler_info()["workers"]) == 2
    # and a new client can connect and compute
    with Client(cluster.scheduler_address, timeout=30) as fresh:
        assert fresh.submit(inc, 3).result(timeout=30) == 4
    assert all(p.poll() is None for p in cluster._procs), "a cluster process died"


def test_half_a_frame_then_close(cluster: LocalCluster, client: Client) -> None:
    sock, _ = authenticated_socket(cluster.scheduler_address, cluster.security)
    with sock:
        sock.sendall(frame(_hello())[:5])
    assert client.submit(inc, 10).result(timeout=30) == 11


def _refused_version(address: str, version: int, security: Security) -> HandshakeError:
    async def attempt() -> HandshakeError:
        hello = m.Hello(version, "client", name="from-the-future")
        try:
            conn, _ = await connect(address, hello, timeout=10, security=security)
        except HandshakeError as e:
            return e
        conn.close()
        raise AssertionError("a Hello with a wrong protocol version was welcomed")

    return asyncio.run(attempt())


def test_wrong_protocol_version_is_refused(cluster: LocalCluster, client: Client) -> None:
    err = _refused_version(cluster.scheduler_address, 999, cluster.security)
    text = str(err)
    assert "999" in text
    assert f"version {m.PROTOCOL_VERSION}" in text
    assert "version 999" in text
    assert client.submit(inc, 5).result(timeout=30) == 6


def test_wrong_protocol_version_is_refused_by_a_worker(
    cluster: LocalCluster, client: Client
) -> None:
    worker = sorted(client.scheduler_info()["workers"])[0]
    err = _refused_version(worker, 999, cluster.security)
    assert "version 999" in str(err)
    assert f"version {m.PROTOCOL_VERSION}" in str(err)
    assert client.submit(inc, 6).result(timeout=30) == 7
