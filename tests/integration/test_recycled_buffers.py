"""Recycled receive buffers on real processes (shoal/comm/buffer_pool.py): the client
and workers receive large arrays into memory reused from earlier transfers, never
under something still alive, and give it back to the system once idle."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import pytest

from shoal import Client, LocalCluster
from shoal.comm.buffer_pool import process_pool

MB = 1_000_000
IDLE_SECONDS = 2  # the workers' pool trim delay in this module


def make_array(n: int, fill: float) -> Any:
    return np.full(n // 8, fill)


def strided_view(x: Any) -> Any:
    """A result on the receiving worker that is a view into the received buffer."""
    return x[::1000]


def total(x: Any) -> float:
    return float(x.sum())


def pool_stats() -> dict[str, Any]:
    pool = process_pool()
    assert pool is not None
    return {
        "reused": pool.reused,
        "created": pool.created,
        "idle": pool.idle_bytes,
        "max_idle": pool.max_idle_bytes,
        "rss": psutil.Process().memory_info().rss,
    }


@pytest.fixture(scope="module")
def pool_cluster() -> Iterator[LocalCluster]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHOAL_WORKER__TRANSFER__BUFFER_POOL_IDLE", str(IDLE_SECONDS))
        with LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="4GB", timeout=60, validate=True
        ) as cluster:
            yield cluster


@pytest.fixture
def pool_client(pool_cluster: LocalCluster) -> Iterator[Client]:
    with Client(pool_cluster, timeout=30) as client:
        yield client


def workers(client: Client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


def stats_on(client: Client, address: str) -> dict[str, Any]:
    return client.submit(pool_stats, workers=[address], pure=False).result(timeout=30)


def idle_gone(client: Client, address: str) -> dict[str, Any]:
    """The worker's pool stats once it holds no idle region (or after 10 timeouts)."""
    deadline = time.monotonic() + 10 * IDLE_SECONDS
    stats = stats_on(client, address)
    while stats["idle"] and time.monotonic() < deadline:
        time.sleep(0.5)
        stats = stats_on(client, address)
    return stats


@pytest.mark.timeout(90)
def test_gather_reuses_memory_only_once_the_earlier_result_is_gone(pool_client: Client) -> None:
    client = pool_client
    pool = process_pool()
    assert pool is not None
    # This process's pool is shared with whatever ran here before (an in-process
    # worker may have sized it to its own limit): bounds of this test's own, no region
    # of earlier tests.
    bounds = pool.max_idle_bytes, pool.idle_seconds
    pool.resize(1 << 30, 60.0)
    gc.collect()
    pool.clear()
    try:
        _gather_three_times(client, pool)
    finally:
        pool.resize(*bounds)


def _gather_three_times(client: Client, pool: Any) -> None:
    first = client.submit(make_array, 64 * MB, 1.0, pure=False).result(timeout=30)
    held = first[123:456]  # a slice: keeps the first buffer lent
    del first
    reused = pool.reused
    second = client.submit(make_array, 64 * MB, 2.0, pure=False).result(timeout=30)
    assert pool.reused == reused  # the only idle-able region is still seen by `held`
    assert float(held.min()) == float(held.max()) == 1.0
    assert float(second[0]) == float(second[-1]) == 2.0
    del held
    third = client.submit(make_array, 64 * MB, 3.0, pure=False).result(timeout=30)
    assert pool.reused == reused + 1  # the first's region, free once `held` went
    assert float(third.min()) == float(third.max()) == 3.0
    assert float(second.min()) == float(second.max()) == 2.0  # untouched by the third
    second[0] = 9.0  # received arrays stay writable


@pytest.mark.timeout(90)
def test_worker_to_worker_reuse_never_overwrites_a_result_viewing_a_buffer(
    pool_client: Client,
) -> None:
    client = pool_client
    a, b = workers(client)
    assert stats_on(client, b)["max_idle"] == 4 * 10**9 // 4  # a quarter of its limit
    src = client.submit(make_array, 80 * MB, 4.0, workers=[a], pure=False)
    view = client.submit(strided_view, src, workers=[b], pure=False)  # B keeps a view
    view.result(timeout=30)
    del src  # B's copy of the dependency is released; the view still sees its buffer
    before = stats_on(client, b)
    for fill in (5.0, 6.0, 8.0):
        other = client.submit(make_array, 80 * MB, fill, workers=[a], pure=False)
        assert client.submit(total, other, workers=[b], pure=False).result(timeout=30) == (
            fill * (80 * MB // 8)
        )
        del other
    after = stats_on(client, b)
    got = view.result(timeout=30)
    assert float(got.min()) == float(got.max()) == 4.0
    # Later transfers reused an earlier one's region (the view pins only its own).
    assert after["reused"] >= before["reused"] + 1


@pytest.mark.timeout(90)
def test_a_worker_gives_idle_buffers_back_after_a_burst(pool_client: Client) -> None:
    client = pool_client
    a, b = workers(client)
    idle_gone(client, b)
    baseline = stats_on(client, b)["rss"]
    src = client.submit(make_array, 300 * MB, 7.0, workers=[a], pure=False)
    n = client.submit(total, src, workers=[b], pure=False).result(timeout=60)
    assert n == 7.0 * (300 * MB // 8)
    del src
    assert stats_on(client, b)["rss"] - baseline > 250 * MB  # kept for reuse, for now
    stats = idle_gone(client, b)
    assert stats["idle"] == 0, "the worker kept idle receive buffers past their timeout"
    assert stats["rss"] - baseline < 100 * MB, f"RSS stayed up: {stats}"
