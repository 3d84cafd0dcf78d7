"""Recycled receive buffers: large out-of-band buffers land in memory already faulted in.

Receiving into fresh memory is bounded by the cost of faulting it in (on a busy VM,
257-1,650 MB/s for 1 GB), not by the copy out of the socket (about 3 GB/s over
loopback into memory already touched; ``benchmarks/same_host_prototype.py``). So the
out-of-band buffers of pickled values (numpy arrays, pandas blocks) at least
``MIN_SIZE`` large are received into *regions*: private anonymous ``mmap`` s, advised
huge pages, that go back to a pool once nothing can see them, for the next large
buffer to reuse. ``bytes`` values own their storage and never come from the pool.

Lifetime. A region is lent out behind a *carrier*: a numpy ``uint8`` array over its
first ``n`` bytes. The decoder hands pickle a memoryview of the carrier, so every
array or frame rebuilt from the buffer holds the carrier through its base chain (a
memoryview or array over another holds its exporter), and nothing reaches the bytes
without it. A ``weakref.finalize`` on the carrier gives the region back when the
carrier is collected: at that point nothing can still read it. The callback may run
in any thread (the one dropping the last reference), so it only appends to a deque;
the pool folds returned regions in under its lock.

Bounds. Idle regions hold at most ``max_idle_bytes`` (oldest closed first); a region
idle for ``idle_seconds`` is closed (its memory goes back to the system, so RSS drops
after a burst); :meth:`BufferPool.clear` closes every idle region (the worker calls it
under memory pressure before spilling). Regions lent out are the received values'
own memory, accounted as the values are.

One pool per process (:func:`process_pool`): memory is per process, and a client and
in-process workers share it. Any failure of the pool (no numpy, no memory for a new
mapping) returns None and the decoder allocates as before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import mmap
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import psutil
from dask.utils import parse_bytes

from shoal.protocol.framing import HUGE_PAGE, advise_huge_pages

logger = logging.getLogger("shoal.comm")

MIN_SIZE = 4 << 20  # smaller buffers fault in quickly and malloc reuses their memory
# A region serves a request of n bytes when it holds at most this much more (its
# unused tail stays faulted in, counted nowhere but in RSS).
SLACK = 1.25
DEFAULT_IDLE_SECONDS = 30.0  # as Dask's distributed.worker.memory.recent-to-old-time

_np: Any = None


def _numpy() -> Any:
    global _np
    if _np is None:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy is in every extra that moves arrays
            _np = False
        else:
            _np = numpy
    return _np or None


def _round_up(n: int) -> int:
    return (n + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE


class _Region:
    __slots__ = ("mm", "size", "released_at")

    def __init__(self, mm: mmap.mmap, size: int):
        self.mm = mm
        self.size = size
        self.released_at = 0.0


class BufferPool:
    """Large receive buffers recycled once nothing can see them (see module doc)."""

    def __init__(
        self,
        max_idle_bytes: int,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        min_size: int = MIN_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_idle_bytes < 0:
            raise ValueError(f"max_idle_bytes cannot be negative, not {max_idle_bytes!r}")
        if idle_seconds <= 0:
            raise ValueError(f"idle_seconds must be positive, not {idle_seconds!r}")
        self.max_idle_bytes = max_idle_bytes
        self.idle_seconds = idle_seconds
        self.min_size = min_size
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: list[_Region] = []  # least recently released first
        self._returned: collections.deque[_Region] = collections.deque()  # any thread
        self._unclosable: list[mmap.mmap] = []  # closed once their last export is gone
        self._lent = 0  # regions out behind a carrier
        self._lent_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self.reused = 0  # requests served by an idle region
        self.created = 0  # regions mapped

    # ------------------------------------------------------------ lending

    def allocate(self, n: int) -> tuple[Any, memoryview] | None:
        """A carrier of ``n`` writable bytes and a writable view of them, or None (too
        small, pooling off, or the pool cannot: the caller allocates as usual)."""
        if n < self.min_size or self.max_idle_bytes <= 0:
            return None
        try:
            return self._lend(n)
        except Exception:  # the fast path never fails a transfer: allocate as usual
            logger.exception("buffer pool: cannot lend %d bytes; receiving without it", n)
            return None

    def _lend(self, n: int) -> tuple[Any, memoryview] | None:
        np = _numpy()
        if np is None:
            return None
        with self._lock:
            self._fold_returned()
            region = self._take_idle(n)
        if region is None:
            region = self._new_region(n)
            if region is None:
                return None
        carrier = np.frombuffer(region.mm, dtype=np.uint8, count=n)
        with self._lock:
            self._lent += 1
            self._lent_bytes += region.size
        finalizer = weakref.finalize(carrier, self._give_back, region)
        finalizer.atexit = False
        self._schedule_trim()
        return carrier, memoryview(carrier)

    def _take_idle(self, n: int) -> _Region | None:
        most = n * SLACK + HUGE_PAGE
        best: _Region | None = None
        for region in self._idle:
            if n <= region.size <= most and (best is None or region.size < best.size):
                best = region
        if best is not None:
            self._idle.remove(best)
            self.reused += 1
        return best

    def _new_region(self, n: int) -> _Region | None:
        size = _round_up(n)
        try:
            mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError, OverflowError):
            return None
        # (the kernel aligns mappings this large to 2 MiB: all of it huge pages)
        advise_huge_pages(_address(mm), size)
        self.created += 1
        return _Region(mm, size)

    def _give_back(self, region: _Region) -> None:
        # Runs while the carrier is being collected, in whichever thread dropped it:
        # no lock here (that thread may hold it), the pool folds it in later.
        region.released_at = self._clock()
        self._returned.append(region)

    def _fold_returned(self) -> None:  # under the lock
        while self._returned:
            region = self._returned.popleft()
            self._lent -= 1
            self._lent_bytes -= region.size
            self._idle.append(region)
        idle = sum(r.size for r in self._idle)
        while self._idle and idle > self.max_idle_bytes:
            oldest = self._idle.pop(0)
            idle -= oldest.size
            self._close(oldest.mm)
        if self._unclosable:
            pending, self._unclosable = self._unclosable, []
            for mm in pending:
                self._close(mm)

    def _close(self, mm: mmap.mmap) -> None:  # under the lock
        try:
            mm.close()
        except BufferError:  # the dying carrier's export is not released yet: later
            self._unclosable.append(mm)

    # ------------------------------------------------------------ trimming

    def resize(self, max_idle_bytes: int, idle_seconds: float) -> None:
        """New bounds; idle regions past them are closed."""
        if max_idle_bytes < 0 or idle_seconds <= 0:
            raise ValueError(f"invalid pool bounds {max_idle_bytes!r}, {idle_seconds!r}")
        with self._lock:
            self.max_idle_bytes = max_idle_bytes
            self.idle_seconds = idle_seconds
            self._fold_returned()

    def trim(self, now: float | None = None) -> int:
        """Close the regions idle for ``idle_seconds`` or more; the bytes closed."""
        now = self._clock() if now is None else now
        with self._lock:
            self._fold_returned()
            stale = [r for r in self._idle if now - r.released_at >= self.idle_seconds]
            for region in stale:
                self._idle.remove(region)
                self._close(region.mm)
        return sum(r.size for r in stale)

    def clear(self) -> int:
        """Close every idle region (memory pressure); the bytes closed."""
        with self._lock:
            self._fold_returned()
            idle, self._idle = self._idle, []
            for region in idle:
                self._close(region.mm)
        return sum(r.size for r in idle)

    @property
    def idle_bytes(self) -> int:
        """Bytes of idle regions (faulted in, counted in RSS, holding no value)."""
        with self._lock:
            self._fold_returned()
            return sum(r.size for r in self._idle)

    @property
    def lent_bytes(self) -> int:
        """Bytes of regions lent out (received values' memory)."""
        with self._lock:
            self._fold_returned()
            return self._lent_bytes

    def _schedule_trim(self) -> None:
        """Keep a trim timer on the running loop while regions are lent or idle."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        with self._lock:
            live = self._timer_loop is not None and not self._timer_loop.is_closed()
            if self._timer is not None and live:
                return
            self._timer_loop = loop
            self._timer = loop.call_later(self.idle_seconds / 2, self._tick)

    def _tick(self) -> None:
        self.trim()
        with self._lock:
            self._timer = None
            if not (self._idle or self._lent or self._returned):
                self._timer_loop = None
                return
            loop = self._timer_loop
        if loop is not None and not loop.is_closed():
            with self._lock:
                self._timer = loop.call_later(self.idle_seconds / 2, self._tick)


def _address(mm: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(mm))


# ---------------------------------------------------------------- the process's pool

_pool: BufferPool | None = None
_pool_lock = threading.Lock()


def process_pool() -> BufferPool | None:
    """This process's pool, made from the config on first use (None when it is off:
    ``shoal.worker.transfer.buffer-pool`` false or 0)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _from_config(None)
        return _pool if _pool.max_idle_bytes > 0 else None


