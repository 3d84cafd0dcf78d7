from __future__ import annotations

from collections.abc import Iterator

import pytest

from shoal import Client, LocalCluster


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A client of two one-thread worker processes, shared by a module's tests (those
    that run graphs through shoal and compare with Dask's sync scheduler)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as cluster,
        Client(cluster, timeout=30) as c,
    ):
        yield c
