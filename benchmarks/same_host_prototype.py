"""Standalone measure of a same-host path for large buffers (not used by shoal).

    python benchmarks/same_host_prototype.py [--sizes 100MB,1GB] [--repeat 5]

Two processes on one machine; the sender holds a float64 array (every page touched),
the receiver ends up owning a copy of it. Modes:

* ``tcp``: loopback TCP into a fresh receive buffer (shoal's path today).
* ``tcp-warm``: loopback TCP into a receive buffer recycled from the previous run (an
  anonymous ``mmap`` faulted in once, before the first run: a pool of one).
* ``memfd-fresh``: the sender copies into a new ``memfd`` segment and passes its fd
  over a Unix socket (``SCM_RIGHTS``); the receiver maps it ``MAP_POPULATE``.
* ``memfd-pool``: as ``memfd-fresh``, into a segment faulted in beforehand (a pool of
  pre-faulted segments). The pre-faulting is not timed; its own speed is reported.

Timed: from the sender's first byte to the receiver holding the array (its pages
mapped). The receiver's VmRSS and RssShmem after each run show that a mapped segment
counts in RSS (as RssShmem) once it is populated.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import socket
import statistics
import time
from typing import Any

import numpy as np

MADV_POPULATE_WRITE = 23  # Linux 5.14+; not in Python 3.11's mmap module
HEADER = 24  # the sender's start time, as text


def _prefault(segment: mmap.mmap) -> None:
    try:
        segment.madvise(MADV_POPULATE_WRITE)
    except OSError:  # an older kernel: touch a byte per page
        np.frombuffer(segment, dtype=np.uint8)[::4096] = 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out


def _receiver(sock: socket.socket, mode: str, n: int, results: Any) -> None:
    warm = None
    if mode == "tcp-warm":
        warm = mmap.mmap(-1, n)
        _prefault(warm)
    while True:
        segment = None
        if mode.startswith("tcp"):
            header = _recv_exact(sock, HEADER)
            if not header:
                return
            buf: Any = bytearray(n) if warm is None else warm
            view = memoryview(buf)
            got = 0
            while got < n:
                got += sock.recv_into(view[got:], n - got)
            arr = np.frombuffer(buf, dtype=np.float64)
        else:
            header, fds, _, _ = socket.recv_fds(sock, HEADER, 1)
            if not header:
                return
            segment = mmap.mmap(fds[0], n, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            os.close(fds[0])
            arr = np.frombuffer(segment, dtype=np.float64)
        seconds = time.time() - float(header.decode())
        intact = bool(arr[0] == 1.5 and arr[-1] == 1.5)
        with open("/proc/self/status") as f:
            status = f.read().splitlines()
        memory = {k: (v.split() or ["0"])[0] for k, v in (line.split(":", 1) for line in status)}
        results.put((seconds, intact, int(memory["VmRSS"]), int(memory.get("RssShmem", 0))))
        del arr
        if segment is not None:
            segment.close()


def _tcp_receiver(address: Any, mode: str, n: int, results: Any) -> None:
    _receiver(socket.create_connection(address), mode, n, results)


def run(mode: str, nbytes: int, repeat: int) -> list[float]:
    n = nbytes // 8 * 8
    results: Any = mp.Queue()
    if mode.startswith("tcp"):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        proc = mp.Process(target=_tcp_receiver, args=(server.getsockname(), mode, n, results))
        proc.start()
        sender, _ = server.accept()
        server.close()
    else:
        sender, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc = mp.Process(target=_receiver, args=(other, mode, n, results))
        proc.start()
        other.close()
    data = np.full(n // 8, 1.5)
    speeds = []
    for _ in range(repeat):
        segment = fd = None
        prefault = ""
        if mode == "memfd-pool":
            fd = os.memfd_create("shoal-prototype")
            os.ftruncate(fd, n)
            segment = mmap.mmap(fd, n, flags=mmap.MAP_SHARED)
            t = time.perf_counter()
            _prefault(segment)
            prefault = f"  (pre-faulting it: {n / 1e6 / (time.perf_counter() - t):.0f} MB/s)"
        time.sleep(0.3)
        start = time.time()
        header = f"{start:.6f}".ljust(HEADER).encode()
        if mode.startswith("tcp"):
            sender.sendall(header)
            sender.sendall(memoryview(data).cast("B"))
        else:
            if segment is None:
                fd = os.memfd_create("shoal-prototype")
                os.ftruncate(fd, n)
                segment = mmap.mmap(fd, n, flags=mmap.MAP_SHARED)
            assert fd is not None
            target = np.frombuffer(segment, dtype=np.float64)
            np.copyto(target, data)
            del target
            socket.send_fds(sender, [header], [fd])
            os.close(fd)
            segment.close()
        seconds, intact, rss_kb, shmem_kb = results.get(timeout=120)
        speeds.append(n / 1e6 / seconds)
        print(
            f"{mode:12s} {n / 1e6:6.0f} MB: {speeds[-1]:6.0f} MB/s intact={intact} receiver "
            f"VmRSS {rss_kb / 1e3:.0f} MB RssShmem {shmem_kb / 1e3:.0f} MB{prefault}",
            flush=True,
        )
    sender.close()
    proc.join(10)
    return speeds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100MB,1GB")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--modes", default="tcp,tcp-warm,memfd-fresh,memfd-pool")
    args = p.parse_args()
    units = {"GB": 10**9, "MB": 10**6}
    for size in args.sizes.split(","):
        nbytes = int(float(size[:-2]) * units[size[-2:].upper()])
        for mode in args.modes.split(","):
            speeds = run(mode, nbytes, args.repeat)
            print(f"== {mode} {size}: median {statistics.median(speeds):.0f} MB/s", flush=True)


if __name__ == "__main__":
    main()
