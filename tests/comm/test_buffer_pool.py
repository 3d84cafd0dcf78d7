"""Recycled receive buffers (shoal/comm/buffer_pool.py): a region is reused only once
nothing can see it (every view, slice, frame and block rebuilt from it keeps it lent),
the pool stays within its bounds, is trimmed when idle, and any failure of it falls back
to the decoder's own allocation."""

from __future__ import annotations

import asyncio
import gc
import mmap
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized

from shoal.comm import buffer_pool
from shoal.comm.buffer_pool import BufferPool, pool_bytes
from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder, encode_frame, message_buffers
from shoal.protocol.serialize import dumps_value, loads_value
from shoal.server.memory import MemoryFractions, MemoryMonitor

MiB = 1 << 20
SIZE = 8 * MiB  # above the pool's smallest size, small enough for many runs


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_pool(max_idle: int = 1 << 30, **kw: Any) -> BufferPool:
    return BufferPool(max_idle, min_size=MiB, **kw)


def transfer(value: Any, pool: BufferPool) -> Any:
    """``value`` through a DataReply frame, decoded with ``pool`` lending the buffers."""
    payload, buffers = dumps_value(value)
    msg = m.DataReply(1, ["k"], [payload])
    data = b"".join(bytes(p) for p in encode_frame([msg], buffers))
    decoder = FrameDecoder(allocator=pool.allocate)
    (frame,) = decoder.feed(data)
    ((_, bufs),) = message_buffers(frame)
    return loads_value(payload, bufs)


def collect() -> None:
    gc.collect()


# ------------------------------------------------------------------ reuse and lifetime


def test_a_region_is_reused_once_its_carrier_is_gone() -> None:
    pool = make_pool()
    carrier, view = pool.allocate(SIZE)  # type: ignore[misc]
    assert view.nbytes == SIZE and not view.readonly
    del carrier, view
    collect()
    assert pool.idle_bytes >= SIZE
    again = pool.allocate(SIZE)
    assert again is not None
    assert (pool.created, pool.reused) == (1, 1)
    assert pool.idle_bytes == 0


