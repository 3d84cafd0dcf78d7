"""Bad input never takes a process down.

A real scheduler process and a real worker process (both ``--validate``, so a message
that left the state machines inconsistent would end them) get garbage, oversized and
truncated frames, unknown and malformed messages, and well-formed messages that their
sender's role may not send or that make no sense. Each time the offending connection
gets a ``Refused`` naming the problem and is closed (or, for a semantically odd but
legal request, a sensible answer); the processes stay up, their memory stays bounded,
and afterwards a real Client still computes on the real worker.

Raw connections speak the protocol through :func:`raw_connect` and
:func:`raw_connect_and_hello` only, so that a change to the connection preamble (e.g.
authentication) is made in one place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil
import pytest
from rawsock import authenticated_socket
from recording_scheduler import recording_scheduler
from tasks import wait_for_file

from shoal import Client
from shoal.client.loop import LoopRunner
from shoal.comm.security import Security
from shoal.comm.tcp import HANDSHAKE_TIMEOUT, parse_address
from shoal.protocol import messages as m
from shoal.protocol.framing import (
    DEFAULT_MAX_FRAME,
    MAX_BUFFERS,
    FrameDecoder,
    encode_frame,
    physical_memory,
)
from shoal.protocol.serialize import PICKLE
from shoal.server.scheduler import Scheduler

pytestmark = pytest.mark.timeout(60)

HEADER = struct.Struct("!2sHI")  # magic, nbuffers, body length (network byte order)
BUFLEN = struct.Struct("!Q")
IO_TIMEOUT = 10.0


def inc(x):
    return x + 1


# ------------------------------------------------------------------------ raw peers


class RawPeer:
    """A blocking socket that speaks shoal frames, for sending what no real peer would."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.decoder = FrameDecoder()
        self.received: list[m.Message] = []

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, *messages: m.Message, buffers: list[bytes] | tuple[bytes, ...] = ()) -> None:
        self.sock.sendall(b"".join(bytes(p) for p in encode_frame(list(messages), buffers)))

    def send_raw_body(self, batch: object) -> None:
        """A frame around any msgpack value (no validation on our side)."""
        body = msgspec.msgpack.encode(batch)
        self.sock.sendall(HEADER.pack(b"SH", 0, len(body)) + body)

    def next_message(self, timeout: float = IO_TIMEOUT) -> m.Message:
        """The next message the other side sends (AssertionError if it closes first)."""
        deadline = time.monotonic() + timeout
        while not self.received:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 16)
            assert data, "the connection closed"
            for frame in self.decoder.feed(data):
                self.received.extend(frame.messages)
        return self.received.pop(0)

    def expect(self, cls: type[m.Message], timeout: float = IO_TIMEOUT) -> m.Message:
        """Skip other messages (e.g. FreeKeys to a fake worker) until one of ``cls``."""
        while True:
            msg = self.next_message(timeout)
            if type(msg) is cls:
                return msg
            assert type(msg) is not m.Refused, f"refused: {msg}"

    def expect_refused(self, *fragments: str) -> str:
        """The other side says why (every fragment in the reason), then closes."""
        msg = self.next_message()
        while type(msg) is not m.Refused:
            msg = self.next_message()
        assert isinstance(msg, m.Refused)
        for fragment in fragments:
            assert fragment in msg.reason, (fragment, msg.reason)
        self.expect_closed()
        return msg.reason

    def expect_closed(self) -> None:
        deadline = time.monotonic() + IO_TIMEOUT
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return
            if not data:
                return
            self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def raw_connect(address: str) -> Iterator[RawPeer]:
    """A TCP connection past the authentication preamble (no token), that has sent
    no frame yet."""
    sock, rest = authenticated_socket(address, Security())
    sock.settimeout(IO_TIMEOUT)
    peer = RawPeer(sock)
    if rest:
        peer.received.extend(m for f in peer.decoder.feed(rest) for m in f.messages)
    try:
        yield peer
    finally:
        peer.close()


