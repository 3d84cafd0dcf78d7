"""Dask collections with an asynchronous client: compute, get and persist return
awaitables and futures, and such a client never becomes Dask's default scheduler."""

from __future__ import annotations

import asyncio

import dask
import dask.array as da
import pytest

from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(60)


def test_async_client_computes_collections(inproc_cluster: LocalCluster) -> None:
    before = dask.config.get("scheduler", None)

    async def main() -> None:
        async with Client(inproc_cluster, asynchronous=True) as client:
            assert dask.config.get("scheduler", None) is before
            x = da.arange(100, chunks=10)
            assert await client.compute(x.sum()) == 4950
            assert await client.get({"a": 1, "b": (sum, ["a", "a"])}, ["b", ["a"]]) == [2, [1]]
            y = client.persist(x + 1)
            assert await client.compute(y.sum()) == 5050

    asyncio.run(main())
