"""Large receive buffers are advised MADV_HUGEPAGE (2 MiB-aligned interior), stay
writable and of their type, give their memory back when released, and work the same
where madvise is unavailable or refuses."""

from __future__ import annotations

import gc
import re
import sys
from pathlib import Path

import pytest

from shoal.protocol import framing
from shoal.protocol import messages as m
from shoal.protocol.framing import (
    HUGE_PAGE,
    HUGE_PAGE_MIN,
    FrameDecoder,
    advise_huge_pages,
    encode_frame,
    message_buffers,
)
from shoal.protocol.serialize import dumps_value, loads_value

MiB = 1 << 20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


class Recorder:
    def __init__(self, rc: int = 0):
        self.calls: list[tuple[int, int, int]] = []
        self.rc = rc

    def __call__(self, address: int, length: int, advice: int) -> int:
        self.calls.append((address, length, advice))
        return self.rc


def receive(value, most: int = 4 * MiB):
    """``value`` through an encoded frame and a decoder read like a socket."""
    payload, bufs = dumps_value(value)
    pieces = encode_frame([m.DataReply(request_id=1, keys=["k"], payloads=[payload])], bufs)
    data = b"".join(bytes(p) for p in pieces)
    decoder = FrameDecoder()
    frames = []
    pos = 0
    while pos < len(data):
        view = decoder.get_buffer()
        n = min(len(view), most, len(data) - pos)
        view[:n] = data[pos : pos + n]
        del view
        pos += n
        frames += decoder.buffer_updated(n)
    [frame] = frames
    [(msg, got)] = message_buffers(frame)
    return loads_value(msg.payloads[0], got), got


def test_advice_covers_the_aligned_interior(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(framing, "_madvise", rec)
    address = 5 * HUGE_PAGE + 4096  # starts just past a boundary
    n = 7 * HUGE_PAGE
    assert advise_huge_pages(address, n) == 6 * HUGE_PAGE
    [(start, length, advice)] = rec.calls
    assert start == 6 * HUGE_PAGE and start + length == 12 * HUGE_PAGE
    assert address <= start and start + length <= address + n  # never past the object
    assert advice == framing._MADV_HUGEPAGE


def test_small_regions_are_not_advised(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(framing, "_madvise", rec)
    assert advise_huge_pages(HUGE_PAGE + 1, HUGE_PAGE_MIN - 1) == 0
    assert advise_huge_pages(HUGE_PAGE + 1, HUGE_PAGE) == 0
    assert rec.calls == []


@pytest.mark.parametrize("kind", ["memoryview", "bytes"])
def test_large_received_buffers_are_advised_and_intact(monkeypatch, kind):
    rec = Recorder()
    monkeypatch.setattr(framing, "_madvise", rec)
    n = 9 * MiB
    value = b"ab" * (n // 2) if kind == "bytes" else memoryview(bytearray(b"cd" * (n // 2)))
    back, got = receive(value)
    [(start, length, _)] = rec.calls
    obj = got[0].obj
    base = id(obj) + framing._BYTES_DATA_OFFSET if kind == "bytes" else _address(obj)
    assert base <= start and start + length <= base + n and length >= 4 * MiB
    if kind == "bytes":
        assert type(back) is bytes and back == value
    else:
        assert type(obj) is bytearray and not back.readonly  # writable, its own type
        assert back.tobytes() == bytes(value)
        back[0] = ord("z")
        assert obj[0] == ord("z")  # the value is the received buffer


def test_arrays_in_large_buffers_are_advised_and_writable(monkeypatch):
    np = pytest.importorskip("numpy")
    rec = Recorder()
    monkeypatch.setattr(framing, "_madvise", rec)
    arr = np.arange(2 * MiB, dtype="f8")  # 16 MiB
    back, _ = receive(arr)
    assert len(rec.calls) == 1 and rec.calls[0][1] >= 12 * MiB
    assert back.flags.writeable and (back == arr).all()


def test_small_received_buffers_are_not_advised(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(framing, "_madvise", rec)
    back, _ = receive(b"s" * (HUGE_PAGE_MIN - 1))
    assert back == b"s" * (HUGE_PAGE_MIN - 1) and rec.calls == []


@pytest.mark.parametrize("madvise", [None, Recorder(rc=-1)], ids=["unavailable", "refused"])
def test_without_madvise_buffers_arrive_the_same(monkeypatch, madvise):
    monkeypatch.setattr(framing, "_madvise", madvise)
    assert advise_huge_pages(HUGE_PAGE, 4 * HUGE_PAGE) == 0
    n = 9 * MiB
    back, _ = receive(b"q" * n)
    assert back == b"q" * n
    back, got = receive(bytearray(b"r" * n))
    assert type(back) is bytearray and back == bytearray(b"r" * n)


def _address(obj: bytearray) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(obj))


def _mapping(address: int) -> tuple[int, int, list[str], int] | None:
    """The mapping holding ``address``: its range, VmFlags and resident bytes."""
    text = Path("/proc/self/smaps").read_text()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(None, 1)[0].split("-"))
        if lo <= address < hi:
            flags = re.search(r"VmFlags:(.*)", block).group(1).split()  # type: ignore[union-attr]
            rss = int(re.search(r"\nRss:\s+(\d+) kB", block).group(1)) * 1024  # type: ignore[union-attr]
            return lo, hi, flags, rss
    return None


@linux_only
@pytest.mark.skipif(framing._madvise is None, reason="no madvise(MADV_HUGEPAGE) here")
@pytest.mark.parametrize("as_bytes", [False, True], ids=["bytearray", "bytes"])
def test_the_kernel_sees_the_advice_and_memory_goes_back(as_bytes):
    # Measured on the advised mapping itself, not the process's VmRSS: other threads
    # left by earlier tests in the same process allocate and free meanwhile (CI once
    # saw the process gain 7 MB while this buffer's 64 MiB were touched).
    n = 64 * MiB  # above glibc's largest mmap threshold: a mapping of its own
    obj, view = framing.allocate(n, as_bytes)
    base = id(obj) + framing._BYTES_DATA_OFFSET if as_bytes else _address(obj)
    middle = (base + n // 2) & ~(HUGE_PAGE - 1)
    advised = _mapping(middle)
    assert advised is not None and "hg" in advised[2]  # MADV_HUGEPAGE on the mapping
    lo, hi = advised[0], advised[1]
    assert base <= lo and hi <= base + n and hi - lo >= n - 2 * HUGE_PAGE
    assert advised[3] < 8 * MiB  # nothing faulted in before it is written
    for i in range(0, n, 4096):
        view[i] = 7
    touched = _mapping(middle)
    assert touched is not None and touched[:2] == (lo, hi)
    assert touched[3] >= (hi - lo) * 0.9
    assert view[n - 4096] == 7 and type(obj) is (bytes if as_bytes else bytearray)
    view.release()
    del view, obj
    gc.collect()
    after = _mapping(middle)
    # Unmapped (or the range since taken by a new, unadvised mapping): not kept.
    assert after is None or "hg" not in after[2] or after[3] < 8 * MiB, (
        "a released buffer kept its memory"
    )
