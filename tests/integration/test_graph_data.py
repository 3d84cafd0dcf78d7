"""Large constants of Dask graphs (``from_pandas`` partitions, ``from_array`` chunks)
are scattered to the workers once and cached by the client (shoal/client/graph/data.py):
exact values, a second compute that sends no data, eviction releasing the keys on the
cluster, a SIGKILLed worker holding cached data, and mutated frames getting new keys.

Real processes on loopback TCP: the module's shared cluster (two single-threaded workers),
or a scheduler and workers started with ``spawn`` for the kill tests."""

from __future__ import annotations

import operator
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from test_faults import Spawn, addresses, start_scheduler, start_workers
from test_lifecycle import wait_until

from shoal import Client
from shoal.protocol import messages as m

pytestmark = pytest.mark.timeout(120)

ROWS = 200_000  # 4 partitions: 400 KB per float column each, well above 64 KiB


def frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "a": rng.integers(0, 50, ROWS),
            "b": rng.random(ROWS),
            "c": rng.integers(0, 1_000_000, ROWS),
        }
    )


class Sent:
    """The bytes of task payloads this client sends to the scheduler, and the number
    of scatters it makes, while in use."""

    def __init__(self, client: Client):
        self.payload_bytes = 0
        self.scatters = 0
        self._client = client

    def __enter__(self) -> Sent:
        client = self._client
        send, scatter = client._send, client._scatter_async

        def counting_send(msg: m.Message) -> None:
            if isinstance(msg, m.SubmitTasks):
                self.payload_bytes += sum(len(spec.payload.data) for spec in msg.tasks)
            send(msg)

        def counting_scatter(*args: Any, **kwargs: Any) -> Any:
            self.scatters += 1
            return scatter(*args, **kwargs)

        client._send = counting_send  # type: ignore[method-assign]
        client._scatter_async = counting_scatter  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        del self._client._send, self._client._scatter_async


@pytest.fixture
def gclient(client: Client) -> Iterator[Client]:
    yield client
    client.graph_data.clear()


def test_values_are_exact_and_a_second_compute_sends_no_data(gclient: Client) -> None:
    df = frame()
    ddf = dd.from_pandas(df, npartitions=4)
    right = dd.from_pandas(frame(1)[["c", "b"]].rename(columns={"b": "d"}), npartitions=3)
    collections = {
        "sum": ddf.b.sum(),
        "groupby": ddf.groupby("a").b.mean(),
        "merge": ddf.merge(right, on="c"),
        "value_counts": ddf.a.value_counts(),
    }
    for name, coll in collections.items():
        expected = dask.compute(coll, scheduler="sync")[0]
        with Sent(gclient) as first:
            got = coll.compute()
        with Sent(gclient) as second:
            again = coll.compute()
        for value in (got, again):
            if isinstance(expected, pd.DataFrame | pd.Series):
                pd.testing.assert_frame_equal(
                    pd.DataFrame(value).sort_index(), pd.DataFrame(expected).sort_index()
                )
            else:
                assert value == expected, name
        # The partitions (4 x 400 KB or more) never ride in the graph; a compute again
        # makes no scatter at all.
        assert first.payload_bytes < 100_000, (name, first.payload_bytes)
        assert second.payload_bytes < 100_000, (name, second.payload_bytes)
        assert second.scatters == 0, name
    assert all(k[0].startswith("frompandas-") for k in gclient.graph_data.info()["keys"])


def test_without_graph_data_the_partitions_ride_in_the_graph(gclient: Client) -> None:
    """The measure of the test above can fail: with the feature off (threshold above the
    partitions' size) the payloads carry the data."""
    ddf = dd.from_pandas(frame(), npartitions=4)
    with dask.config.set({"shoal.client.graph-data.min-bytes": "1GiB"}), Sent(gclient) as sent:
        assert ddf.b.sum().compute() == dask.compute(ddf.b.sum(), scheduler="sync")[0]
    assert sent.payload_bytes > ROWS * 8  # column b: 4 partitions of 400 KB
    assert sent.scatters == 0
    assert len(gclient.graph_data) == 0


