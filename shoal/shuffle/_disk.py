"""The pieces of one shuffle run that a worker spilled: one append-only file, each
output partition's records found by their offsets and read back by its unpack (the file
goes with the run).

A chunk (one input partition's rows for this worker, grouped by output partition) is
written as one Arrow record batch per output partition: the chunk is converted once,
each piece is a zero-copy slice, and the unpack turns all of a partition's batches into
one frame with a single ``to_pandas``. Arrow is used only for a run whose frames make
the round trip unchanged (same columns, dtypes and index): frames it cannot hold
exactly (categoricals, objects it would convert, ...) are pickled piece by piece.

Record: input partition, format (Arrow or pickle), payload kind, body length, buffer
count; then the body, then each out-of-band buffer with its length (pickles only).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Container
from typing import Any

from shoal.protocol import messages as m
from shoal.protocol.serialize import dumps_value, loads_value

_RECORD = struct.Struct("<qBBQI")  # input partition, format, payload kind, body length, buffers
_LENGTH = struct.Struct("<Q")
ARROW, PICKLE = 1, 2
_IOV_MAX = 1024  # buffers one writev takes (Linux's limit)


class SpillFiles:
    """The spilled pieces of one run on this worker, in one append-only file: a chunk's
    pieces go in with one ``writev``, and each output partition's records are found by
    their offsets. Written by one thread at a time (the service's spill thread), which
    also closes it. A record is listed once its bytes are in the file; a partition may
    be read while a chunk is being written (the reader drops the records of chunks it
    took from memory), and is not written once taken."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, "spill.bin")
        self.records: dict[int, list[tuple[int, int]]] = {}  # partition -> (offset, length)
        self.schema: Any = None  # of every Arrow batch written in this run
        self.arrow: bool | None = None  # None: not yet tried
        self._fd: int | None = None
        self._end = 0  # bytes in the file

    def write(
        self,
        input_partition: int,
        frame: Any,
        offsets: dict[int, tuple[int, int]],
        skip: Container[int] = (),
    ) -> int:
        """Append each output partition's rows of ``frame`` (rows ``lo:hi`` of it),
        except the partitions in ``skip``. Returns the bytes written."""
        batch = self._to_arrow(frame)
        parts: list[Any] = []
        placed: list[tuple[int, int, int]] = []  # partition, offset, length
        end = self._end
        for p, (lo, hi) in offsets.items():
            if p in skip or hi == lo:
                continue
            if batch is not None:
                body = batch.slice(lo, hi - lo).serialize(memory_pool=_pool())
                record: list[Any] = [_RECORD.pack(input_partition, ARROW, 0, body.size, 0), body]
            else:
                payload, buffers = dumps_value(frame.iloc[lo:hi])
                record = [
                    _RECORD.pack(
                        input_partition, PICKLE, payload.kind, len(payload.data), len(buffers)
                    ),
                    payload.data,
                ]
                for b in buffers:
                    record += [_LENGTH.pack(b.nbytes), b]
            size = sum(memoryview(x).nbytes for x in record)
            placed.append((p, end, size))
            parts += record
            end += size
        if not parts:
            return 0
        self._append(parts)
        for p, offset, size in placed:
            self.records.setdefault(p, []).append((offset, size))
        written, self._end = end - self._end, end
        return written

    def read(self, partition: int) -> list[tuple[int, Any]]:
        """The pieces of ``partition`` as (input partition, Arrow batch or frame)."""
        ranges = self.records.pop(partition, None)
        if not ranges:
            return []
        fd = os.open(self.path, os.O_RDONLY)
        try:
            blobs = [os.pread(fd, size, offset) for offset, size in ranges]
        finally:
            os.close(fd)
        return [_parse(memoryview(blob), self.schema) for blob in blobs]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, parts: list[Any]) -> None:
        if self._fd is None:
            os.makedirs(self.directory, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            self._fd = os.open(self.path, flags, 0o600)
        views = [memoryview(x).cast("B") for x in parts]
        while views:
            n = os.writev(self._fd, views[:_IOV_MAX])
            while views and n >= views[0].nbytes:  # (a write may stop short)
                n -= views[0].nbytes
                views.pop(0)
            if n:
                views[0] = views[0][n:]

    def arrow_of(self, frame: Any) -> Any:
        """``frame`` as an Arrow batch of this run's schema, once Arrow is known to
        hold the run's frames exactly; else None. (Reads the schema only: any thread.)"""
        return self._to_arrow(frame) if self.arrow is True else None

    def _to_arrow(self, frame: Any) -> Any:
        """``frame`` as one Arrow record batch, or None to pickle it."""
        if self.arrow is False:
            return None
        try:
            import pyarrow as pa

            batch = pa.RecordBatch.from_pandas(frame, preserve_index=True, nthreads=1)
        except Exception:  # (pyarrow missing, or a column it cannot hold)
            return None
        if self.schema is None:
            self.arrow = _round_trips(frame, batch)
            if not self.arrow:
                return None
            self.schema = batch.schema
            return batch
        return batch if batch.schema.equals(self.schema) else None


def _parse(data: memoryview, schema: Any) -> tuple[int, Any]:
    """One record: (input partition, Arrow batch or frame)."""
    i, fmt, kind, size, nbuffers = _RECORD.unpack_from(data, 0)
    pos = _RECORD.size
    body = data[pos : pos + size]
    pos += size
    if fmt == ARROW:
        import pyarrow as pa

        return i, pa.ipc.read_record_batch(pa.py_buffer(body), schema)
    buffers = []
    for _ in range(nbuffers):
        (n,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        buffers.append(data[pos : pos + n])
        pos += n
    return i, loads_value(m.Payload(kind, bytes(body), nbuffers), buffers)


def _round_trips(frame: Any, batch: Any) -> bool:
    """Whether ``frame``'s rows come back from ``batch`` (serialised, as on disk) with
    the same columns, dtypes and index."""
    import pyarrow as pa

    if any(pa.types.is_dictionary(field.type) for field in batch.schema):
        return False  # a batch's bytes carry no dictionary
    try:
        sample = batch.slice(0, min(len(frame), 3))
        back = pa.ipc.read_record_batch(sample.serialize(), batch.schema).to_pandas()
    except Exception:
        return False
    index, back_index = frame.index, back.index
    return bool(
        list(back.columns) == list(frame.columns)
        and back.dtypes.equals(frame.dtypes)
        and type(back_index) is type(index)
        and back_index.dtype == index.dtype
        and list(back_index.names) == list(index.names)
    )


def to_frames(pieces: list[tuple[int, Any]], schema: Any) -> list[Any]:
    """Frames of ``pieces`` (sorted by input partition): each run of consecutive Arrow
    batches (of ``schema``; None: there are none) becomes one frame."""
    if schema is None:
        return [piece for _, piece in pieces]
    import pyarrow as pa

    pool = _pool()

    frames: list[Any] = []
    batches: list[Any] = []
    for _, piece in pieces:
        if isinstance(piece, pa.RecordBatch):
            batches.append(piece)
            continue
        if batches:
            frames.append(pa.Table.from_batches(batches, schema).to_pandas(memory_pool=pool))
            batches = []
        frames.append(piece)
    if batches:
        frames.append(pa.Table.from_batches(batches, schema).to_pandas(memory_pool=pool))
    return frames


def _pool() -> Any:
    """The allocator of the buffers made here: the C library's, which gives freed memory
    back; Arrow's default (mimalloc) keeps it, ~50 MB more peak RSS in a shuffle."""
    import pyarrow as pa

    return pa.system_memory_pool()