@contextlib.contextmanager
def raw_connect_and_hello(to: str, role: str = "client", **fields: object) -> Iterator[RawPeer]:
    """A connection to ``to`` past the handshake, as ``role``."""
    if role == "client":  # no cluster summaries pushed between the replies tests read
        fields.setdefault("subscribe", False)
    with raw_connect(to) as peer:
        peer.send(m.Hello(m.PROTOCOL_VERSION, role, **fields))  # type: ignore[arg-type]
        welcome = peer.next_message()
        assert type(welcome) is m.Welcome, welcome
        yield peer


# ------------------------------------------------------------------------ processes


def child_env() -> dict[str, str]:
    """Our import path, so that the processes can import the test modules' tasks."""
    paths = [os.getcwd(), *(p for p in sys.path if p and os.path.isdir(p))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


class Processes:
    """A scheduler and a worker process, both checking their invariants."""

    def __init__(self, tmp: Path):
        self.procs: list[subprocess.Popen[bytes]] = []
        sched_file = tmp / "scheduler.json"
        self.scheduler = self._start(
            "scheduler", "--port", "0", "--scheduler-file", str(sched_file), "--quiet"
        )
        self.worker = self._start(
            "worker", "--scheduler-file", str(sched_file), "--nthreads", "1", "--name", "w0"
        )
        deadline = time.monotonic() + 30
        while not sched_file.exists():
            assert time.monotonic() < deadline, "the scheduler never wrote its file"
            time.sleep(0.05)
        self.address = json.loads(sched_file.read_text())["address"]
        self.worker_address = ""
        while not self.worker_address:
            assert time.monotonic() < deadline, "the worker never joined"
            self.worker_address = next(iter(self.workers()), "")
            time.sleep(0.05)

    def _start(self, *args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "shoal", *args, "--validate", "--log-level", "error"]
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=child_env())
        self.procs.append(p)
        return p

    def workers(self) -> list[str]:
        with raw_connect_and_hello(self.address) as peer:
            peer.send(m.InfoRequest(1))
            reply = peer.expect(m.InfoReply)
            assert isinstance(reply, m.InfoReply)
            return [w.address for w in reply.workers]

    def info(self) -> m.InfoReply:
        with raw_connect_and_hello(self.address) as peer:
            peer.send(m.InfoRequest(1))
            reply = peer.expect(m.InfoReply)
            assert isinstance(reply, m.InfoReply)
            return reply

    def assert_alive(self) -> None:
        for p in self.procs:
            assert p.poll() is None, f"{p.args[2:4]} exited with {p.returncode}"

    def assert_working(self) -> None:
        """Both processes are up, the worker is still registered, and a real Client
        computes on it."""
        self.assert_alive()
        assert self.workers() == [self.worker_address]
        with Client(self.address, timeout=20) as client:
            assert client.submit(inc, 41, pure=False).result(timeout=20) == 42
        self.assert_alive()

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    ps = Processes(tmp_path_factory.mktemp("bad-input"))
    try:
        yield ps
    finally:
        ps.close()


@pytest.fixture
def scheduler(procs: Processes) -> Iterator[str]:
    """The scheduler's address; after the test, everything must still work."""
    yield procs.address
    procs.assert_working()


@pytest.fixture
def worker(procs: Processes) -> Iterator[str]:
    """The worker's listening address; after the test, everything must still work."""
    yield procs.worker_address
    procs.assert_working()


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


# ------------------------------------------------------------------------ frames

LIMIT = f"exceeds the limit of {DEFAULT_MAX_FRAME} bytes"
# Out-of-band buffers are not bounded by the frame limit, but by the machine's memory.
BUFFER_LIMIT = f"exceed the limit of {physical_memory()} bytes for buffers"

