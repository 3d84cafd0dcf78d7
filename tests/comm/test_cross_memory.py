"""shoal/comm/cross_memory.py: copying from another real process's memory, and who
may (the host identity)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import dask.config
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.comm import cross_memory
from shoal.comm.cross_memory import CrossMemoryError, buffer_address, host_identity, read_into

pytestmark = pytest.mark.skipif(
    cross_memory._readv is None, reason="process_vm_readv is Linux only"
)

# A lender: a process holding arrays whose bytes are known, printing where they lie.
LENDER = """
import sys, numpy as np
small = np.arange(1000, dtype=np.uint32)
big = (np.arange(48 << 20, dtype=np.uint64) % 251).astype(np.uint8)
print(small.ctypes.data, small.nbytes, big.ctypes.data, big.nbytes, flush=True)
sys.stdin.read()
"""


class Lender:
    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        assert proc.stdout is not None
        fields = [int(x) for x in proc.stdout.readline().split()]
        self.small, self.big = (fields[0], fields[1]), (fields[2], fields[3])

    @property
    def pid(self) -> int:
        return self.proc.pid


@pytest.fixture
def lender() -> Iterator[Lender]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield Lender(proc)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_copies_another_process_buffers_exactly(lender: Lender) -> None:
    small = np.empty(1000, dtype=np.uint32)
    read_into(lender.pid, [lender.small], [memoryview(small).cast("B")])
    assert (small == np.arange(1000, dtype=np.uint32)).all()


def test_large_reads_split_over_two_threads_still_exact(lender: Lender) -> None:
    assert lender.big[1] >= cross_memory.PARALLEL_MIN  # takes the two-thread path
    big = np.zeros(lender.big[1], dtype=np.uint8)
    small = np.zeros(1000, dtype=np.uint32)
    read_into(
        lender.pid,
        [lender.small, lender.big],
        [memoryview(small).cast("B"), memoryview(big)],
    )
    expected = (np.arange(48 << 20, dtype=np.uint64) % 251).astype(np.uint8)
    assert (big == expected).all()
    assert (small == np.arange(1000, dtype=np.uint32)).all()


def test_an_address_the_lender_does_not_map_is_refused(lender: Lender) -> None:
    target = bytearray(4096)
    with pytest.raises(CrossMemoryError, match=f"process {lender.pid}"):
        read_into(lender.pid, [(4096, 4096)], [memoryview(target)])  # page 1: never mapped


def test_a_gone_process_is_refused(lender: Lender) -> None:
    lender.proc.kill()
    lender.proc.wait(timeout=10)
    with pytest.raises(CrossMemoryError):
        read_into(lender.pid, [lender.small], [memoryview(bytearray(lender.small[1]))])


def test_targets_must_fit_their_sources() -> None:
    with pytest.raises(ValueError, match="target of 10 bytes for a source of 20"):
        read_into(1, [(0, 20)], [memoryview(bytearray(10))])
    with pytest.raises(ValueError):
        read_into(1, [(0, 3)], [memoryview(b"abc")])  # read-only


def test_buffer_address_of_each_kind_of_buffer() -> None:
    arr = np.arange(10, dtype=np.float64)
    assert buffer_address(memoryview(arr)) == arr.ctypes.data
    frozen = arr.copy()
    frozen.flags.writeable = False
    assert buffer_address(memoryview(frozen)) == frozen.ctypes.data
    data = b"x" * 100
    assert buffer_address(memoryview(data)) == np.frombuffer(data, np.uint8).ctypes.data
    assert buffer_address(memoryview(arr)[::2]) is None  # not contiguous: by socket


def test_host_identity_names_this_kernel_and_namespaces() -> None:
    ident = host_identity()
    assert ident is not None
    boot, pid_ns, net_ns, uid = ident.split("/")
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert boot == f.read().strip()
    assert int(net_ns) == os.stat("/proc/self/ns/net").st_ino
    assert int(pid_ns) == os.stat("/proc/self/ns/pid").st_ino
    assert int(uid) == os.getuid()
    with dask.config.set({"shoal.comm.same-host-transfers": False}):
        assert host_identity() is None  # off: no holder is ever asked to lend


pieces = st.lists(
    st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(1, 1 << 20)),
    max_size=8,
)


@given(pieces, st.integers(0, 1 << 22))
def test_halves_cover_every_byte_once_in_order(p: list[tuple[int, int, int]], split: int) -> None:
    first, second = cross_memory._halves(p, split)
    assert sum(n for *_, n in first) == min(split, sum(n for *_, n in p))
    # Rejoined where a piece was cut, the halves are the pieces: every byte once, in order.
    assert _merge_adjacent(first + second) == _merge_adjacent(p)


def _merge_adjacent(p: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for dst, src, n in p:
        if out and out[-1][0] + out[-1][2] == dst and out[-1][1] + out[-1][2] == src:
            d, s, k = out.pop()
            out.append((d, s, k + n))
        else:
            out.append((dst, src, n))
    return out
