"""SpillBuffer: a worker's results, the least recently used ones moved to disk.

The worker state machine uses it as its ``data`` mapping. Values live in memory until
the bytes they take pass ``target``; then the least recently used ones are written to
files in ``directory`` (serialised as for the wire, pickle-5 buffers kept apart), and
read back, transparently, the next time their key is read. The worker's memory monitor
also calls :meth:`evict` when the process as a whole uses too much memory.

Task threads read it while the event loop thread writes it: every method holds a lock.
A value that cannot be pickled is kept in memory and reported once through
``on_unserializable(key, reason)`` (possibly from a task thread); the worker then drops
it through its state machine, never this mapping on its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import msgspec

from shoal.protocol.messages import Key, Payload
from shoal.protocol.serialize import SerializationError, dumps_value, loads_value, sizeof

logger = logging.getLogger("shoal.spill")

_HEADER = struct.Struct("<I")  # length of the msgpack header that starts every file


class SpillBuffer(MutableMapping[Key, Any]):
    def __init__(
        self,
        directory: str,
        target: int | None = None,
        on_unserializable: Callable[[Key, str], None] | None = None,
    ):
        self.directory = directory
        self.target = target  # bytes in memory past which values go to disk; None: never
        self.on_unserializable = on_unserializable
        self._lock = threading.RLock()
        self._fast: OrderedDict[Key, Any] = OrderedDict()  # least recently used first
        self._sizes: dict[Key, int] = {}  # of the values in memory
        self._slow: dict[Key, tuple[str, int, int]] = {}  # key -> (path, size, file bytes)
        self._unspillable: set[Key] = set()  # could not be pickled: stays in memory
        self._files = 0
        self.memory_bytes = 0  # estimated size of the values in memory
        self.spilled_bytes = 0  # bytes of the files on disk
        self.spill_count = 0  # values written to disk so far
        self.unspill_count = 0  # values read back so far

    # ---------------------------------------------------------------- mapping

    def __getitem__(self, key: Key) -> Any:
        with self._lock:
            if key in self._fast:
                self._fast.move_to_end(key)
                return self._fast[key]
            path, size, nbytes = self._slow[key]  # KeyError: not here at all
            value = _read(path)
            del self._slow[key]
            self.spilled_bytes -= nbytes
            os.unlink(path)
            self.unspill_count += 1
            self._keep(key, value, size)
            return value

    def __setitem__(self, key: Key, value: Any) -> None:
        self.store(key, value, sizeof(value))

    def store(self, key: Key, value: Any, size: int) -> None:
        """``self[key] = value`` for a value whose size is known (its task's thread
        measured it with the same ``sizeof``): a result is not measured twice."""
        with self._lock:
            if key in self._fast or key in self._slow:
                del self[key]
            self._keep(key, value, size)

    def __delitem__(self, key: Key) -> None:
        with self._lock:
            if key in self._fast:
                del self._fast[key]
                self.memory_bytes -= self._sizes.pop(key)
                self._unspillable.discard(key)
            else:
                path, _, nbytes = self._slow.pop(key)
                self.spilled_bytes -= nbytes
                os.unlink(path)

    def __contains__(self, key: object) -> bool:
        return key in self._fast or key in self._slow

    def __len__(self) -> int:
        return len(self._fast) + len(self._slow)

    def in_memory(self, key: Key) -> bool:
        """Whether ``key``'s value is in memory (reading it touches no disk)."""
        return key in self._fast

    def __iter__(self) -> Iterator[Key]:
        with self._lock:
            keys = [*self._fast, *self._slow]
        return iter(keys)

    # ---------------------------------------------------------------- spilling

    @property
    def spilled_count(self) -> int:
        """Values on disk now."""
        return len(self._slow)

    @property
    def spilled_keys(self) -> set[Key]:
        with self._lock:
            return set(self._slow)

    def evict(self) -> int:
        """Write the least recently used value that can be pickled to disk. Returns its
        estimated size (at least 1), or 0 if no value in memory can go (or the disk failed)."""
        with self._lock:
            while True:  # the least recently used value that can be pickled
                key = next((k for k in self._fast if k not in self._unspillable), None)
                if key is None:
                    return 0
                try:
                    payload, buffers = dumps_value(self._fast[key])
                    break
                except SerializationError as e:
                    self._unspillable.add(key)
                    if self.on_unserializable is not None:
                        self.on_unserializable(key, str(e))
            try:
                path, nbytes = self._write(payload, buffers)
            except OSError as e:  # e.g. a full disk: keep everything in memory
                logger.warning("could not spill %r to %s: %s", key, self.directory, e)
                return 0
            del self._fast[key]
            size = self._sizes.pop(key)
            self.memory_bytes -= size
            self._slow[key] = (path, size, nbytes)
            self.spilled_bytes += nbytes
            self.spill_count += 1
            return max(size, 1)  # an empty array weighs 0 bytes, but was spilled

    def clear(self) -> None:
        """Forget every value and remove the spill files."""
        with self._lock:
            self._fast.clear()
            self._sizes.clear()
            self._unspillable.clear()
            for path, _, _ in self._slow.values():
                os.unlink(path)
            self._slow.clear()
            self.memory_bytes = self.spilled_bytes = 0

    def close(self) -> None:
        """Remove the spill directory (the values in memory are dropped too)."""
        self.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _keep(self, key: Key, value: Any, size: int) -> None:
        self._fast[key] = value
        self._sizes[key] = size
        self.memory_bytes += size
        target = self.target
        if target is not None:
            while self.memory_bytes > target and self.evict():
                pass

    def _write(self, payload: Payload, buffers: list[memoryview]) -> tuple[str, int]:
        self._files += 1
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"{self._files}.spill")
        header = msgspec.msgpack.encode(
            [payload.kind, len(payload.data), [b.nbytes for b in buffers]]
        )
        try:
            with open(path, "wb") as f:
                f.write(_HEADER.pack(len(header)))
                f.write(header)
                f.write(payload.data)
                for b in buffers:
                    f.write(b)
                return path, f.tell()
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)  # no half-written file left behind
            raise


def _read(path: str) -> Any:
    with open(path, "rb") as f:
        raw = bytearray(os.fstat(f.fileno()).st_size)  # writable: arrays come back writable
        f.readinto(raw)
    view = memoryview(raw)
    (n,) = _HEADER.unpack_from(view)
    kind, ndata, lengths = msgspec.msgpack.decode(view[_HEADER.size : _HEADER.size + n])
    start = _HEADER.size + n
    data = bytes(view[start : start + ndata])
    start += ndata
    buffers = []
    for length in lengths:
        buffers.append(view[start : start + length])
        start += length
    return loads_value(Payload(kind, data, len(buffers)), buffers)