# (name, bytes sent, fragments of the Refused reason). Sent before and after a Hello.
BAD_FRAMES = [
    ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ["bad magic b'GE'"]),
    ("garbage", bytes(range(7, 200)), ["bad magic"]),
    ("huge-body", HEADER.pack(b"SH", 0, 2**31), ["frame of 2147483648 bytes", LIMIT]),
    ("max-u32-body", HEADER.pack(b"SH", 0, 2**32 - 1), [LIMIT]),
    (
        "huge-buffers",
        HEADER.pack(b"SH", 4, 10) + BUFLEN.pack(2**40) * 4,
        [f"buffers of {4 * 2**40} bytes", BUFFER_LIMIT],
    ),
    (
        "buffer-lengths-summing-past-2**64",
        HEADER.pack(b"SH", 3, 0) + BUFLEN.pack(2**64 - 1) * 3,
        [f"buffers of {3 * (2**64 - 1)} bytes", BUFFER_LIMIT],
    ),
    ("too-many-buffers", HEADER.pack(b"SH", MAX_BUFFERS + 1, 0), [f"limit {MAX_BUFFERS}"]),
    ("not-msgpack", HEADER.pack(b"SH", 0, 1) + b"\xc1", ["malformed message body"]),
    ("not-a-batch", HEADER.pack(b"SH", 0, 1) + b"\x01", ["invalid message", "Expected `array`"]),
    (
        "trailing-bytes",
        HEADER.pack(b"SH", 0, 2) + b"\x90\x90",
        ["malformed message body"],
    ),
    (
        "not-utf8",
        HEADER.pack(b"SH", 0, 13) + b"\x91\x92\xa7Refused\xa2\xff\xfe",
        ["malformed message body", "not UTF-8"],
    ),
    (
        "deep-nesting",
        HEADER.pack(b"SH", 0, 100_013) + b"\x91\x92\xa8FreeKeys\x91" + b"\x91" * 100_000 + b"\x01",
        ["message"],
    ),
]


@pytest.mark.parametrize("handshake", [False, True], ids=["before-hello", "after-hello"])
@pytest.mark.parametrize(
    "data, reason", [c[1:] for c in BAD_FRAMES], ids=[c[0] for c in BAD_FRAMES]
)
def test_bad_frame_to_scheduler(scheduler: str, handshake: bool, data: bytes, reason: list[str]):
    opened = raw_connect_and_hello(scheduler) if handshake else raw_connect(scheduler)
    with opened as peer:
        peer.send_bytes(data)
        peer.expect_refused("protocol error", *reason)


@pytest.mark.parametrize("handshake", [False, True], ids=["before-hello", "after-hello"])
@pytest.mark.parametrize(
    "data, reason", [c[1:] for c in BAD_FRAMES], ids=[c[0] for c in BAD_FRAMES]
)
def test_bad_frame_to_worker(worker: str, handshake: bool, data: bytes, reason: list[str]):
    opened = raw_connect_and_hello(worker, "peer") if handshake else raw_connect(worker)
    with opened as peer:
        peer.send_bytes(data)
        peer.expect_refused("protocol error", *reason)


def test_oversized_frames_allocate_nothing(procs: Processes, scheduler: str):
    """Headers announcing 2 GiB bodies and 4 TiB of buffers, 50 times over: refused
    each time from the header alone; the scheduler's memory does not move."""
    before = rss(procs.scheduler.pid)
    for i in range(50):
        with raw_connect_and_hello(scheduler) as peer:
            if i % 2:
                peer.send_bytes(HEADER.pack(b"SH", 0, 2**31))
                peer.expect_refused(LIMIT)
            else:
                peer.send_bytes(HEADER.pack(b"SH", 4, 0) + BUFLEN.pack(2**40) * 4)
                peer.expect_refused(BUFFER_LIMIT)
    assert rss(procs.scheduler.pid) - before < 20 * 2**20