def test_arrays_delayed_and_data_only_graphs(gclient: Client) -> None:
    x = np.random.default_rng(3).random(400_000)
    arr = da.from_array(x, chunks=100_000)
    # (optimised, from_array's chunks are fused into their first task's subgraph: only
    # data nodes at the top of the graph are placed)
    expected = dask.compute(arr.sum(), scheduler="sync")[0]
    assert arr.sum().compute(optimize_graph=False) == expected
    assert sum(k[0].startswith("array-") for k in gclient.graph_data.info()["keys"]) == 4
    # a graph of data nodes only, the keys themselves wanted: they stay tasks (futures
    # of them must stay recomputable), and the values come back
    sent = gclient.graph_data.info()["sent"]
    big = da.from_array(x + 1, chunks=100_000)
    chunks = gclient.get(big.__dask_graph__(), list(big.__dask_keys__()))
    np.testing.assert_array_equal(np.concatenate(chunks), x + 1)
    assert gclient.graph_data.info()["sent"] == sent
    # delayed(obj, pure=True) is named by its content; a plain delayed(obj) by a uuid,
    # so it stays inline and is not cached
    df = frame()
    assert dask.delayed(len)(dask.delayed(df, pure=True)).compute() == ROWS
    assert dask.delayed(len)(dask.delayed(df)).compute() == ROWS
    names = [k if isinstance(k, str) else k[0] for k in gclient.graph_data.info()["keys"]]
    assert sum(n.startswith("DataFrame-") for n in names) == 1


def test_persist_and_client_compute_keep_their_data_recomputable(gclient: Client) -> None:
    """Their futures may outlive the worker holding the data: the data stays in the
    graph, where the scheduler can run it again."""
    df = frame()
    ddf = dd.from_pandas(df, npartitions=4)
    with Sent(gclient) as sent:
        persisted = gclient.persist(ddf.assign(d=ddf.b * 2))
        pd.testing.assert_frame_equal(persisted.compute(), df.assign(d=df.b * 2))
        assert gclient.compute(ddf.c.max(), sync=True) == df.c.max()
    assert sent.scatters == 0 and len(gclient.graph_data) == 0
    assert sent.payload_bytes > ROWS * 8


def test_data_restricted_to_workers_stays_inline(gclient: Client) -> None:
    from dask._task_spec import DataNode, Task, TaskRef
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    name = "frompandas-" + dask.base.tokenize(frame())
    parts = [frame(i) for i in range(2)]
    worker = sorted(gclient.scheduler_info()["workers"])[0]
    data = {(name, i): DataNode((name, i), p) for i, p in enumerate(parts)}
    total = Task("total", operator.add, *(Task(None, len, TaskRef(k)) for k in data))
    graph = HighLevelGraph(
        {
            name: MaterializedLayer(data, annotations={"workers": [worker]}),
            "total": MaterializedLayer({"total": total}),
        },
        {name: set(), "total": {name}},
    )
    with Sent(gclient) as sent:
        assert gclient.get(graph, "total") == 2 * ROWS
    assert sent.scatters == 0 and len(gclient.graph_data) == 0
    # the same graph without the restriction: the partitions are placed
    graph.layers[name].annotations = None
    assert gclient.get(graph, "total") == 2 * ROWS
    assert set(gclient.graph_data.info()["keys"]) == set(data)


def test_small_data_stays_inline(gclient: Client) -> None:
    small = pd.DataFrame({"a": range(100)})
    assert dd.from_pandas(small, npartitions=2).a.sum().compute() == 4950
    assert len(gclient.graph_data) == 0


def test_a_changed_frame_gets_a_new_key_and_its_new_value(gclient: Client) -> None:
    df = frame()
    first = dd.from_pandas(df, npartitions=4)
    assert first.b.sum().compute() == dask.compute(first.b.sum(), scheduler="sync")[0]
    df.loc[0, "b"] = 1e9  # the user changes the frame, then builds a new collection
    second = dd.from_pandas(df, npartitions=4)
    assert second.b.sum().__dask_keys__() != first.b.sum().__dask_keys__()
    got = second.b.sum().compute()
    assert got == dask.compute(second.b.sum(), scheduler="sync")[0]
    assert got > 1e9


