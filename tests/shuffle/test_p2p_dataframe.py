"""shoal's P2P shuffle under dask.dataframe on a process cluster: the default method
under shoal, results equal to pandas (shuffle, merge, set_index, sort_values; empty
partitions, categorical and string columns, nulls, one output partition), "disk"
refused, "tasks" unchanged, spilling past a small buffer, and events.

Most tests share the module's cluster (two single-threaded workers, validate=True);
frames stay small. The kill test is in test_p2p_faults.py.
"""

from __future__ import annotations

import os

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from shoal import Client, LocalCluster
from shoal.shuffle._dask import DiskShuffleRefused

pytestmark = pytest.mark.timeout(120)


def frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Ints, floats with NaN, strings with nulls, a categorical, a nullable int column."""
    rng = np.random.default_rng(seed)
    ints = rng.integers(0, 25, n)
    return pd.DataFrame(
        {
            "id": np.arange(n),
            "k": ints,
            "x": np.where(ints % 7 == 0, np.nan, rng.random(n)),
            "s": pd.array([None if i % 11 == 0 else f"s{i % 13}" for i in range(n)], "string"),
            "c": pd.Categorical([["red", "green", "blue"][i % 3] for i in range(n)]),
            "n": pd.array([None if i % 5 == 0 else i for i in range(n)], "Int64"),
        }
    )


def same_rows(got: pd.DataFrame, want: pd.DataFrame, by: str | list[str] = "id") -> None:
    got = got.sort_values(by).reset_index(drop=True)
    want = want.sort_values(by).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)


def graph_names(collection) -> set[str]:
    keys = collection.__dask_graph__().keys()
    return {k[0] if isinstance(k, tuple) else k for k in keys}


def p2p_events(client: Client) -> list[dict]:
    return [data for _, data in client.get_events("p2p")]


# ------------------------------------------------------------------------ the method


def test_under_shoal_the_default_method_is_shoal_p2p(client):
    ddf = dd.from_pandas(frame(), npartitions=4)
    assert dask.utils.get_default_shuffle_method() == "p2p"
    for collection in (
        ddf.shuffle("k"),
        ddf.merge(ddf.rename(columns={"x": "y"}), on="k"),
        ddf.set_index("k"),
        ddf.sort_values("x"),
    ):
        names = graph_names(collection)
        assert any(n.startswith("shoal-shuffle-transfer-") for n in names), names
        assert any(n.startswith("shoal-shuffle-barrier-") for n in names), names
        assert not any(
            w in n for n in names for w in ("diskshuffle", "zpartd", "shuffle-partition")
        ), names


def test_an_explicit_p2p_is_shoal_p2p_too(client):
    ddf = dd.from_pandas(frame(), npartitions=3)
    s = ddf.shuffle("k", shuffle_method="p2p")
    assert any(n.startswith("shoal-shuffle-transfer-") for n in graph_names(s))
    same_rows(s.compute(), frame())
    with dask.config.set({"dataframe.shuffle.method": "p2p"}):
        same_rows(ddf.sort_values("id").compute(), frame())


def test_disk_is_refused_saying_why(client):
    ddf = dd.from_pandas(frame(), npartitions=3)
    with pytest.raises(DiskShuffleRefused, match="rows are lost"):
        ddf.shuffle("k", shuffle_method="disk")
    with pytest.raises(DiskShuffleRefused, match="rows are lost"):
        ddf.set_index("k", shuffle_method="disk").compute()
    with (
        dask.config.set({"dataframe.shuffle.method": "disk"}),
        pytest.raises(DiskShuffleRefused, match="dataframe.shuffle.method"),
    ):
        ddf.shuffle("k").compute()


def test_tasks_still_works(client):
    ddf = dd.from_pandas(frame(), npartitions=3)
    s = ddf.shuffle("k", shuffle_method="tasks")
    assert not any("shoal-shuffle" in n for n in graph_names(s))
    same_rows(s.compute(), frame())
    with dask.config.set({"dataframe.shuffle.method": "tasks"}):
        m = ddf.merge(ddf[["id", "x"]].rename(columns={"x": "y"}), on="id")
        assert not any("shoal-shuffle" in n for n in graph_names(m))
        want = frame().merge(frame()[["id", "x"]].rename(columns={"x": "y"}), on="id")
        same_rows(m.compute(), want)


def test_without_shoal_dask_chooses_as_before():
    # No shoal client is the scheduler here (the fixtures' clients are closed).
    import dask.utils

    assert dask.utils.get_default_shuffle_method() == "disk"
    ddf = dd.from_pandas(frame(), npartitions=3)
    names = graph_names(ddf.shuffle("k"))
    assert not any("shoal-shuffle" in n for n in names)
    same_rows(ddf.shuffle("k").compute(scheduler="sync"), frame())


# ------------------------------------------------------------------------ results


@pytest.mark.parametrize("npartitions", [1, 3, 9])
def test_shuffle_equals_pandas_with_dtypes_intact(client, npartitions):
    pdf = frame()
    out = dd.from_pandas(pdf, npartitions=4).shuffle("k", npartitions=npartitions)
    got = out.compute()
    same_rows(got, pdf)
    assert out.npartitions == npartitions
    # rows with the same key are in one partition
    parts = out.to_delayed()
    keys = [set(dask.compute(p)[0]["k"]) for p in parts]
    assert sum(len(k) for k in keys) == len(set(pdf["k"]))


def test_empty_output_partitions_keep_the_dtypes(client):
    pdf = frame(60)
    pdf["k"] = pdf["k"] % 2  # two keys into many partitions: most come out empty
    out = dd.from_pandas(pdf, npartitions=3).shuffle("k", npartitions=8)
    parts = [dask.compute(p)[0] for p in out.to_delayed()]
    assert sum(len(p) == 0 for p in parts) >= 6
    for p in parts:
        assert list(p.columns) == list(pdf.columns)
        for col in ("id", "x", "s", "n"):
            assert p[col].dtype == pdf[col].dtype, (col, p[col].dtype)
    same_rows(pd.concat([p for p in parts if len(p)]), pdf)


def test_an_empty_input_partition(client):
    pdf = frame(50)
    ddf = dd.from_pandas(pdf, npartitions=3)
    ddf = ddf[ddf["id"] >= 20]  # the first partition is now empty
    same_rows(ddf.shuffle("k").compute(), pdf[pdf["id"] >= 20])


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_merge_equals_pandas(client, how):
    left = frame(300, seed=1)
    right = frame(200, seed=2)[["k", "x", "s"]].rename(columns={"x": "rx", "s": "rs"})
    right = right.drop_duplicates("k").iloc[:15]  # some keys of the left have no match
    got = dd.from_pandas(left, npartitions=4).merge(
        dd.from_pandas(right, npartitions=3), on="k", how=how
    )
    assert any(n.startswith("shoal-shuffle-transfer-") for n in graph_names(got))
    same_rows(got.compute(), left.merge(right, on="k", how=how), by=["id", "k"])


def test_join_on_the_index_equals_pandas(client):
    left = frame(200, seed=3).set_index("id")
    right = frame(150, seed=4)[["id", "x"]].rename(columns={"x": "rx"}).set_index("id")
    dl = dd.from_pandas(left, npartitions=3, sort=False)
    dr = dd.from_pandas(right, npartitions=2, sort=False)
    got = dl.join(dr, how="inner").compute().sort_index()
    pd.testing.assert_frame_equal(got, left.join(right, how="inner").sort_index())


def test_set_index_equals_pandas(client):
    pdf = frame()
    got = dd.from_pandas(pdf, npartitions=4).set_index("x").compute()
    want = pdf.set_index("x").sort_index()
    assert got.index.is_monotonic_increasing or got.index.hasnans
    pd.testing.assert_frame_equal(
        got.reset_index().sort_values(["x", "id"]).reset_index(drop=True),
        want.reset_index().sort_values(["x", "id"]).reset_index(drop=True),
    )


@pytest.mark.parametrize("by", ["x", "s", ["k", "id"]])
def test_sort_values_equals_pandas(client, by):
    pdf = frame()
    got = dd.from_pandas(pdf, npartitions=4).sort_values(by).compute()
    want = pdf.sort_values(by)
    if by == ["k", "id"]:  # a total order: the very same frame
        pd.testing.assert_frame_equal(got, want)
    else:  # ties in any order
        same_rows(got, want)
        assert list(got[by].dropna()) == sorted(pdf[by].dropna())


def test_events_record_start_and_finish(client):
    ddf = dd.from_pandas(frame(), npartitions=4)
    ddf.shuffle("k", npartitions=5).compute()
    events = p2p_events(client)
    starts = [e for e in events if e["action"] == "start"]
    finishes = [e for e in events if e["action"] == "finish"]
    assert starts and finishes
    assert starts[-1]["partitions"] == 5 and len(starts[-1]["participants"]) == 2
    assert finishes[-1]["id"] == starts[-1]["id"] and finishes[-1]["bytes_moved"] > 0


def arrow_pool() -> str:
    import pyarrow as pa

    return pa.default_memory_pool().backend_name


def test_workers_allocate_arrow_buffers_with_the_c_library(client):
    """(which gives freed memory back: mimalloc keeps it, and the worker's RSS grows)"""
    workers = list(client.scheduler_info()["workers"])
    pools = client.gather([client.submit(arrow_pool, workers=[w], pure=False) for w in workers])
    assert pools == ["system"] * len(workers)


# ------------------------------------------------------------------------ spilling


def spilled_on_workers(client: Client) -> int:
    from shoal.server.worker import current_task

    def spilled() -> int:
        current = current_task()
        assert current is not None
        return current[0].shuffle.spilled_total

    workers = list(client.scheduler_info()["workers"])
    futures = [client.submit(spilled, workers=[w], pure=False) for w in workers]
    return sum(client.gather(futures))


def test_a_shuffle_past_the_buffer_limit_spills_and_is_correct(monkeypatch):
    monkeypatch.setenv("SHOAL_SHUFFLE_BUFFER_BYTES", "20000")  # inherited by the workers
    pdf = frame(4000, seed=5)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        out = dd.from_pandas(pdf, npartitions=8).shuffle("k", npartitions=6)
        same_rows(out.compute(), pdf)
        assert spilled_on_workers(client) > 0
        (finish,) = [e for _, e in client.get_events("p2p") if e["action"] == "finish"]
        assert finish["bytes_spilled"] > 0


def test_three_workers_with_two_threads_each():
    """Several remote destinations per transfer, and transfers side by side."""
    pdf = frame(3000, seed=6)
    other = frame(500, seed=7)[["k", "x"]].drop_duplicates("k").rename(columns={"x": "y"})
    with (
        LocalCluster(n_workers=3, threads_per_worker=2, timeout=60, validate=True) as cluster,
        Client(cluster, timeout=30),
    ):
        ddf = dd.from_pandas(pdf, npartitions=10)
        same_rows(ddf.shuffle("k", npartitions=7).compute(), pdf)
        got = ddf.merge(dd.from_pandas(other, npartitions=3), on="k", how="left").compute()
        same_rows(got, pdf.merge(other, on="k", how="left"))


def test_the_graph_computed_by_another_scheduler_is_right_too(client):
    """dask.compute(..., scheduler="sync") under a shoal default: shoal's P2P graph
    runs in this process (no shoal worker), transfers handing their frames on."""
    pdf = frame()
    s = dd.from_pandas(pdf, npartitions=3).shuffle("k", npartitions=4)
    assert any(n.startswith("shoal-shuffle-transfer-") for n in graph_names(s))
    (got,) = dask.compute(s, scheduler="sync")
    same_rows(got, pdf)


DISTRIBUTED_SCRIPT = """
import dask.utils, dask.dataframe as dd, pandas as pd
import shoal.shuffle._dask as shoal_dask
from distributed import Client, LocalCluster

shoal_dask.install()  # as a shoal client would have
with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as c, Client(c):
    assert dask.utils.get_default_shuffle_method() == "p2p"
    s = dd.from_pandas(pd.DataFrame({"a": range(100)}), npartitions=2).shuffle("a")
    names = {k[0] if isinstance(k, tuple) else k for k in s.__dask_graph__()}
    assert not any("shoal" in n for n in names), names
    assert any(n.startswith("shuffle-transfer") for n in names), names
    assert sorted(s.compute()["a"]) == list(range(100))
print("ok")
"""


def test_dask_distributed_in_the_same_process_is_unchanged():
    pytest.importorskip("distributed")
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", DISTRIBUTED_SCRIPT],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