def test_incomplete_frame_holds_only_what_arrived(procs: Processes, scheduler: str):
    """A frame within the limit (512 MiB) that never completes: the scheduler holds
    what arrived (8 MiB), not what was announced, and lets go when the peer leaves."""
    before = rss(procs.scheduler.pid)
    with raw_connect_and_hello(scheduler) as peer:
        peer.send_bytes(HEADER.pack(b"SH", 0, 2**29) + b"\x00" * (8 * 2**20))
        procs.assert_alive()
        assert procs.info().tasks >= 0  # the scheduler answers others meanwhile
        grown = rss(procs.scheduler.pid) - before
    assert grown < 64 * 2**20, grown


@pytest.mark.parametrize("cut", [3, 8, 20], ids=lambda n: f"{n}-bytes")
def test_truncated_frame_then_hang_up(scheduler: str, worker: str, cut: int):
    data = b"".join(bytes(p) for p in encode_frame([m.InfoRequest(1)], [b"x" * 100]))
    for address in (scheduler, worker):
        with raw_connect(address) as peer:
            peer.send_bytes(data[:cut])
        with raw_connect_and_hello(address, "peer" if address == worker else "client") as peer:
            peer.send_bytes(data[:cut])


# ------------------------------------------------------------------------ handshake


@pytest.mark.parametrize(
    "first, reason",
    [
        ([m.InfoRequest(1)], "expected a Hello message first, got ['InfoRequest']"),
        ([], "expected a Hello message first, got []"),
        (
            [m.Hello(m.PROTOCOL_VERSION, "client"), m.InfoRequest(1)],
            "expected a Hello message first, got ['Hello', 'InfoRequest']",
        ),
        (
            [m.Hello(m.PROTOCOL_VERSION + 1, "client")],
            f"this side speaks version {m.PROTOCOL_VERSION}, the peer speaks version "
            f"{m.PROTOCOL_VERSION + 1}",
        ),
        ([m.Hello(-(2**63), "client")], "the peer speaks version -9223372036854775808"),
    ],
    ids=["not-hello", "empty", "hello-and-more", "newer-version", "weird-version"],
)
def test_first_frame_must_be_a_hello(scheduler: str, worker: str, first, reason: str):
    for address in (scheduler, worker):
        with raw_connect(address) as peer:
            peer.send(*first)
            peer.expect_refused(reason)


def test_unknown_roles_are_refused(scheduler: str, worker: str):
    for address, role in [(scheduler, "peer"), (scheduler, ""), (worker, "worker"), (worker, "x")]:
        with raw_connect(address) as peer:
            peer.send(m.Hello(m.PROTOCOL_VERSION, role))
            peer.expect_refused(f"does not accept role {role!r}")


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"address": "", "nthreads": 1}, "invalid or duplicate worker address ''"),
        ({"address": "no-port", "nthreads": 1}, "'no-port'"),
        ({"address": "tcp://127.0.0.1:1", "nthreads": 0}, "at least one thread, not 0"),
        ({"address": "tcp://127.0.0.1:1", "nthreads": -(2**63)}, "at least one thread"),
    ],
    ids=["no-address", "bad-address", "no-threads", "negative-threads"],
)
def test_bad_worker_hello(scheduler: str, fields: dict, reason: str):
    with raw_connect(scheduler) as peer:
        peer.send(m.Hello(m.PROTOCOL_VERSION, "worker", **fields))
        peer.expect_refused(reason)


def test_worker_hello_with_a_registered_address(procs: Processes, scheduler: str):
    with raw_connect(scheduler) as peer:
        peer.send(m.Hello(m.PROTOCOL_VERSION, "worker", address=procs.worker_address, nthreads=1))
        peer.expect_refused(f"duplicate worker address {procs.worker_address!r}")


