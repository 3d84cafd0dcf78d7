"""Dask's public ``distributed.Client`` methods against shoal's: every one is either
on shoal's Client or listed, with why, in ``shoal.client.dask_parity``."""

from __future__ import annotations

import distributed
import pytest

from shoal import Client
from shoal.client.dask_parity import UNIMPLEMENTED


def test_every_dask_client_method_is_implemented_or_explained(client: Client) -> None:
    dask_names = {n for n in dir(distributed.Client) if not n.startswith("_")}
    shoal_names = {n for n in dir(client) if not n.startswith("_")}
    missing = dask_names - shoal_names
    assert missing - set(UNIMPLEMENTED) == set(), "implement these or explain them"
    assert set(UNIMPLEMENTED) - missing == set(), "implemented now: remove from the list"
    assert all(reason.strip() for reason in UNIMPLEMENTED.values())


def test_current_as_current_futures_of_write_scheduler_file(client: Client, tmp_path) -> None:
    assert Client.current() is client
    with client.as_current() as c:
        assert Client.current() is c is client
    f = client.submit(sum, [1, 2])
    assert client.futures_of([{"x": f}]) == [f]
    path = tmp_path / "sched.json"
    client.write_scheduler_file(str(path))
    with Client(scheduler_file=str(path), timeout=30, set_as_default=False) as other:
        assert other.submit(sum, [3, 4]).result(timeout=10) == 7
    with pytest.raises(FileExistsError):
        client.write_scheduler_file(str(path))