def test_eviction_releases_the_keys_on_the_cluster(gclient: Client) -> None:
    one = dd.from_pandas(frame(), npartitions=4)
    two = dd.from_pandas(frame(7), npartitions=4)
    # each collection's column b is 4 x 400 KB: the cache holds one of them
    with dask.config.set({"shoal.client.graph-data.cache-bytes": "2MB"}):
        one.b.sum().compute()
        first_keys = set(gclient.graph_data.info()["keys"])
        assert len(first_keys) == 4
        two.b.sum().compute()
        kept = set(gclient.graph_data.info()["keys"])
        assert kept and not kept & first_keys
        assert gclient.graph_data.info()["nbytes"] <= 2_000_000

    def on_cluster() -> set[Any]:
        return {k for keys in gclient.has_what().values() for k in keys}

    assert wait_until(lambda: not on_cluster() & first_keys, 10), on_cluster() & first_keys
    assert kept <= on_cluster()
    gclient.graph_data.clear()
    assert wait_until(lambda: not on_cluster() & kept, 10), on_cluster() & kept


@pytest.mark.parametrize("noticed", [True, False], ids=["noticed", "during-compute"])
def test_a_killed_worker_holding_cached_data_gives_the_right_value(
    spawn: Spawn, tmp_path: Path, noticed: bool
) -> None:
    """SIGKILL a worker holding cached partitions: between two computes, noticed by the
    scheduler before the next one (the cache entries erred: their data is sent again),
    or during a compute that already used the cache entries (a stopped worker killed
    while the graph waits for its data: the graph fails on lost data and ``get`` sends
    the data again). The value is right either way."""
    _, address = start_scheduler(spawn, tmp_path, "--validate")
    workers = start_workers(spawn, address, 2, "--validate")
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        names = addresses(client)
        ddf = dd.from_pandas(frame(), npartitions=4)
        expected = dask.compute(ddf.b.sum(), scheduler="sync")[0]
        assert ddf.b.sum().compute(scheduler=client.get) == expected
        assert client.graph_data.info()["sent"] == 4
        held = client.has_what()
        assert held[names["w0"]] and held[names["w1"]], held  # both hold some partitions
        lost = len(held[names["w0"]])
        if noticed:
            workers["w0"].send_signal(signal.SIGKILL)
            workers["w0"].wait(10)
            assert wait_until(lambda: names["w0"] not in client.scheduler_info()["workers"], 10)
            assert ddf.b.sum().compute(scheduler=client.get) == expected
            reused = 4 - lost  # the lost entries erred before the compute: not reused
        else:
            workers["w0"].send_signal(signal.SIGSTOP)
            with ThreadPoolExecutor(1) as pool:
                result = pool.submit(ddf.b.sum().compute, scheduler=client.get)
                time.sleep(1)  # the graph is submitted, waiting on the stopped worker
                assert not result.done()
                workers["w0"].send_signal(signal.SIGKILL)
                workers["w0"].wait(10)
                assert result.result(timeout=60) == expected
            reused = 4 + 4 - lost  # all used by the first try, the survivors by the second
        info = client.graph_data.info()
        assert (info["sent"], info["reused"]) == (4 + lost, reused)
        assert ddf.b.sum().compute(scheduler=client.get) == expected  # all cached again
        assert client.graph_data.info()["reused"] == reused + 4


def test_a_graph_submitted_before_any_worker_waits_for_one(spawn: Spawn, tmp_path: Path) -> None:
    """No worker to place the data on: it stays in the graph, which runs once a worker
    comes; the next compute places it."""
    _, address = start_scheduler(spawn, tmp_path)
    with Client(address, timeout=30) as client:
        ddf = dd.from_pandas(frame(), npartitions=4)
        expected = dask.compute(ddf.b.sum(), scheduler="sync")[0]
        with ThreadPoolExecutor(1) as pool:
            result = pool.submit(ddf.b.sum().compute, scheduler=client.get)
            time.sleep(0.5)
            assert not result.done()
            start_workers(spawn, address, 1)
            assert result.result(timeout=60) == expected
        assert len(client.graph_data) == 0
        assert ddf.b.sum().compute(scheduler=client.get) == expected
        assert len(client.graph_data) == 4