def test_bad_hello_fields(scheduler: str):
    """Wrong types, negative or NaN resources, missing fields: refused by decoding."""
    cases = [
        (["Hello", "3", "client"], "Expected `int`, got `str`"),
        (["Hello", m.PROTOCOL_VERSION], "Expected `array` of at least length 3"),
        (
            ["Hello", m.PROTOCOL_VERSION, "worker", "", "tcp://h:1", 1, 0, 0, True, {"GPU": -1}],
            "Expected `float` >= 0.0",
        ),
        (
            [
                "Hello",
                m.PROTOCOL_VERSION,
                "worker",
                "",
                "tcp://h:1",
                1,
                0,
                0,
                True,
                {"GPU": float("nan")},
            ],
            "Expected `float` >= 0.0",
        ),
        (["Hello", m.PROTOCOL_VERSION, "client", "", "", 0, 0, 0, "yes"], "Expected `bool`"),
        (
            ["Hello", m.PROTOCOL_VERSION, "worker", "", "tcp://h:1", 1, 0, 0, True, {"": "1"}],
            "Expected `float`",
        ),
    ]
    for body, reason in cases:
        with raw_connect(scheduler) as peer:
            peer.send_raw_body([body])
            peer.expect_refused("invalid message", reason)


# ------------------------------------------------------------------------ messages

PAYLOAD = m.Payload(0, msgspec.msgpack.encode([[1], {}]))  # (args, kwargs) in msgpack


@pytest.mark.parametrize(
    "body, reason",
    [
        ([["NoSuchMessage", 1]], "NoSuchMessage"),
        ([["InfoRequest", 1], ["Payload", 1]], "Payload"),
        ([["FreeKeys", [{"a": 1}]]], "invalid message"),
        ([["WantKeys", [["a", ["b", ["c", ["d"]]]]]]], "invalid message"),
        ([["WhoHasRequest", "one", []]], "Expected `int`, got `str`"),
        ([["WhoHasRequest", 1.5, []]], "Expected `int`, got `float`"),
        ([["SubmitTasks", [["k", "", [0, b"", -1]]], []]], "Expected `int` >= 0"),
        (
            [["SubmitTasks", [["k", "", [0, b""], [], "", 0, 0, [], [[], False, {"G": -1}]]], []]],
            "Expected `float` >= 0.0",
        ),
    ],
    ids=[
        "unknown-tag",
        "struct-not-message",
        "unhashable-key",
        "key-too-deep",
        "wrong-type",
        "float-for-int",
        "negative-nbuffers",
        "negative-resource",
    ],
)
def test_undecodable_message_from_client(scheduler: str, body, reason: str):
    with raw_connect_and_hello(scheduler) as peer:
        peer.send_raw_body(body)
        peer.expect_refused("protocol error", reason)


@pytest.mark.parametrize(
    "msg, reason",
    [
        (m.TaskFinished("k", 1, 0.0, 0.0), "a client may not send TaskFinished"),
        (m.AddKeys(["k"], [1]), "a client may not send AddKeys"),
        (m.Hello(m.PROTOCOL_VERSION, "client"), "a client may not send Hello"),
        (m.Welcome(m.PROTOCOL_VERSION, "x"), "a client may not send Welcome"),
        (m.DataReply(1, [], []), "a client may not send DataReply"),
        (m.ComputeTask("k", "", PAYLOAD, (0,)), "a client may not send ComputeTask"),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, m.Message) else "",
)
def test_message_a_client_may_not_send(scheduler: str, msg: m.Message, reason: str):
    with raw_connect_and_hello(scheduler) as peer:
        peer.send(msg)
        peer.expect_refused(reason)


def test_refused_batch_is_not_applied_in_part(procs: Processes, scheduler: str):
    """A frame whose last message is refused: its earlier messages leave no trace."""
    tasks = procs.info().tasks
    with raw_connect_and_hello(scheduler) as peer:
        submit = m.SubmitTasks([m.TaskSpec("half-batch", "", PAYLOAD)], ["half-batch"], {}, "s-1")
        peer.send(submit, m.TaskFinished("half-batch", 1, 0.0, 0.0))
        peer.expect_refused("a client may not send TaskFinished")
    assert procs.info().tasks == tasks
    with raw_connect_and_hello(scheduler) as peer:
        peer.send(m.WhoHasRequest(1, ["half-batch"]))
        reply = peer.expect(m.WhoHasReply)
        assert isinstance(reply, m.WhoHasReply) and reply.who_has == [("half-batch", [])]


