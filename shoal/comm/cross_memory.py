"""Copying from another process on this machine: Linux ``process_vm_readv``.

A loopback socket copies data twice (into the kernel, out of it) in pieces of a few
hundred KiB, about 3 GB/s here; ``process_vm_readv`` copies it once, straight from
the other process's pages into ours, at memory speed (8-9 GB/s on one thread, about
14 GB/s on two; ``benchmarks/RESULTS-transfer.md``). :mod:`shoal.comm.same_host`
builds the transfer protocol on it; this module is only the mechanism:

* :func:`host_identity`: who may read whom. Two processes may use the path when they
  run under the same kernel boot, in the same PID and network namespaces, as the same
  user. Namespaced "hosts" (containers, ``tests/multihost``) differ in the network
  namespace and keep using the network, as separate machines must.
* :func:`buffer_address`: where a buffer lies in this process.
* :func:`read_into`: the copy, on up to two threads for large reads.

The kernel checks the reader may ptrace the lender (same user, not made
non-dumpable; a seccomp profile may forbid the call outright). Any refusal is a
:class:`CrossMemoryError` and the caller falls back to the network.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from typing import Any

from shoal import config

# Reads at least this large are split over two threads (the copy releases the GIL;
# one thread copies at about two thirds of what two do).
PARALLEL_MIN = 32 << 20
_IOV_MAX = 1024  # iovecs per call (UIO_MAXIOV)


class CrossMemoryError(OSError):
    """This process cannot read the other's memory (refused, gone, or no such call)."""


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load_readv() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (AttributeError, OSError):  # pragma: no cover - a libc without it
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = (
        ctypes.c_int,
        ctypes.POINTER(_IOVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IOVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    )
    return fn


_readv = _load_readv()


def enabled() -> bool:
    """``shoal.comm.same-host-transfers``: off sends everything over the network."""
    return bool(config.get("comm.same-host-transfers"))


@functools.cache
def _identity() -> str | None:
    if _readv is None:
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
        net_ns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None
    return f"{boot}/{pid_ns}/{net_ns}/{os.getuid()}"


def host_identity() -> str | None:
    """A name shared exactly by the processes of this machine that may read each
    other's memory (see the module docstring); None where the path is off or absent."""
    return _identity() if enabled() else None


_np: Any = None


def buffer_address(view: memoryview) -> int | None:
    """The address of a C-contiguous buffer's first byte in this process, or None
    (not contiguous, or no numpy to tell: the buffer then travels by the network)."""
    global _np
    if not view.c_contiguous:
        return None
    if view.nbytes == 0:
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    if _np is None:
        try:
            import numpy
        except ImportError:
            _np = False
        else:
            _np = numpy
    if not _np:
        return None
    return int(_np.frombuffer(view, dtype=_np.uint8).ctypes.data)


def _copy(pid: int, pieces: list[tuple[int, int, int]]) -> None:
    """Copy ``(local address, remote address, nbytes)`` pieces from process ``pid``."""
    assert _readv is not None
    todo = [p for p in pieces if p[2]]
    while todo:
        batch = todo[:_IOV_MAX]
        local = (_IOVec * len(batch))(*[_IOVec(dst, n) for dst, _, n in batch])
        remote = (_IOVec * len(batch))(*[_IOVec(src, n) for _, src, n in batch])
        got = _readv(pid, local, len(batch), remote, len(batch), 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else 0
            raise CrossMemoryError(
                err,
                f"cannot read the memory of process {pid}: {os.strerror(err) if err else 'nothing read'}",
            )
        # A partial read stops inside one piece: resume from there.
        rest = []
        for dst, src, n in todo:
            if got >= n:
                got -= n
                continue
            rest.append((dst + got, src + got, n - got))
            got = 0
        todo = rest


def read_into(pid: int, sources: list[tuple[int, int]], targets: list[memoryview]) -> None:
    """Fill each writable ``targets[i]`` from ``sources[i]`` = (address, nbytes) in
    process ``pid``. Blocks; large reads use a second thread for half the bytes."""
    if _readv is None:
        raise CrossMemoryError(0, "process_vm_readv is not available here")
    pieces = []
    for (src, n), target in zip(sources, targets, strict=True):
        if target.nbytes != n or target.readonly:
            raise ValueError(f"target of {target.nbytes} bytes for a source of {n}")
        if n:
            pieces.append((ctypes.addressof(ctypes.c_char.from_buffer(target)), src, n))
    total = sum(n for *_, n in pieces)
    if total < PARALLEL_MIN:
        _copy(pid, pieces)
        return
    first, second = _halves(pieces, total // 2)
    failure: list[BaseException] = []

    def other() -> None:
        try:
            _copy(pid, second)
        except BaseException as e:  # re-raised in the caller's thread
            failure.append(e)

    helper = threading.Thread(target=other, name="shoal-cross-memory", daemon=True)
    helper.start()
    try:
        _copy(pid, first)
    finally:
        helper.join()
    if failure:
        raise failure[0]


def _halves(
    pieces: list[tuple[int, int, int]], split: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The pieces cut in two runs of ``split`` and the remaining bytes."""
    first: list[tuple[int, int, int]] = []
    second: list[tuple[int, int, int]] = []
    left = split
    for dst, src, n in pieces:
        if left <= 0:
            second.append((dst, src, n))
        elif n <= left:
            first.append((dst, src, n))
            left -= n
        else:
            first.append((dst, src, left))
            second.append((dst + left, src + left, n - left))
            left = 0
    return first, second
