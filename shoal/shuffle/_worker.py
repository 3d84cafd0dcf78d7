"""The worker's part of the P2P shuffle: a :class:`ShuffleService` per worker.

Transfer tasks (on task threads) hand it the rows of their input partition for each
participant; it sends them worker to worker (``ShuffleData``, one message per
destination, answered by ``Ack``) over the worker's peer connections. A transfer waits
while this worker's unacknowledged bytes pass ``send_limit`` (back-pressure) and
returns once its pieces are on their way, so the thread goes on with the next input
while they travel. Every transfer sends every participant one message (empty if it
has no rows for it): an unpack knows all its pieces are there once it has one from
each input partition, whatever the barrier saw. A send that fails for good (after a
retry on a fresh connection) errs the next transfer or unpack of that run here,
unless the scheduler restarts the shuffle first (a participant died).

Received pieces stay in memory, by run, up to ``buffer_limit`` bytes (over every
shuffle; by default a quarter of the memory limit, at most 32 MiB); past it a spill
thread writes the largest to the worker's local directory, one file per output
partition (``_disk``), while received pieces wait for their acknowledgement (so
senders slow down to the disk's pace). Unpack tasks take their partition's pieces
(memory and files), in input order. Each run is separate: data of a run older than the newest known is
refused or dropped (``ShuffleRestart``), and a task of an older run that waits is
woken with :class:`StaleRun` (its result is discarded by the scheduler anyway).

Threads: the loop thread receives and drops; task threads send and take; the spill
thread writes. One condition guards the state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shoal.comm.connection import CommClosedError
from shoal.comm.tcp import HandshakeError
from shoal.protocol import messages as m
from shoal.protocol.serialize import dumps_value, loads_value, sizeof
from shoal.shuffle._disk import SpillFiles, to_frames

if TYPE_CHECKING:
    from shoal.server.worker import Worker

logger = logging.getLogger("shoal.shuffle")

DEFAULT_BUFFER_FRACTION = 0.25  # of the worker's memory limit, for received pieces
DEFAULT_BUFFER_BYTES = 32 << 20  # and at most this: a shuffle's data is mostly on disk
DEFAULT_SEND_LIMIT = 16 << 20  # unacknowledged bytes before transfers wait
SEND_TIMEOUT = 300.0  # seconds for a peer to acknowledge one batch
# How long a task waits for data (an unpack) or a failed peer (a transfer) before it
# errs, unless a restart ends its run first (the scheduler restarts the shuffle when
# a participant dies, and says so).
WAIT_TIMEOUT = 120.0


class StaleRun(Exception):
    """This task belongs to a run of the shuffle that a newer run has replaced."""


def _env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None


class Chunk:
    """One input partition's rows for this worker, grouped by output partition."""

    __slots__ = ("frame", "offsets", "nbytes", "batch")

    def __init__(self, frame: Any, partitions: list[int], counts: list[int], nbytes: int):
        self.frame = frame
        self.batch: Any = None  # the frame as Arrow (False: not in Arrow), once asked
        self.offsets: dict[int, tuple[int, int]] = {}
        start = 0
        for p, n in zip(partitions, counts):
            self.offsets[p] = (start, start + n)
            start += n
        self.nbytes = nbytes

    def piece(self, partition: int) -> Any:
        lo, hi = self.offsets[partition]
        return self.frame.iloc[lo:hi]

    def arrow_piece(self, partition: int, disk: SpillFiles) -> Any:
        """The rows of ``partition`` as a slice of an Arrow batch of the run's schema
        (converted once), so that an unpack makes one frame of memory and disk pieces
        alike; as a frame if Arrow does not hold this run."""
        if self.batch is None:
            batch = disk.arrow_of(self.frame)
            self.batch = False if batch is None else batch
        if self.batch is False:
            return self.piece(partition)
        lo, hi = self.offsets[partition]
        return self.batch.slice(lo, hi - lo)

    def compact(self, taken: set[int]) -> int:
        """Once at most half its rows are still to be unpacked, copy those out and let
        the rest go (memory frees as the unpacks go, not with the last one). Returns
        the bytes let go."""
        keep = [(p, lo, hi) for p, (lo, hi) in self.offsets.items() if p not in taken]
        rows = sum(hi - lo for _, lo, hi in keep)
        total = len(self.frame)
        if not keep or rows * 2 > total:
            return 0
        import numpy as np

        index = np.concatenate([np.arange(lo, hi) for _, lo, hi in keep])
        self.frame = self.frame.take(index)
        self.batch = None
        self.offsets, start = {}, 0
        for p, lo, hi in keep:
            self.offsets[p] = (start, start + hi - lo)
            start += hi - lo
        freed = self.nbytes - self.nbytes * rows // total
        self.nbytes -= freed
        return freed