def test_senseless_client_requests_get_answers(scheduler: str):
    """Legal messages that make no sense are answered, and the connection stays."""
    with raw_connect_and_hello(scheduler) as peer:
        # A dependency that exists nowhere, a cycle, a function never sent.
        peer.send(
            m.SubmitTasks(
                [
                    m.TaskSpec("orphan", "", PAYLOAD, deps=["nowhere"]),
                    m.TaskSpec("cycle-a", "", PAYLOAD, deps=["cycle-b"]),
                    m.TaskSpec("cycle-b", "", PAYLOAD, deps=["cycle-a"]),
                    m.TaskSpec("self", "", PAYLOAD, deps=["self"]),
                    m.TaskSpec("nofunc", "f" * 24, PAYLOAD),
                ],
                ["orphan", "cycle-a", "self", "nofunc", "never-submitted"],
            )
        )
        replies = {}
        while len(replies) < 5:
            msg = peer.next_message()
            assert type(msg) in (m.KeyErred, m.KeyCancelled), msg
            replies[msg.key] = msg  # type: ignore[attr-defined]
        assert type(replies["never-submitted"]) is m.KeyCancelled
        assert all(type(replies[k]) is m.KeyErred for k in ["orphan", "cycle-a", "self", "nofunc"])
        # Keys nobody knows: released, cancelled, wanted (answered), asked about.
        peer.send(m.ReleaseKeys(["nobody", ("x", 1)]), m.CancelKeys([3.5]), m.WantKeys(["ghost"]))
        msg = peer.expect(m.KeyCancelled)
        assert isinstance(msg, m.KeyCancelled) and msg.key == "ghost"
        # Data scattered to a worker that does not exist: the data is lost, not assumed.
        peer.send(m.ScatterDone(["scattered"], [8], "tcp://127.0.0.1:1"))
        msg = peer.expect(m.KeyErred)
        assert isinstance(msg, m.KeyErred) and msg.key == "scattered"
        # Big lookups: every key is answered.
        keys: list[m.Key] = [("big", i) for i in range(100_000)]
        peer.send(m.WhoHasRequest(7, keys))
        reply = peer.expect(m.WhoHasReply)
        assert isinstance(reply, m.WhoHasReply) and len(reply.who_has) == len(keys)
        # NaN, huge and odd keys are keys like any other.
        peer.send(m.WantKeys([float("nan"), 2**63 - 1, -(2**63), ("", (), (("",),))]))
        for _ in range(4):
            peer.expect(m.KeyCancelled)
        peer.send(m.ReleaseKeys(["orphan", "cycle-a", "self", "nofunc", "scattered"]))


# (start, limit) of pages of the worker list that no slicing can take as they are
ODD_PAGES = [(2**62, -1), (2**62, 2**62), (2**63 - 1, 1), (2**64 - 1, 2**63), (-(2**63), 2**63 - 1)]


def test_out_of_range_worker_pages_are_answered_and_the_connection_stays(
    procs: Processes, scheduler: str
):
    with raw_connect_and_hello(scheduler) as peer:
        for rid, (start, limit) in enumerate(ODD_PAGES, 1):
            peer.send(m.InfoRequest(rid, start, limit))
            reply = peer.expect(m.InfoReply)
            assert isinstance(reply, m.InfoReply) and reply.request_id == rid
            expected = [procs.worker_address] if start < 0 else []  # from 0 when negative
            assert [w.address for w in reply.workers] == expected, (start, limit)
        peer.send(m.InfoRequest(99, -5, 0))  # an empty page from 0
        reply = peer.expect(m.InfoReply)
        assert isinstance(reply, m.InfoReply) and reply.workers == []
        peer.send(m.WhoHasRequest(100, ["x"]))  # still connected
        assert peer.expect(m.WhoHasReply).request_id == 100  # type: ignore[attr-defined]