def configure_process_pool(memory_limit: int | None) -> BufferPool:
    """Size this process's pool from the config against ``memory_limit`` (a worker's;
    None: the machine's memory). Regions lent out stay valid; idle ones past the new
    bound are closed."""
    global _pool
    fresh = _from_config(memory_limit)
    with _pool_lock:
        if _pool is None:
            _pool = fresh
        else:
            _pool.resize(fresh.max_idle_bytes, fresh.idle_seconds)
        return _pool


def _from_config(memory_limit: int | None) -> BufferPool:
    from shoal import config

    raw = config.get("worker.transfer.buffer-pool")
    idle = config.get("worker.transfer.buffer-pool-idle")
    base = int(psutil.virtual_memory().total) if memory_limit is None else memory_limit
    return BufferPool(pool_bytes(raw, base), float(idle))


def pool_bytes(value: Any, memory_limit: int) -> int:
    """``shoal.worker.transfer.buffer-pool`` in bytes: a fraction of ``memory_limit``
    (0.25), an amount ("1GiB", 2e9), or false/0 (off)."""
    if value is None or value is False:
        return 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("false", "off", "none"):
            return 0
        try:
            value = float(text)
        except ValueError:
            try:
                return int(parse_bytes(text))
            except ValueError:
                value = text
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(
            "shoal.worker.transfer.buffer-pool is a fraction of the memory limit, an "
            f'amount of memory ("1GiB") or false, not {value!r}'
        )
    if value <= 1:
        return int(memory_limit * value)
    return int(value)