class RunData:
    """What this worker holds of one run of one shuffle."""

    def __init__(self, shuffle_id: str, run: int, directory: str):
        self.id = shuffle_id
        self.run = run
        self.directory = directory
        self.inputs: set[int] = set()  # input partitions whose pieces for us arrived
        self.chunks: dict[int, Chunk] = {}  # input partition -> in memory
        self.writing: dict[int, Chunk] = {}  # those the spill thread is writing
        self.disk = SpillFiles(directory)
        self.spilling = 0  # spill jobs of this run not yet done
        self.spill_error: str | None = None
        self.taken: set[int] = set()  # output partitions unpacked (their data dropped)
        self.nbytes = 0  # in memory (counting chunks being written)
        self.dropped = False

    def drop(self) -> None:
        self.chunks.clear()
        self.writing.clear()
        self.dropped = True
        if not self.spilling:  # (else the last spill job closes the file)
            self.disk.close()
        shutil.rmtree(self.directory, ignore_errors=True)  # (a spill job removes its own)


class ShuffleService:
    def __init__(self, worker: Worker, deserialise_lock: Any = None):
        self.worker = worker
        self._lock = deserialise_lock or contextlib.nullcontext()
        self.cond = threading.Condition()
        self.runs: dict[str, RunData] = {}  # shuffle id -> its newest run here
        self.floor: dict[str, int] = {}  # shuffle id -> runs up to this are over
        self.key_runs: dict[Any, m.ShuffleRun] = {}  # task key -> the run it was sent for
        self.buffered = 0  # bytes in memory over all runs
        self.spilling_bytes = 0  # of those, being written to disk
        self._held_acks: list[tuple[Any, int]] = []  # (conn, request id): sent once spilled
        self._spiller: concurrent.futures.ThreadPoolExecutor | None = None
        self.outgoing = 0  # bytes sent and not yet acknowledged
        # (id, run) -> sends not yet known to have succeeded: (destination, future)
        self.sending: dict[tuple[str, int], list[tuple[str, concurrent.futures.Future[None]]]] = {}
        self.stats: dict[tuple[str, int], list[int]] = {}  # (id, run) -> [sent, spilled]
        self.closed = False
        self.spilled_total = 0  # bytes written to disk, ever (for tests and diagnosis)
        fraction = _env_number("SHOAL_SHUFFLE_BUFFER_FRACTION", DEFAULT_BUFFER_FRACTION)
        limit = min(worker.memory_limit * fraction, DEFAULT_BUFFER_BYTES)
        self.buffer_limit = int(_env_number("SHOAL_SHUFFLE_BUFFER_BYTES", limit))
        self.send_limit = int(_env_number("SHOAL_SHUFFLE_SEND_LIMIT", DEFAULT_SEND_LIMIT))

    # ---------------------------------------------------------------- loop thread

    def on_compute(self, msg: m.ComputeTask) -> None:
        info = msg.shuffle
        assert info is not None
        with self.cond:
            self.key_runs[msg.key] = info
            self._adopt(info.id, info.run)

    def on_restart(self, shuffle_id: str, run: int) -> None:
        with self.cond:
            self._adopt(shuffle_id, run)

    def on_forget(self, shuffle_id: str, run: int) -> None:
        with self.cond:
            self.floor[shuffle_id] = max(run, self.floor.get(shuffle_id, 0))
            rd = self.runs.get(shuffle_id)
            if rd is not None and rd.run <= run:
                self._drop(rd)
            self.key_runs = {k: v for k, v in self.key_runs.items() if v.id != shuffle_id}
            self.sending = {k: v for k, v in self.sending.items() if k[0] != shuffle_id}
            self.cond.notify_all()

    def receive(self, conn: Any, msg: m.ShuffleData, buffers: list[memoryview]) -> None:
        """A peer's pieces (on the loop): kept if they belong to the newest run, then
        acknowledged either way (a stale sender's task is being discarded)."""
        frame = None
        if msg.payloads:
            with self._lock:
                frame = loads_value(msg.payloads[0], buffers)
        nbytes = sum(memoryview(b).nbytes for b in buffers) + sum(len(p.data) for p in msg.payloads)
        self._store(msg.id, msg.run, msg.input_partition, msg.partitions, msg.counts, frame, nbytes)
        with self.cond:
            if self.spilling_bytes and self.buffered > self.buffer_limit:
                self._held_acks.append((conn, msg.request_id))  # the sender waits for the disk
                return
        conn.send(m.Ack(msg.request_id))

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for rd in self.runs.values():
                rd.drop()
            self.runs.clear()
            acks, self._held_acks = self._held_acks, []
            self.cond.notify_all()
        for conn, request_id in acks:  # (senders are told; their data is gone anyway)
            conn.send(m.Ack(request_id))
        if self._spiller is not None:
            self._spiller.shutdown(wait=False)

    # ---------------------------------------------------------------- task threads

    def run_for(self, key: Any) -> m.ShuffleRun | None:
        with self.cond:
            return self.key_runs.get(key)

    def send(
        self, info: m.ShuffleRun, input_partition: int, batches: dict[str, tuple[Any, ...]]
    ) -> None:
        """Send each participant its rows of ``input_partition`` (our own are kept
        here); return once they are on their way. Raises StaleRun if the run ends, and
        the error of an earlier send of this run that failed for good."""
        loop = self.worker._loop
        assert loop is not None
        self._check_sends(info)
        pending: list[tuple[str, concurrent.futures.Future[None]]] = []
        for address, (partitions, counts, frame) in batches.items():
            if address == self.worker.address:
                nbytes = sizeof(frame) if frame is not None else 0
                self._store(info.id, info.run, input_partition, partitions, counts, frame, nbytes)
                self.wait_for_room(info)
                continue
            payloads: list[m.Payload] = []
            buffers: list[memoryview] = []
            if frame is not None:
                payload, buffers = dumps_value(frame)
                payloads = [payload]
            nbytes = sum(b.nbytes for b in buffers) + sum(len(p.data) for p in payloads)
            self._reserve(info, nbytes)

            def make(
                rid: int,
                p: list[int] = partitions,
                c: list[int] = counts,
                payloads: list[m.Payload] = payloads,
            ) -> m.Message:  # (bound now: it is called later, on the loop)
                return m.ShuffleData(rid, info.id, info.run, input_partition, p, c, payloads)

            fut = asyncio.run_coroutine_threadsafe(self._send(address, make, buffers), loop)
            fut.add_done_callback(functools.partial(self._acknowledged, nbytes))
            pending.append((address, fut))
        with self.cond:
            self.sending.setdefault((info.id, info.run), []).extend(pending)

    def take(self, info: m.ShuffleRun, partition: int, ninputs: int) -> list[Any]:
        """The rows of output ``partition`` from every input, as frames in input order,
        once every input's pieces have arrived here."""
        self._check_sends(info)
        deadline = time.monotonic() + WAIT_TIMEOUT
        with self.cond:
            while True:
                rd = self._current(info)
                if rd is not None and len(rd.inputs) >= ninputs:
                    break
                if time.monotonic() > deadline:
                    have = 0 if rd is None else len(rd.inputs)
                    raise RuntimeError(
                        f"P2P shuffle {info.id} run {info.run}: the pieces of {have} of "
                        f"{ninputs} input partitions reached {self.worker.address} within "
                        f"{WAIT_TIMEOUT:g}s"
                    )
                self.cond.wait(0.5)
            if rd.spill_error is not None:
                raise RuntimeError(
                    f"P2P shuffle {info.id} run {info.run}: could not spill to "
                    f"{rd.directory}: {rd.spill_error}"
                )
            if partition in rd.taken:
                raise RuntimeError(
                    f"P2P shuffle {info.id} run {info.run}: output partition {partition} "
                    "was unpacked already and its pieces dropped"
                )
            rd.taken.add(partition)  # (no spill job starting now writes its pieces)
            pieces = []
            arrow = rd.disk.arrow is True
            for chunks in (rd.chunks, rd.writing):  # (a chunk being written is still here)
                for i, chunk in chunks.items():
                    if partition in chunk.offsets:
                        piece = chunk.arrow_piece(partition, rd.disk) if arrow else None
                        pieces.append((i, piece if arrow else chunk.piece(partition)))
            self._forget_taken(rd)
        # An input has one piece per partition: a record of a chunk that was being
        # written is the piece already taken from memory.
        in_memory = {i for i, _ in pieces}
        pieces.extend(piece for piece in rd.disk.read(partition) if piece[0] not in in_memory)
        pieces.sort(key=lambda item: item[0])
        return to_frames(pieces, rd.disk.schema)

    def take_stats(self, info: m.ShuffleRun) -> tuple[int, int]:
        """(sent, spilled) bytes of this run since the last call."""
        with self.cond:
            sent, spilled = self.stats.pop((info.id, info.run), (0, 0))
        return sent, spilled

    # ---------------------------------------------------------------- internals

    def _adopt(self, shuffle_id: str, run: int) -> RunData | None:
        """The data of ``run`` (newer runs replace older ones); None if it is stale.
        Holds ``cond``."""
        if run <= self.floor.get(shuffle_id, 0) or self.closed:
            return None
        rd = self.runs.get(shuffle_id)
        if rd is not None:
            if rd.run == run:
                return rd
            if rd.run > run:
                return None
            self._drop(rd)
        directory = os.path.join(self.worker.local_directory, "shuffle", f"{shuffle_id}-{run}")
        rd = self.runs[shuffle_id] = RunData(shuffle_id, run, directory)
        self.cond.notify_all()  # a task of an older run wakes, and ends
        return rd

    def _drop(self, rd: RunData) -> None:
        self.sending.pop((rd.id, rd.run), None)
        self.buffered -= rd.nbytes
        rd.drop()
        if self.runs.get(rd.id) is rd:
            del self.runs[rd.id]
        self.cond.notify_all()

    def _current(self, info: m.ShuffleRun) -> RunData | None:
        """The data of the run ``info`` (None: not yet); StaleRun if that run is over."""
        if self.closed:
            raise StaleRun(f"worker {self.worker.address} is closing")
        rd = self.runs.get(info.id)
        if info.run <= self.floor.get(info.id, 0) or (rd is not None and rd.run > info.run):
            raise StaleRun(f"P2P shuffle {info.id} run {info.run} was replaced or ended")
        return rd if rd is not None and rd.run == info.run else None

    def _store(
        self,
        shuffle_id: str,
        run: int,
        input_partition: int,
        partitions: list[int],
        counts: list[int],
        frame: Any,
        nbytes: int,
    ) -> None:
        with self.cond:
            rd = self._adopt(shuffle_id, run)
            if rd is None or input_partition in rd.inputs:
                return  # stale, or a transfer that ran twice (the same rows)
            rd.inputs.add(input_partition)
            if frame is not None:
                rd.chunks[input_partition] = Chunk(frame, partitions, counts, nbytes)
                rd.nbytes += nbytes
                self.buffered += nbytes
                if self.buffered > self.buffer_limit:
                    self._spill()
            self.cond.notify_all()

    def wait_for_room(self, info: m.ShuffleRun) -> None:
        """Our own rows wait (as a peer's do for their acknowledgement) while the
        buffer is over its limit and the spill thread is writing."""
        with self.cond:
            while self.spilling_bytes and self.buffered > self.buffer_limit:
                self._check_live(info)
                self.cond.wait(0.5)

    def _spill(self) -> None:
        """Hand the largest chunks to the spill thread until, once written, the buffer
        is half full. Holds cond."""
        target = self.buffer_limit // 2
        chunks = [
            (chunk.nbytes, rd, i) for rd in self.runs.values() for i, chunk in rd.chunks.items()
        ]
        chunks.sort(key=lambda c: -c[0])
        if self._spiller is None:
            self._spiller = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="shoal-shuffle-spill"
            )
        for nbytes, rd, i in chunks:
            if self.buffered - self.spilling_bytes <= target:
                break
            self.spilling_bytes += nbytes
            rd.spilling += 1
            chunk = rd.writing[i] = rd.chunks.pop(i)
            # (a chunk a job: whoever waits for room goes on after the first)
            self._spiller.submit(self._write_chunks, rd, [(i, chunk)])

    def _write_chunks(self, rd: RunData, job: list[tuple[int, Chunk]]) -> None:
        """On the spill thread: write these chunks of ``rd``, then let go of them."""
        with self.cond:
            taken = set(rd.taken)
        written, error = 0, None
        try:
            for i, chunk in job:
                if rd.dropped:
                    break
                written += rd.disk.write(i, chunk.frame, chunk.offsets, taken)
        except Exception as e:  # a full disk, a piece that cannot be pickled, ...
            error = f"{type(e).__name__}: {e}"
            logger.warning("shuffle %s run %s: spilling failed: %s", rd.id, rd.run, error)
        nbytes = sum(chunk.nbytes for _, chunk in job)
        with self.cond:
            for i, _ in job:
                rd.writing.pop(i, None)
            rd.spilling -= 1
            self.spilling_bytes -= nbytes
            if rd.dropped:  # (its bytes left the buffer then)
                if not rd.spilling:
                    rd.disk.close()
                shutil.rmtree(rd.directory, ignore_errors=True)
            else:
                rd.nbytes -= nbytes
                self.buffered -= nbytes
                rd.spill_error = rd.spill_error or error
                self.stats.setdefault((rd.id, rd.run), [0, 0])[1] += written
                self.spilled_total += written
            if self.buffered > self.buffer_limit:
                self._spill()
            acks: list[tuple[Any, int]] = []
            if not self.spilling_bytes or self.buffered <= self.buffer_limit:
                acks, self._held_acks = self._held_acks, []
            self.cond.notify_all()
        loop = self.worker._loop
        for conn, request_id in acks:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(conn.send, m.Ack(request_id))

    def _forget_taken(self, rd: RunData) -> None:
        """Drop the chunks every output partition of which has been unpacked here, and
        shrink those mostly unpacked."""
        for i, chunk in list(rd.chunks.items()):
            if rd.taken.issuperset(chunk.offsets):
                freed = rd.chunks.pop(i).nbytes
            else:
                freed = chunk.compact(rd.taken)
            rd.nbytes -= freed
            self.buffered -= freed

    def _reserve(self, info: m.ShuffleRun, nbytes: int) -> None:
        """Back-pressure: wait while too many bytes are unacknowledged."""
        with self.cond:
            while self.outgoing and self.outgoing + nbytes > self.send_limit:
                self._check_live(info)
                self.cond.wait(0.5)
            self._check_live(info)
            self.outgoing += nbytes
            self.stats.setdefault((info.id, info.run), [0, 0])[0] += nbytes

    def _acknowledged(self, nbytes: int, _: object) -> None:
        with self.cond:
            self.outgoing -= nbytes
            self.cond.notify_all()

    def _check_live(self, info: m.ShuffleRun) -> None:
        if self.closed:
            raise StaleRun(f"worker {self.worker.address} is closing")
        rd = self.runs.get(info.id)
        if info.run <= self.floor.get(info.id, 0) or (rd is not None and rd.run > info.run):
            raise StaleRun(f"P2P shuffle {info.id} run {info.run} was replaced or ended")

    def _check_sends(self, info: m.ShuffleRun) -> None:
        """Raise the error of a send of this run that failed for good. A peer that
        fails is, most likely, dying: wait a while for the scheduler to restart the
        shuffle (StaleRun) first."""
        key = (info.id, info.run)
        failed_at: float | None = None
        with self.cond:
            while True:
                self._check_live(info)
                sends = self.sending.get(key, [])
                errors = [(a, f.exception()) for a, f in sends if f.done() and f.exception()]
                if not errors:
                    self.sending[key] = [(a, f) for a, f in sends if not f.done()]
                    return
                failed_at = failed_at or time.monotonic()
                if time.monotonic() - failed_at > WAIT_TIMEOUT:
                    address, exc = errors[0]
                    raise RuntimeError(
                        f"P2P shuffle {info.id} run {info.run}: could not send to {address}: {exc}"
                    ) from exc
                self.cond.wait(0.5)

    async def _send(
        self, address: str, make: Callable[[int], m.Message], buffers: list[memoryview]
    ) -> None:
        error: BaseException | None = None
        for _ in range(2):  # once more on a fresh connection
            try:
                conn = await self.worker._peers.get(address)
                await conn.request(make, list(buffers), timeout=SEND_TIMEOUT)
                return
            except (OSError, CommClosedError, HandshakeError, TimeoutError) as e:
                error = e
                logger.info("shuffle data to %s failed: %s", address, e)
        assert error is not None
        raise error
