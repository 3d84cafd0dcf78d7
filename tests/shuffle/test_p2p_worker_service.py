"""The worker's shuffle service on its own (a real event loop in a thread, fake peers):
back-pressure on sending, pieces kept per run, spilling past the buffer limit, unpacks
reading memory and disk in input order, stale runs refused and waiters woken."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest

from shoal.protocol import messages as m
from shoal.protocol.serialize import dumps_value
from shoal.shuffle._disk import SpillFiles
from shoal.shuffle._split import split_by_destination
from shoal.shuffle._worker import Chunk, ShuffleService, StaleRun

pytestmark = pytest.mark.timeout(60)

ME, PEER1, PEER2 = "tcp://me:1", "tcp://p1:1", "tcp://p2:1"


class FakeConn:
    """Requests wait until the test acknowledges them, one by one."""

    def __init__(self) -> None:
        self.requests: list[tuple[m.ShuffleData, asyncio.Event]] = []
        self.sent: list[m.Message] = []

    async def request(self, make: Any, buffers: list[Any], timeout: float | None = None) -> Any:
        msg = make(len(self.requests) + 1)
        ack = asyncio.Event()
        self.requests.append((msg, ack))
        await ack.wait()
        return m.Ack(msg.request_id), []

    def send(self, msg: m.Message, buffers: list[Any] | None = None) -> None:
        self.sent.append(msg)


class FakePeers:
    def __init__(self, conn: FakeConn):
        self.conn = conn

    async def get(self, address: str) -> FakeConn:
        return self.conn


class FakeWorker:
    def __init__(self, loop: asyncio.AbstractEventLoop, directory: str, conn: FakeConn):
        self.address = ME
        self.memory_limit = 10**9
        self.local_directory = directory
        self._loop = loop
        self._peers = FakePeers(conn)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def frame(n: int, partitions: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "v": np.arange(n),
            "s": pd.array([None if i % 9 == 0 else f"s{i}" for i in range(n)], "string"),
            "c": pd.Categorical([["a", "b"][i % 2] for i in range(n)]),
            "_partitions": rng.integers(0, partitions, n),
        }
    )


def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_transfer_waits_while_too_many_bytes_are_unacknowledged(loop, tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_SHUFFLE_SEND_LIMIT", "3000")
    conn = FakeConn()
    service = ShuffleService(FakeWorker(loop, str(tmp_path), conn))  # type: ignore[arg-type]
    info = m.ShuffleRun("s", 1, [ME, PEER1, PEER2])
    batches = split_by_destination(frame(400, 6), "_partitions", 6, info.participants)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (service.send(info, 0, batches), done.set()))
    thread.start()
    until(lambda: len(conn.requests) == 1)
    time.sleep(0.2)
    assert len(conn.requests) == 1 and not done.is_set()  # the second waits for room
    assert service.outgoing > 0
    loop.call_soon_threadsafe(conn.requests[0][1].set)
    until(lambda: len(conn.requests) == 2)
    until(done.is_set)  # it returns once its pieces are on their way
    thread.join(5)
    assert service.outgoing > 0
    loop.call_soon_threadsafe(conn.requests[1][1].set)
    until(lambda: service.outgoing == 0)
    assert {msg.id for msg, _ in conn.requests} == {"s"}
    # our own rows stayed here, without a trip through the network
    assert service.runs["s"].inputs == {0}


def receive(service: ShuffleService, run: int, i: int, df: pd.DataFrame, npart: int) -> None:
    batches = split_by_destination(df, "_partitions", npart, [ME])
    partitions, counts, rows = batches[ME]
    payloads, buffers = [], []
    if rows is not None:
        payload, buffers = dumps_value(rows)
        payloads = [payload]
    msg = m.ShuffleData(i + 1, "s", run, i, partitions, counts, payloads)
    service.receive(FakeConn(), msg, [memoryview(bytes(b)) for b in buffers])


def test_pieces_spill_past_the_limit_and_unpack_in_input_order(loop, tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_SHUFFLE_BUFFER_BYTES", "2000")
    conn = FakeConn()
    service = ShuffleService(FakeWorker(loop, str(tmp_path), conn))  # type: ignore[arg-type]
    inputs = [frame(300, 3, seed=i) for i in range(4)]
    for i, df in enumerate(inputs):
        receive(service, 1, i, df, 3)
    receive(service, 1, 2, inputs[2], 3)  # a transfer that ran twice: counted once
    until(lambda: service.runs["s"].spilling == 0)  # (the spill thread writes)
    assert service.spilled_total > 0
    assert os.listdir(service.runs["s"].directory)
    info = m.ShuffleRun("s", 1, [ME])
    for p in range(3):
        got = pd.concat(service.take(info, p, ninputs=4))
        want = pd.concat([df[df["_partitions"] == p] for df in inputs]).drop(columns="_partitions")
        pd.testing.assert_frame_equal(got, want)
    with pytest.raises(RuntimeError, match="unpacked already"):
        service.take(info, 0, ninputs=4)


def test_older_runs_are_refused_and_their_waiters_woken(loop, tmp_path):
    conn = FakeConn()
    service = ShuffleService(FakeWorker(loop, str(tmp_path), conn))  # type: ignore[arg-type]
    receive(service, 5, 0, frame(50, 2), 2)
    old = m.ShuffleRun("s", 5, [ME])
    errors: list[BaseException] = []

    def unpack() -> None:
        try:
            service.take(old, 0, ninputs=2)  # the second input never comes in run 5
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=unpack)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()
    service.on_restart("s", 7)
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], StaleRun)
    receive(service, 5, 1, frame(50, 2, seed=1), 2)  # late rows of run 5: dropped
    assert service.runs["s"].run == 7 and service.runs["s"].inputs == set()
    service.on_forget("s", 7)
    assert "s" not in service.runs
    receive(service, 7, 0, frame(50, 2), 2)  # after the end of run 7: refused
    assert "s" not in service.runs
    with pytest.raises(StaleRun):
        service.take(m.ShuffleRun("s", 7, [ME]), 0, ninputs=1)


def plain_frame(n: int, partitions: int, seed: int = 0) -> pd.DataFrame:
    """Columns Arrow holds exactly: spilled as Arrow batches."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "v": np.arange(n) + 1000 * seed,
            "f": np.where(rng.random(n) < 0.1, np.nan, rng.random(n)),
            "s": pd.array([None if i % 7 == 0 else f"s{i}" for i in range(n)], "string"),
            "_partitions": rng.integers(0, partitions, n),
        },
        index=pd.date_range("2000", periods=n, freq="s", name="when") + pd.Timedelta(days=seed),
    )


