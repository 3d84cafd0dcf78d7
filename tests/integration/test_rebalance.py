"""``client.rebalance`` and ``has_what``/``who_has`` over every client's keys, on real
processes (a scheduler and three worker processes on loopback TCP)."""

from __future__ import annotations

from collections.abc import Iterator

import dask.config
import numpy as np
import pytest

from shoal import Client, LocalCluster

MB = 2**20
# Dask's thresholds are fractions of a worker's limit (1 GB here): 30% to send. These
# tests move a few MB, so they lower them (the Dask config key, honoured as shoal's).
LOW = {
    "distributed.worker.memory.rebalance.sender-min": 0.0,
    "distributed.worker.memory.rebalance.recipient-max": 1.0,
    "distributed.worker.memory.rebalance.sender-recipient-gap": 0.0,
}


@pytest.fixture(scope="module")
def three() -> Iterator[LocalCluster]:
    with LocalCluster(
        n_workers=3, threads_per_worker=1, memory_limit="1GB", timeout=60, validate=True
    ) as c:
        yield c


@pytest.fixture
def client(three: LocalCluster) -> Iterator[Client]:
    with Client(three, timeout=30) as c:
        yield c


def addresses(client: Client) -> dict[str, str]:
    return {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}


def counts(client: Client) -> dict[str, int]:
    by_address = {a: n for n, a in addresses(client).items()}
    return {by_address[a]: len(keys) for a, keys in client.has_what().items()}


def test_rebalance_evens_out_the_workers_and_keeps_one_copy_of_each_key(client: Client) -> None:
    by_name = addresses(client)
    arrays = [np.full(MB // 8, i, dtype="f8") for i in range(6)]
    futures = client.scatter(arrays, workers=[by_name["0"]])
    assert counts(client) == {"0": 6, "1": 0, "2": 0}
    client.rebalance()  # Dask's default thresholds: 6 MB is far below 30% of 1 GB
    assert counts(client) == {"0": 6, "1": 0, "2": 0}
    with dask.config.set(LOW):
        client.rebalance()
    assert counts(client) == {"0": 2, "1": 2, "2": 2}
    who_has = client.who_has(futures)
    assert all(len(holders) == 1 for holders in who_has.values())
    nbytes = {w["name"]: w["nbytes"] for w in client.scheduler_info()["workers"].values()}
    assert len(set(nbytes.values())) == 1  # even, to the byte
    for i, got in enumerate(client.gather(futures)):
        assert got.shape == (MB // 8,) and (got == i).all()


def test_rebalance_of_chosen_futures_among_chosen_workers(client: Client) -> None:
    by_name = addresses(client)
    futures = client.scatter(list(range(10, 18)), workers=[by_name["1"]])
    with dask.config.set(LOW):
        client.rebalance(futures[:2], workers=["1", by_name["2"]])
    held = client.who_has(futures)
    assert sorted(held[f.key][0] for f in futures[:2]) == [by_name["2"]] * 2
    assert all(held[f.key] == [by_name["1"]] for f in futures[2:])
    assert client.gather(futures) == list(range(10, 18))


def test_has_what_and_who_has_list_every_clients_keys(three: LocalCluster, client: Client) -> None:
    by_name = addresses(client)
    mine = client.submit(sum, [1, 2], workers=["2"])
    assert mine.result(timeout=10) == 3
    with Client(three, timeout=30) as other:
        theirs = other.submit(sum, [3, 4], workers=["0"])
        assert theirs.result(timeout=10) == 7
        seen = client.has_what()  # Dask's: every key a worker holds, whoever wants it
        assert theirs.key in seen[by_name["0"]] and mine.key in seen[by_name["2"]]
        assert client.has_what(workers="0") == {by_name["0"]: seen[by_name["0"]]}
        everywhere = client.who_has()
        assert everywhere[theirs.key] == [by_name["0"]]
        assert everywhere[mine.key] == [by_name["2"]]


def test_rebalance_refuses_bad_thresholds(client: Client) -> None:
    with (
        dask.config.set({"shoal.worker.memory.rebalance.sender-min": 2.5}),
        pytest.raises(ValueError, match="sender_min must be a fraction"),
    ):
        client.rebalance()