def test_a_received_array_comes_from_the_pool_intact_and_writable() -> None:
    pool = make_pool()
    sent = np.arange(SIZE // 8, dtype="f8")
    got = transfer(sent, pool)
    assert pool.created == 1
    np.testing.assert_array_equal(got, sent)
    got[0] = -1.0  # writable, as a freshly allocated buffer
    del got
    collect()
    again = transfer(sent * 2, pool)
    assert pool.reused == 1
    np.testing.assert_array_equal(again, sent * 2)


def _numpy_slice(a: np.ndarray, df: Any) -> Any:
    return a[5:1000:3]


def _numpy_dtype_view(a: np.ndarray, df: Any) -> Any:
    return a.view("i8")[::7]


def _memoryview(a: np.ndarray, df: Any) -> Any:
    return memoryview(a)[100:4000]


def _pandas_column(a: np.ndarray, df: Any) -> Any:
    return df["b"]


def _pandas_block_values(a: np.ndarray, df: Any) -> Any:
    return df.values[10:20]


def _frame_without_copy(a: np.ndarray, df: Any) -> Any:
    return pd.DataFrame(a.reshape(-1, 4), copy=False)


HOLDERS = [
    _numpy_slice,
    _numpy_dtype_view,
    _memoryview,
    _pandas_column,
    _pandas_block_values,
    _frame_without_copy,
]


def _snapshot(held: Any) -> bytes:
    if isinstance(held, memoryview):
        return held.tobytes()
    if isinstance(held, pd.DataFrame | pd.Series):
        return held.to_numpy().tobytes()
    return np.ascontiguousarray(held).tobytes()


@pytest.mark.parametrize("hold", HOLDERS, ids=lambda f: f.__name__.strip("_"))
def test_a_region_stays_lent_while_anything_rebuilt_from_it_lives(hold: Any) -> None:
    """Hold a view, drop everything else, receive again: the view's bytes are unchanged
    (the new receive got other memory), and once the view goes the region is reused."""
    pool = make_pool()
    n = SIZE // 8
    first_array = transfer(np.full(n, 1.5), pool)
    first_frame = transfer(pd.DataFrame({c: np.full(n // 4, 2.5) for c in "abcd"}), pool)
    held = hold(first_array, first_frame)
    expected = _snapshot(held)
    del first_array, first_frame
    collect()
    # Two receives of the same sizes, other bytes: they must not land under `held`.
    second_array = transfer(np.full(n, -7.0), pool)
    second_frame = transfer(pd.DataFrame({c: np.full(n // 4, -9.0) for c in "abcd"}), pool)
    assert _snapshot(held) == expected
    assert float(second_array[0]) == -7.0 and float(second_frame["a"].iloc[-1]) == -9.0
    assert pool.reused == 1  # the one of the two first regions that `held` does not see
    del held, second_array, second_frame
    collect()
    transfer(np.full(n, 3.0), pool)
    transfer(pd.DataFrame({c: np.full(n // 4, 4.0) for c in "abcd"}), pool)
    assert pool.reused == 3 and pool.created == 3


@pytest.mark.timeout(300)  # 20 examples of up to 25 receives and collections
@settings(max_examples=sized(ci=8, full=20), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["receive", "drop", "view", "drop_view"]), st.integers(0, 7)),
        min_size=1,
        max_size=25,
    )
)
def test_no_sequence_hands_out_memory_something_can_still_read(ops: list[Any]) -> None:
    """Random receives, drops and views: every value and view still alive reads its own
    bytes after each step, and no two live receives share memory."""
    pool = make_pool(max_idle=16 * MiB)
    values: list[tuple[np.ndarray, float]] = []
    views: list[tuple[np.ndarray, float]] = []
    fill = 0.0
    for op, pick in ops:
        if op == "receive":
            fill += 1.0
            size = (2 * MiB if pick % 2 else 3 * MiB) // 8
            values.append((transfer(np.full(size, fill), pool), fill))
        elif op == "drop" and values:
            values.pop(pick % len(values))
        elif op == "view" and values:
            arr, f = values[pick % len(values)]
            views.append((arr[pick::5], f))
        elif op == "drop_view" and views:
            views.pop(pick % len(views))
        collect()
        for arr, f in values + views:
            assert arr.min() == f and arr.max() == f
        spans = sorted(
            (a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes)
            for a, _ in values
        )
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start
    assert pool.idle_bytes <= 16 * MiB


def test_bytes_values_and_small_buffers_never_come_from_the_pool() -> None:
    pool = make_pool()
    got = transfer(b"z" * SIZE, pool)
    assert type(got) is bytes and len(got) == SIZE
    small = transfer(np.ones(1000), pool)  # 8 kB: out of band, under the pool's minimum
    assert small.sum() == 1000
    assert pool.created == 0


# ------------------------------------------------------------------ bounds and trimming


def test_idle_regions_never_exceed_the_bound_oldest_closed_first() -> None:
    pool = make_pool(max_idle=2 * SIZE)
    lent = [pool.allocate(SIZE) for _ in range(3)]
    assert all(x is not None for x in lent)
    del lent
    collect()
    assert pool.idle_bytes == 2 * SIZE


def test_regions_idle_past_the_timeout_are_freed() -> None:
    clock = FakeClock()
    pool = make_pool(idle_seconds=10.0, clock=clock)
    a, b = pool.allocate(SIZE), pool.allocate(2 * SIZE)
    del a
    collect()
    clock.now += 6.0
    del b
    collect()
    assert pool.trim(clock.now + 4.0) == SIZE  # only the first has been idle 10 s
    assert pool.idle_bytes == 2 * SIZE
    assert pool.trim(clock.now + 10.0) == 2 * SIZE
    assert pool.idle_bytes == 0


def test_clear_frees_every_idle_region_and_leaves_lent_ones_intact() -> None:
    pool = make_pool()
    kept = transfer(np.full(SIZE // 8, 5.0), pool)
    gone = pool.allocate(SIZE)
    del gone
    collect()
    assert pool.clear() >= SIZE
    assert pool.idle_bytes == 0
    assert float(kept.sum()) == 5.0 * kept.size


def test_a_timer_on_the_loop_trims_the_pool_without_further_traffic() -> None:
    pool = make_pool(idle_seconds=0.2)

    async def main() -> None:
        lent = pool.allocate(SIZE)
        assert lent is not None
        del lent
        collect()
        assert pool.idle_bytes > 0
        await asyncio.sleep(0.6)

    asyncio.run(main())
    assert pool.idle_bytes == 0


# ------------------------------------------------------------------ failures fall back


def test_a_pool_that_cannot_map_memory_lets_the_decoder_allocate(monkeypatch: Any) -> None:
    pool = make_pool()

    def no_memory(*args: Any, **kw: Any) -> Any:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(buffer_pool.mmap, "mmap", no_memory)
    got = transfer(np.full(SIZE // 8, 6.0), pool)
    assert float(got[-1]) == 6.0 and pool.created == 0


def test_an_error_inside_the_pool_never_fails_a_transfer(monkeypatch: Any) -> None:
    pool = make_pool()

    def broken(n: int) -> Any:
        raise RuntimeError("a bug in the pool")

    monkeypatch.setattr(pool, "_lend", broken)
    got = transfer(np.full(SIZE // 8, 8.0), pool)
    assert float(got[0]) == 8.0


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.25, 250),
        ("0.5", 500),
        (2000, 2000),
        ("1KiB", 1024),
        ("2e3", 2000),
        (False, 0),
        ("false", 0),
        (0, 0),
    ],
)
def test_pool_size_from_the_config(value: Any, expected: int) -> None:
    assert pool_bytes(value, 1000) == expected


@pytest.mark.parametrize("value", [-1, "lots", True, [1]])
def test_a_bad_pool_size_is_refused_naming_the_key(value: Any) -> None:
    with pytest.raises(ValueError, match="shoal.worker.transfer.buffer-pool"):
        pool_bytes(value, 1000)


def test_the_memory_monitor_frees_idle_buffers_before_spilling(monkeypatch: Any) -> None:
    pool = make_pool()
    lent = pool.allocate(SIZE)
    assert lent is not None
    lent[1][:] = b"x" * SIZE  # faulted in, as a received buffer is
    del lent
    collect()
    assert pool.idle_bytes >= SIZE
    monkeypatch.setattr("shoal.server.memory.process_pool", lambda: pool)
    # A limit this low puts any process over its spill fraction.
    monitor = MemoryMonitor(1, MemoryFractions(0.6, 0.7, None, None), None, lambda p: None)
    monitor.check()
    assert pool.idle_bytes == 0


def test_mmap_regions_are_private_memory() -> None:
    """Regions are private anonymous memory (not shared memory counted as RssShmem
    and kept by the kernel in its page cache)."""
    pool = make_pool()
    carrier, view = pool.allocate(SIZE)  # type: ignore[misc]
    region = carrier.base
    while not isinstance(region, mmap.mmap):
        region = region.obj if isinstance(region, memoryview) else region.base
    with open("/proc/self/maps") as f:
        maps = f.read()
    address = carrier.__array_interface__["data"][0]
    line = next(ln for ln in maps.splitlines() if int(ln.split("-")[0], 16) == address)
    assert line.split()[1].endswith("p")  # private, not shared