def test_plain_frames_spill_as_arrow_and_come_back_equal(loop, tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_SHUFFLE_BUFFER_BYTES", "25000")  # about 2.5 inputs
    service = ShuffleService(FakeWorker(loop, str(tmp_path), FakeConn()))  # type: ignore[arg-type]
    inputs = [plain_frame(300, 4, seed=i) for i in range(5)]
    for i, df in enumerate(inputs):
        receive(service, 1, i, df, 4)
    rd = service.runs["s"]
    until(lambda: rd.spilling == 0)
    assert rd.disk.arrow is True and service.spilled_total > 0
    assert rd.chunks  # some pieces stayed in memory: unpacks merge both, in input order
    info = m.ShuffleRun("s", 1, [ME])
    for p in range(4):
        frames = service.take(info, p, ninputs=5)
        want = pd.concat([df[df["_partitions"] == p] for df in inputs]).drop(columns="_partitions")
        pd.testing.assert_frame_equal(pd.concat(frames), want)
    assert os.listdir(rd.directory) == ["spill.bin"]
    service.on_forget("s", 1)
    assert not os.path.exists(rd.directory)  # the file goes with the run


def test_frames_arrow_cannot_hold_exactly_are_pickled(loop, tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_SHUFFLE_BUFFER_BYTES", "2000")
    service = ShuffleService(FakeWorker(loop, str(tmp_path), FakeConn()))  # type: ignore[arg-type]
    objects = [frame(200, 2, seed=i).astype({"s": object}) for i in range(3)]
    for i, df in enumerate(objects):
        receive(service, 1, i, df, 2)
    rd = service.runs["s"]
    until(lambda: rd.spilling == 0)
    assert rd.disk.arrow is False and service.spilled_total > 0
    frames = service.take(m.ShuffleRun("s", 1, [ME]), 1, ninputs=3)
    want = pd.concat([df[df["_partitions"] == 1] for df in objects]).drop(columns="_partitions")
    pd.testing.assert_frame_equal(pd.concat(frames), want)  # object stays object


def test_acknowledgements_wait_while_the_disk_is_behind(loop, tmp_path, monkeypatch):
    release = threading.Event()
    real_write = SpillFiles.write

    def slow_write(self: SpillFiles, *args: Any, **kwargs: Any) -> int:
        release.wait(10)
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(SpillFiles, "write", slow_write)
    messages = []
    for i in range(3):
        rows = split_by_destination(plain_frame(200, 2, seed=i), "_partitions", 2, [ME])[ME]
        payload, buffers = dumps_value(rows[2])
        msg = m.ShuffleData(i + 1, "s", 1, i, rows[0], rows[1], [payload])
        messages.append((msg, [memoryview(bytes(b)) for b in buffers]))
    size = sum(b.nbytes for b in messages[0][1]) + len(messages[0][0].payloads[0].data)
    monkeypatch.setenv("SHOAL_SHUFFLE_BUFFER_BYTES", str(size * 3 // 2))
    service = ShuffleService(FakeWorker(loop, str(tmp_path), FakeConn()))  # type: ignore[arg-type]
    conns = [FakeConn() for _ in range(3)]
    for conn, (msg, buffers) in zip(conns, messages):
        service.receive(conn, msg, buffers)
    assert conns[0].sent == [m.Ack(1)]  # under the limit
    assert conns[1].sent == conns[2].sent == []  # past it, while the spill thread writes
    assert service.spilling_bytes > 0
    release.set()
    until(lambda: all(c.sent for c in conns))
    assert [c.sent for c in conns] == [[m.Ack(1)], [m.Ack(2)], [m.Ack(3)]]
    until(lambda: service.runs["s"].spilling == 0)
    frames = service.take(m.ShuffleRun("s", 1, [ME]), 0, ninputs=3)
    assert sum(len(f) for f in frames) == sum(
        int((plain_frame(200, 2, seed=i)["_partitions"] == 0).sum()) for i in range(3)
    )


class FailingPeers:
    async def get(self, address: str) -> Any:
        raise OSError(f"connection to {address} refused")


def test_a_send_that_fails_for_good_errs_the_next_transfer_and_unpack(loop, tmp_path, monkeypatch):
    monkeypatch.setattr("shoal.shuffle._worker.WAIT_TIMEOUT", 0.5)  # no restart comes
    worker = FakeWorker(loop, str(tmp_path), FakeConn())
    worker._peers = FailingPeers()  # type: ignore[assignment]
    service = ShuffleService(worker)  # type: ignore[arg-type]
    info = m.ShuffleRun("s", 1, [ME, PEER1])
    batches = split_by_destination(frame(100, 2), "_partitions", 2, info.participants)
    service.send(info, 0, batches)  # on its way: the failure is not known yet
    until(lambda: all(f.done() for _, f in service.sending[("s", 1)]))
    with pytest.raises(RuntimeError, match="could not send to tcp://p1:1: connection"):
        service.send(info, 1, batches)
    with pytest.raises(RuntimeError, match="could not send to tcp://p1:1"):
        service.take(info, 0, ninputs=2)


def test_a_chunk_mostly_unpacked_lets_go_of_those_rows():
    df = plain_frame(400, 4).drop(columns="_partitions")
    counts = [100, 100, 100, 100]
    chunk = Chunk(df, [0, 1, 2, 3], counts, nbytes=4000)
    assert chunk.compact({0}) == 0  # three quarters still to come: kept as it is
    assert chunk.compact({0, 2}) == 2000
    assert chunk.nbytes == 2000 and len(chunk.frame) == 200
    pd.testing.assert_frame_equal(chunk.piece(1), df.iloc[100:200], check_freq=False)
    pd.testing.assert_frame_equal(chunk.piece(3), df.iloc[300:400], check_freq=False)


def test_an_unpack_does_not_wait_for_the_disk_nor_count_a_piece_twice(loop, tmp_path, monkeypatch):
    """A chunk whose pieces are on disk but whose spill job has not ended is still in
    memory: the unpack takes each input's piece once."""
    written, release = threading.Event(), threading.Event()
    real_write = SpillFiles.write

    def write_then_hang(self: SpillFiles, *args: Any, **kwargs: Any) -> int:
        n = real_write(self, *args, **kwargs)
        written.set()
        release.wait(10)
        return n

    monkeypatch.setattr(SpillFiles, "write", write_then_hang)
    monkeypatch.setenv("SHOAL_SHUFFLE_BUFFER_BYTES", "3000")
    service = ShuffleService(FakeWorker(loop, str(tmp_path), FakeConn()))  # type: ignore[arg-type]
    inputs = [plain_frame(100, 2, seed=i) for i in range(2)]
    for i, df in enumerate(inputs):
        receive(service, 1, i, df, 2)
    assert written.wait(5)
    rd = service.runs["s"]
    assert rd.writing and any(rd.disk.records.values())  # on disk, and still in memory
    frames = service.take(m.ShuffleRun("s", 1, [ME]), 0, ninputs=2)  # does not wait
    want = pd.concat([df[df["_partitions"] == 0] for df in inputs]).drop(columns="_partitions")
    pd.testing.assert_frame_equal(pd.concat(frames), want)
    release.set()
    until(lambda: rd.spilling == 0)
    frames = service.take(m.ShuffleRun("s", 1, [ME]), 1, ninputs=2)
    want = pd.concat([df[df["_partitions"] == 1] for df in inputs]).drop(columns="_partitions")
    pd.testing.assert_frame_equal(pd.concat(frames), want)