def test_out_of_range_worker_pages_log_no_error(caplog: pytest.LogCaptureFixture):
    with (
        recording_scheduler() as s,
        caplog.at_level(logging.INFO, logger="shoal"),
        raw_connect_and_hello(s.address) as peer,
    ):
        for rid, (start, limit) in enumerate(ODD_PAGES, 1):
            peer.send(m.InfoRequest(rid, start, limit))
            assert peer.expect(m.InfoReply).request_id == rid  # type: ignore[attr-defined]
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [], [r.getMessage() for r in errors]


@contextlib.contextmanager
def scheduler_with_handshake_timeout(timeout: float) -> Iterator[Scheduler]:
    runner = LoopRunner(name="short-handshake-scheduler")
    s = Scheduler(handshake_timeout=timeout)
    try:
        runner.run_sync(s.start(), 10)
        yield s
    finally:
        runner.run_sync(s.close(), 10)
        runner.stop()


def test_handshake_deadline_defaults_to_30s():
    assert HANDSHAKE_TIMEOUT == 30.0 and Scheduler().handshake_timeout == 30.0


def test_half_a_hello_is_closed_at_the_handshake_deadline():
    hello = b"".join(bytes(p) for p in encode_frame([m.Hello(m.PROTOCOL_VERSION, "client")]))
    with scheduler_with_handshake_timeout(0.5) as s, raw_connect(s.address) as peer:
        start = time.monotonic()
        peer.send_bytes(hello[: len(hello) // 2])  # the greeting went, half a Hello
        peer.expect_refused("handshake not finished within 0.5s")
        assert 0.4 < time.monotonic() - start < 5
        with Client(s.address, timeout=10) as client:  # a whole handshake is in time
            assert client.scheduler_info()["workers"] == {}


def test_a_silent_connection_is_closed_at_the_handshake_deadline():
    with scheduler_with_handshake_timeout(0.5) as s:
        sock = socket.create_connection(parse_address(s.address), timeout=IO_TIMEOUT)
        with sock:
            start = time.monotonic()
            while sock.recv(1 << 16):  # the server's greeting, then its refusal; then EOF
                pass
            assert 0.4 < time.monotonic() - start < 5


def test_mismatched_lists_are_refused(scheduler: str):
    with raw_connect_and_hello(scheduler) as peer:
        peer.send_raw_body([["ScatterDone", ["a", "b"], [1], "tcp://127.0.0.1:1"]])
        peer.expect_refused("ScatterDone", "2 keys", "1 sizes")


# ------------------------------------------------------------------------ a fake worker


@contextlib.contextmanager
def fake_worker(procs: Processes) -> Iterator[RawPeer]:
    """A connection registered as a worker (it listens nowhere; nothing is placed on it
    while the real worker is free)."""
    with contextlib.closing(socket.socket()) as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{unused.getsockname()[1]}"
        with raw_connect_and_hello(procs.address, "worker", address=address, nthreads=1) as peer:
            yield peer
    deadline = time.monotonic() + IO_TIMEOUT
    while procs.workers() != [procs.worker_address]:  # gone when its connection is
        assert time.monotonic() < deadline, procs.workers()
        time.sleep(0.02)


def test_worker_results_for_tasks_it_was_never_given(procs: Processes, scheduler: str):
    with fake_worker(procs) as peer:
        peer.send(
            m.TaskFinished("never-given", 8, 1.0, 2.0),
            m.TaskErred("never-given-2", PAYLOAD, "tb"),
            m.AddKeys(["never-given-3"], [8]),
            m.MissingData("never-given-4", ["x"]),
        )
        freed = []
        while len(freed) < 3:
            msg = peer.expect(m.FreeKeys)
            assert isinstance(msg, m.FreeKeys)
            freed += msg.keys
        assert sorted(freed) == ["never-given", "never-given-2", "never-given-3"]
        assert len(procs.workers()) == 2  # still registered: nothing was wrong with it


@pytest.mark.parametrize(
    "body, reason",
    [
        ([["SubmitTasks", [], []]], "a worker may not send SubmitTasks"),
        ([["InfoRequest", 1]], "a worker may not send InfoRequest"),
        ([["Hello", m.PROTOCOL_VERSION, "worker"]], "a worker may not send Hello"),
        ([["AddKeys", ["a"], [1, 2]]], "AddKeys"),
        ([["TaskFinished", "k", 1, "soon", 2.0]], "Expected `float`, got `str`"),
    ],
    ids=["SubmitTasks", "InfoRequest", "Hello", "AddKeys-lengths", "TaskFinished-types"],
)
def test_bad_message_from_a_worker(procs: Processes, scheduler: str, body, reason: str):
    with fake_worker(procs) as peer:
        peer.send_raw_body(body)
        peer.expect_refused(reason)


# ------------------------------------------------------------------------ worker listener


@pytest.mark.parametrize(
    "msg, reason",
    [
        (m.ComputeTask("k", "", PAYLOAD, (0,)), "a peer may not send ComputeTask"),
        (m.DataReply(1, [], []), "a peer may not send DataReply"),
        (m.Hello(m.PROTOCOL_VERSION, "peer"), "a peer may not send Hello"),
        (m.SubmitTasks([], []), "a peer may not send SubmitTasks"),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, m.Message) else "",
)
def test_message_a_peer_may_not_send(worker: str, msg: m.Message, reason: str):
    with raw_connect_and_hello(worker, "client") as peer:
        peer.send(msg)
        peer.expect_refused(reason)


def test_bad_update_data(worker: str):
    cases: list[tuple[list[m.Message], list[bytes], list[str]]] = [
        # a payload claiming out-of-band buffers the frame does not carry
        ([m.UpdateData(1, ["a"], [m.Payload(PICKLE, b"", 3)])], [b"x"], ["claim 3", "carries 1"]),
        ([m.UpdateData(1, ["a"], [m.Payload(PICKLE, b"", 1)])], [b"x", b"y"], ["carries 2"]),
        # not a pickle
        ([m.UpdateData(1, ["a"], [m.Payload(PICKLE, b"garbage")])], [], ["error handling"]),
        ([m.UpdateData(1, ["a"], [m.Payload(99, b"")])], [], ["unknown payload kind 99"]),
    ]
    for msgs, buffers, reason in cases:
        with raw_connect_and_hello(worker, "client") as peer:
            peer.send(*msgs, buffers=buffers)
            peer.expect_refused(*reason)
    with raw_connect_and_hello(worker, "client") as peer:
        peer.send_raw_body([["UpdateData", 1, ["a", "b"], [[0, b"\x01"]]]])
        peer.expect_refused("UpdateData", "2 keys", "1 payloads")


def test_huge_get_data(worker: str):
    keys: list[m.Key] = [("missing", i) for i in range(100_000)]
    with raw_connect_and_hello(worker, "peer") as peer:
        peer.send(m.GetData(1, keys))
        reply = peer.expect(m.DataReply)
        assert isinstance(reply, m.DataReply)
        assert reply.keys == [] and len(reply.missing) == len(keys)


def test_update_data_for_a_running_task(procs: Processes, worker: str, tmp_path: Path):
    """A peer sends data under the key of a task the worker is running: the data wins
    (the running task's result will be dropped) and the scheduler hears of it, rather
    than waiting forever for a result that never comes."""
    stop = tmp_path / "stop"
    with Client(procs.address, timeout=20) as client:
        fut = client.submit(wait_for_file, str(stop), pure=False)
        deadline = time.monotonic() + 10
        while not any(w.processing for w in procs.info().workers):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with raw_connect_and_hello(worker, "client") as peer:
            peer.send(m.UpdateData(1, [fut.key], [m.Payload(0, msgspec.msgpack.encode(5))]))
            ack = peer.expect(m.Ack)
            assert isinstance(ack, m.Ack) and ack.request_id == 1
        try:
            assert fut.result(timeout=20) == 5
        finally:
            stop.touch()  # let the worker's thread go
        procs.assert_alive()
