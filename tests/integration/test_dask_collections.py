"""Dask collections on shoal: arrays, dataframes, bags and delayed computed on a
process cluster give what Dask's synchronous scheduler gives; the entry points
(``.compute()`` with shoal as the default scheduler, ``client.compute``,
``dask.compute``, ``client.get``); default-scheduler bookkeeping; ``persist``;
futures inside later graphs; annotations (retries, priority); graph errors; and the
function table (a shared by-value function crosses the wire once).

Most tests share the module-scoped process cluster (a scheduler and two single-threaded
workers, ``validate=True``): graphs stay small.
"""

from __future__ import annotations

import functools
import os
import pathlib
import time
from pathlib import Path
from typing import Any

import cloudpickle
import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask._task_spec import Alias, Task, TaskRef
from dask.utils import apply
from dask_tasks import (
    UnpickleCounter,
    counted_double,
    counted_inc,
    flaky,
    read_lines,
    record,
    record_then_wait,
    wait_for_line,
)
from tasks import wait_for_file

import shoal
from shoal import Client, Future, LocalCluster
from shoal.protocol.framing import encode_frame
from shoal.protocol.serialize import function_id

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------------ task functions
# Defined in this module: workers import them by name.


class CustomError(Exception):
    pass


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def combine(items, mapping, scale=1, offset=0):
    """Sums a list and the values of a dict (nested lists allowed), scaled."""
    total = 0
    for v in [*items, *mapping.values()]:
        total += sum(v) if isinstance(v, list) else v
    return total * scale + offset


def describe(items, mapping, *, label):
    return {"label": label, "items": list(items), "keys": sorted(mapping), "mapping": mapping}


def explode(x):
    raise CustomError(f"exploded on {x}")


def explode_block(block):
    if block.ravel()[0] >= 10:
        raise ZeroDivisionError("bad block")
    return block


def getpid(_):
    return os.getpid()


# ------------------------------------------------------------------------ helpers


def tasks_run(client: Client) -> int:
    return sum(w["tasks_run"] for w in client.scheduler_info()["workers"].values())


def assert_same(got: Any, expected: Any) -> None:
    """Equal values: numpy arrays and pandas objects exactly (dtype, shape, index, order)."""
    if isinstance(expected, pd.DataFrame):
        pd.testing.assert_frame_equal(got, expected)
    elif isinstance(expected, pd.Series):
        pd.testing.assert_series_equal(got, expected)
    elif isinstance(expected, pd.Index):
        pd.testing.assert_index_equal(got, expected)
    elif isinstance(expected, np.ndarray | np.generic):
        got = np.asarray(got)
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        assert got.shape == np.shape(expected), (got.shape, np.shape(expected))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    elif isinstance(expected, tuple | list):
        assert type(got) is type(expected), (type(got), type(expected))
        assert len(got) == len(expected), (got, expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
    else:
        assert type(got) is type(expected), (type(got), type(expected))
        assert got == expected


def as_lists(obj: Any) -> Any:
    """Nested tuples of results (as Dask's ``get`` packs them) as nested lists."""
    if isinstance(obj, tuple | list):
        return [as_lists(x) for x in obj]
    return obj


def check_entry_points(client: Client, coll: Any) -> None:
    """``coll.compute()`` (shoal is the default), ``client.compute(coll).result()`` and
    ``client.compute(coll, sync=True)`` all equal Dask's synchronous scheduler."""
    (expected,) = dask.compute(coll, scheduler="sync")
    assert dask.config.get("scheduler", None) == client.get
    before = tasks_run(client)
    assert_same(coll.compute(), expected)
    assert tasks_run(client) > before, ".compute() did not run on the shoal cluster"
    fut = client.compute(coll)
    assert isinstance(fut, Future)
    assert_same(fut.result(timeout=60), expected)
    assert_same(client.compute(coll, sync=True), expected)


# ------------------------------------------------------------------------ data

RNG = np.random.default_rng(1234)
X = RNG.random((24, 18))
Y = RNG.random((18, 10))
PDF = pd.DataFrame(
    {
        "k": RNG.integers(0, 7, 120),
        "v": RNG.random(120),
        "w": RNG.integers(-50, 50, 120),
        "s": RNG.choice(["a", "b", "c"], 120),
    }
)
RIGHT = pd.DataFrame({"k": np.arange(10), "name": [f"n{i}" for i in range(10)]})


def _x() -> da.Array:
    return da.from_array(X, chunks=(6, 9))


def _y() -> da.Array:
    return da.from_array(Y, chunks=(9, 5))


def _ddf() -> dd.DataFrame:
    return dd.from_pandas(PDF, npartitions=4)


ARRAY_CASES = {
    "elementwise": lambda: (_x() + 1) * 2 - da.sin(_x()) / (_x() + 3),
    "sum": lambda: _x().sum(),
    "mean": lambda: _x().mean(),
    "std": lambda: _x().std(),
    "sum-axis0": lambda: _x().sum(axis=0),
    "sum-axis1": lambda: _x().sum(axis=1),
    "max-argmin": lambda: da.stack([_x().max(axis=0), _x().argmin(axis=0).astype(float)]),
    "rechunk": lambda: _x().rechunk((5, 7)) + 1,
    "rechunk-transpose": lambda: _x().T.rechunk((18, 4)),
    "matmul": lambda: _x() @ _y(),
    "slicing": lambda: _x()[3:20:2, ::-3],
    "fancy-slicing": lambda: _x()[[0, 7, 3, 23, 7], :][:, [17, 0, 5]],
    "boolean-slicing": lambda: _x()[_x()[:, 0] > 0.5],
    "map-blocks": lambda: _x().map_blocks(lambda b: b * b.shape[0], dtype=float),
}


DATAFRAME_CASES = {
    "groupby-agg": lambda: _ddf().groupby("k").agg({"v": ["sum", "mean", "max"], "w": "count"}),
    "groupby-std": lambda: _ddf().groupby(["k", "s"]).v.std(),
    "merge": lambda: _ddf().merge(
        dd.from_pandas(RIGHT, npartitions=3), on="k", how="inner", shuffle_method="tasks"
    ),
    "set-index": lambda: _ddf().set_index("v", shuffle_method="tasks"),
    "shuffle": lambda: _ddf().shuffle("k", shuffle_method="tasks"),
    "map-partitions-lambda": lambda: _ddf().map_partitions(
        lambda p: p.assign(z=p.v * 2 + p.k, n=len(p))
    ),
    "filter-reduce": lambda: _ddf()[_ddf().v > 0.3].w.mean(),
    "value-counts": lambda: _ddf().s.value_counts(),
}


def _bag() -> db.Bag:
    return db.from_sequence(range(200), npartitions=5)


BAG_CASES = {
    "map": lambda: _bag().map(inc),
    "map-filter": lambda: _bag().map(lambda x: x * 3).filter(lambda x: x % 2 == 0),
    "foldby": lambda: _bag().foldby(lambda x: x % 7, add, 0, add, 0),
    "frequencies": lambda: _bag().map(lambda x: x % 9).frequencies(sort=True),
    "sum": lambda: _bag().map(inc).sum(),
    "pluck-distinct": lambda: _bag().map(lambda x: {"a": x % 4, "b": x}).pluck("a").distinct(),
}


def _delayed_dag() -> Any:
    d = dask.delayed
    a = d(inc)(1)
    b = d(add)(a, 10)
    c = d(inc)(b)
    nested = d(combine)([a, [b, c], 5], {"x": c, "y": [a, 3]}, scale=d(inc)(1), offset=b)
    desc = d(describe)([a, b], {"p": c, "q": [a, {"r": b}]}, label=d(str)(c))
    return d(lambda n, dd_: (n, dd_))(nested, desc)


# ------------------------------------------------------------------------ 1. same results


@pytest.mark.parametrize("case", list(ARRAY_CASES))
def test_array_matches_sync(client: Client, case: str) -> None:
    check_entry_points(client, ARRAY_CASES[case]())


@pytest.mark.parametrize("case", list(DATAFRAME_CASES))
def test_dataframe_matches_sync(client: Client, case: str) -> None:
    check_entry_points(client, DATAFRAME_CASES[case]())


@pytest.mark.parametrize("case", list(BAG_CASES))
def test_bag_matches_sync(client: Client, case: str) -> None:
    check_entry_points(client, BAG_CASES[case]())


def test_delayed_matches_sync(client: Client) -> None:
    dag = _delayed_dag()
    (expected,) = dask.compute(dag, scheduler="sync")
    assert expected[0] > 0 and expected[1]["label"] == "13"  # the DAG did what we meant
    check_entry_points(client, dag)


def test_compute_runs_on_workers(client: Client, cluster: LocalCluster) -> None:
    pids = dask.compute(*[dask.delayed(getpid)(i) for i in range(6)])
    assert set(pids) <= set(cluster.worker_pids)
    assert os.getpid() not in pids


# Dask warns that mixing expression- and graph-backed collections materialises them.
@pytest.mark.filterwarnings("ignore:Computing mixed collections:UserWarning")
def test_dask_compute_several_collections(client: Client) -> None:
    colls = (
        ARRAY_CASES["matmul"](),
        ARRAY_CASES["std"](),
        DATAFRAME_CASES["groupby-agg"](),
        DATAFRAME_CASES["merge"](),
        BAG_CASES["foldby"](),
        _delayed_dag(),
    )
    expected = dask.compute(*colls, scheduler="sync")
    before = tasks_run(client)
    got = dask.compute(*colls)
    assert tasks_run(client) > before
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_same(g, e)
    # plain values pass through; a dict of collections keeps its shape
    (out,) = dask.compute({"arr": colls[1], "plain": 7, "nested": [colls[4], "x"]})
    assert set(out) == {"arr", "plain", "nested"}
    assert_same(out["arr"], expected[1])
    assert out["plain"] == 7
    assert out["nested"][1] == "x"
    assert_same(out["nested"][0], expected[4])
    # client.compute of a list: a list of futures, one per collection
    futs = client.compute(list(colls))
    assert isinstance(futs, list) and len(futs) == len(colls)
    assert all(isinstance(f, Future) for f in futs)
    for f, e in zip(futs, expected):
        assert_same(f.result(timeout=60), e)


def test_client_get_plain_graph(client: Client) -> None:
    dsk = {
        "a": 1,
        "b": (inc, "a"),
        "c": (add, "a", "b"),
        ("x", 0): (sum, ["a", "b", "c"]),
        ("x", 1): (add, (inc, "b"), 10),  # an inline task as an argument
        "d": (combine, ["a", ("x", 0), ["b", 4]], {"u": 5}),  # a dict is a literal
        # keyword arguments the legacy way
        "e": (apply, describe, [["a", ("x", 1)], {"p": "a"}], (dict, [["label", "c"]])),
        "lit": "a plain string",
        "alias": "c",
    }
    keys = [["a", "b"], "c"]
    got = client.get(dsk, keys)
    # the same nesting, as lists (Dask's synchronous get answers with tuples)
    assert got == [[1, 2], 3]
    assert as_lists(dask.get(dsk, keys)) == got

    deep = [("x", 0), ["d", ["e", [("x", 1)]]], "lit", "alias"]
    got = client.get(dsk, deep)
    assert got == as_lists(dask.get(dsk, deep))
    assert got[0] == 6 and got[1][0] == 1 + 6 + 2 + 4 + 5
    assert got[1][1][0] == {"label": 3, "items": [1, 13], "keys": ["p"], "mapping": {"p": "a"}}
    assert got[1][1][1] == [13] and got[2:] == ["a plain string", 3]
    assert isinstance(got[1], list) and isinstance(got[1][1], list)
    # a single key: its value, not a list
    assert client.get(dsk, ("x", 1)) == dask.get(dsk, ("x", 1)) == 13
    assert client.get(dsk, "c") == 3
    # Dask's own Task spec in a plain dict
    spec = {
        "p": Task("p", inc, 41),
        "q": Task("q", add, TaskRef("p"), 100),
        "r": Alias("r", "q"),
    }
    assert client.get(spec, ["p", ["q", "r"]]) == [42, [142, 142]]
    # dask.get (the synchronous scheduler) agrees on the Task spec graph
    assert as_lists(dask.get(spec, ["p", ["q", "r"]])) == [42, [142, 142]]


# ------------------------------------------------------------------------ 2. default scheduler


def test_config_set_scheduler_with_non_default_client(cluster: LocalCluster) -> None:
    before = dask.config.get("scheduler", None)
    with Client(cluster, timeout=30, set_as_default=False) as c:
        assert dask.config.get("scheduler", None) == before
        assert dask.config.get("scheduler", None) != c.get
        x = ARRAY_CASES["matmul"]()
        (expected,) = dask.compute(x, scheduler="sync")
        with dask.config.set(scheduler=c.get):
            n0 = tasks_run(c)
            assert_same(x.compute(), expected)
            assert_same(
                dask.compute(BAG_CASES["foldby"]())[0],
                BAG_CASES["foldby"]().compute(scheduler="sync"),
            )
            assert tasks_run(c) > n0
        assert dask.config.get("scheduler", None) == before
        # the scheduler= keyword of compute takes client.get too
        assert_same(x.compute(scheduler=c.get), expected)
    assert dask.config.get("scheduler", None) == before


def test_closing_default_client_restores_previous(cluster: LocalCluster) -> None:
    assert dask.config.get("scheduler", None) is None
    c = Client(cluster, timeout=30)
    try:
        assert dask.config.get("scheduler", None) == c.get
    finally:
        c.close()
    assert dask.config.get("scheduler", None) is None
    assert "scheduler" not in dask.config.config or dask.config.config["scheduler"] is None
    # a setting made before the client came back when it closes
    with dask.config.set(scheduler="sync"):
        with Client(cluster, timeout=30) as c:
            assert dask.config.get("scheduler") == c.get
            assert da.ones(4, chunks=2).sum().compute() == 4
        assert dask.config.get("scheduler") == "sync"
    assert dask.config.get("scheduler", None) is None
    # a setting the user made while the client was open is left alone at close
    with dask.config.set(scheduler="sync"):
        with Client(cluster, timeout=30):
            dask.config.set(scheduler="threads")
        assert dask.config.get("scheduler") == "threads"
    assert dask.config.get("scheduler", None) is None


def test_two_clients_newest_is_default(cluster: LocalCluster) -> None:
    previous = dask.config.get("scheduler", None)
    c1 = Client(cluster, timeout=30)
    c2 = None
    try:
        assert dask.config.get("scheduler") == c1.get
        c2 = Client(cluster, timeout=30)
        assert dask.config.get("scheduler") == c2.get
        assert dask.delayed(inc)(1).compute() == 2
        c2.close()
        assert dask.config.get("scheduler") == c1.get
        assert dask.delayed(inc)(2).compute() == 3  # through c1: c2 is closed
        c1.close()
        assert dask.config.get("scheduler", None) == previous
        # the other order: the older closes first, the newer stays the default
        c1 = Client(cluster, timeout=30)
        c2 = Client(cluster, timeout=30)
        c1.close()
        assert dask.config.get("scheduler") == c2.get
        assert dask.delayed(inc)(3).compute() == 4
        c2.close()
        assert dask.config.get("scheduler", None) == previous
        # a client with set_as_default=False does not take over
        c1 = Client(cluster, timeout=30)
        c2 = Client(cluster, timeout=30, set_as_default=False)
        assert dask.config.get("scheduler") == c1.get
        c2.close()
        assert dask.config.get("scheduler") == c1.get
        c1.close()
        assert dask.config.get("scheduler", None) == previous
    finally:
        c1.close()
        if c2 is not None:
            c2.close()


# ------------------------------------------------------------------------ 3. persist


def test_persist_then_compute_reuses_chunks(
    client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    log = str(tmp_path / "calls")
    # meta= so that Dask does not call the function here to guess the output type
    x = da.from_array(np.arange(40.0), chunks=10).map_blocks(
        counted_double, log, dtype=float, meta=np.array((), dtype=float)
    )
    assert x.npartitions == 4
    (y,) = [client.persist(x)]
    assert isinstance(y, da.Array) and y.chunks == x.chunks
    futures = [v for v in dict(y.__dask_graph__()).values() if isinstance(v, Future)]
    assert len(futures) == 4
    shoal.wait(futures, timeout=60)
    assert len(read_lines(log)) == 4
    expected = np.arange(40.0) * 2
    assert_same(y.compute(), expected)
    assert_same((y + 1).sum().compute(), np.float64((expected + 1).sum()))
    assert_same(client.compute(y[5:35] * 3).result(timeout=60), expected[5:35] * 3)
    assert len(read_lines(log)) == 4, read_lines(log)  # never again
    # a persisted delayed, a bag and a list of collections
    d = client.persist(dask.delayed(counted_inc)(1, log))
    b = db.from_sequence(range(6), npartitions=3).map(counted_inc, log)
    b2, d2 = client.persist([b, dask.delayed(counted_inc)(100, log)])
    assert d.compute() == 2 and dask.delayed(inc)(d).compute() == 3
    assert b2.sum().compute() == sum(range(1, 7))
    assert b2.compute() == list(range(1, 7))
    assert d2.compute() == 101
    assert len(read_lines(log)) == 4 + 1 + 6 + 1, read_lines(log)
    pids = {int(line.split()[0]) for line in read_lines(log)}
    assert pids <= set(cluster.worker_pids), (pids, cluster.worker_pids)


def test_persist_returns_at_once(client: Client, stop_file: Path) -> None:
    slow = dask.delayed(wait_for_file)(str(stop_file))
    start = time.monotonic()
    p = client.persist(slow)
    assert time.monotonic() - start < 5, "persist waited for the work"
    (fut,) = [v for v in dict(p.__dask_graph__()).values() if isinstance(v, Future)]
    assert not fut.done()
    arr = da.from_delayed(slow, shape=(), dtype=object)
    q = client.persist(arr)
    assert time.monotonic() - start < 5
    assert not fut.done()
    stop_file.touch()
    assert p.compute() == "released"
    assert q.compute() == np.array("released", dtype=object)
    assert fut.result(timeout=30) == "released"


# ------------------------------------------------------------------------ 4. futures in graphs


def test_futures_inside_later_graphs(client: Client) -> None:
    f = client.submit(inc, 1)
    g = client.submit(add, 10, 20)
    assert dask.delayed(inc)(f).compute() == 3
    assert client.compute(dask.delayed(add)(f, g)).result(timeout=60) == 32
    assert dask.delayed(combine)([f, g], {"f": f}, scale=g).compute() == (2 + 30 + 2) * 30
    assert dask.delayed(sum)([f, g, 5]).compute() == 37
    # a future as a delayed value, and a chain on it
    assert (dask.delayed(f) + 1).compute() == 3
    # client.get with a graph that refers to a future by key
    assert client.get({"z": (add, f, g)}, "z") == 32
    # a held key by reference (a plain string stays a string in a legacy task, as in Dask)
    assert client.get({"z": Task("z", add, TaskRef(f.key), 1)}, "z") == 3
    assert client.get({"z": Alias("z", g.key)}, "z") == 30
    assert client.get({"z": (add, f.key, "!")}, "z") == f.key + "!"
    # dask arrays from futures
    parts = [client.submit(np.arange, i * 5, (i + 1) * 5) for i in range(4)]
    arr = da.concatenate([da.from_delayed(dask.delayed(p), shape=(5,), dtype=int) for p in parts])
    assert_same(arr.compute(), np.arange(20))
    assert_same((arr * 2).sum().compute(), np.int64(2 * sum(range(20))))
    assert_same(client.compute(arr[3:17]).result(timeout=60), np.arange(3, 17))
    m = client.submit(np.ones, (4, 4))
    assert_same(
        da.from_delayed(m, shape=(4, 4), dtype=float).sum(axis=0).compute(), np.full(4, 4.0)
    )


# ------------------------------------------------------------------------ 5. annotations


def test_annotate_retries(client: Client, tmp_path: Path) -> None:
    counter = str(tmp_path / "attempts")
    with dask.annotate(retries=2):
        t = dask.delayed(flaky)(counter, 2)
    assert t.compute() == "ok after 3 attempts"
    assert len(read_lines(counter)) == 3
    # the retries= option of client.compute does the same
    counter2 = str(tmp_path / "attempts2")
    fut = client.compute(dask.delayed(flaky)(counter2, 1), retries=1)
    assert fut.result(timeout=60) == "ok after 2 attempts"


def test_no_retries_raises_original_exception(client: Client, tmp_path: Path) -> None:
    counter = str(tmp_path / "attempts")
    t = dask.delayed(flaky)(counter, 2)
    with pytest.raises(RuntimeError, match="flaky attempt 1") as info:
        t.compute()
    assert type(info.value) is RuntimeError
    assert len(read_lines(counter)) == 1
    # too few retries: the last attempt's exception
    counter2 = str(tmp_path / "attempts2")
    with dask.annotate(retries=1):
        t2 = dask.delayed(flaky)(counter2, 2)
    with pytest.raises(RuntimeError, match="flaky attempt 2"):
        client.compute(t2).result(timeout=60)
    assert len(read_lines(counter2)) == 2


@pytest.fixture
def one_thread_cluster() -> Any:
    with LocalCluster(n_workers=1, threads_per_worker=1, timeout=60, validate=True) as c:
        yield c


def _run_blocked(client: Client, tmp_path: Path, name: str, submit: Any) -> list[str]:
    """Hold the only thread with a task, let ``submit(log)`` queue tasks behind it,
    release; the order in which the queued tasks ran.

    A worker may hold one task more than it has threads (as Dask's worker-saturation
    allows): a second blocked task, submitted on its own, takes that slot, so that
    everything ``submit`` sends waits in the scheduler's queue."""
    log = str(tmp_path / f"{name}.log")
    stop = str(tmp_path / f"{name}.stop")
    try:
        blocker = client.compute(dask.delayed(record_then_wait)(log, "blocker", stop))
        wait_for_line(log, "blocker")
        filler = client.compute(dask.delayed(record_then_wait)(log, "filler", stop))
        time.sleep(0.2)  # the filler reaches the worker before the rest is submitted
        futures = submit(log)
        time.sleep(0.2)  # let the scheduler take them all in before the thread frees
        assert read_lines(log) == ["blocker"]
    finally:
        Path(stop).touch()
    assert blocker.result(timeout=60) == "blocker"
    assert filler.result(timeout=60) == "filler"
    shoal.wait(futures, timeout=60)
    for f in futures:
        f.result(timeout=10)
    lines = read_lines(log)
    assert lines[0] == "blocker"
    return [line for line in lines[1:] if line != "filler"]


def test_priorities(one_thread_cluster: LocalCluster, tmp_path: Path) -> None:
    with Client(one_thread_cluster, timeout=30) as client:

        def annotated(log: str) -> list[Future]:
            tasks = []
            for p, tag in [(0, "zero"), (-5, "minus5"), (10, "ten"), (5, "five"), (1, "one")]:
                with dask.annotate(priority=p):
                    tasks.append(dask.delayed(record)(log, tag))
            return client.compute(tasks)

        order = _run_blocked(client, tmp_path, "annotate", annotated)
        assert order == ["ten", "five", "one", "zero", "minus5"]

        def by_keyword(log: str) -> list[Future]:
            out = []
            for p, tag in [(0, "zero"), (-3, "minus3"), (7, "seven"), (3, "three")]:
                out.append(client.compute(dask.delayed(record)(log, tag), priority=p))
            return out

        order = _run_blocked(client, tmp_path, "keyword", by_keyword)
        assert order == ["seven", "three", "zero", "minus3"]


# ------------------------------------------------------------------------ 6. graph errors


def test_cycle_raises_at_submission(client: Client) -> None:
    held = len(client._states)
    with pytest.raises(ValueError, match="cycle") as info:
        client.get({"a": (inc, "b"), "b": (inc, "a")}, "a")
    assert "'a'" in str(info.value) and "'b'" in str(info.value)
    assert len(client._states) == held
    # a cycle below an innocent key: the keys on the cycle are named
    dsk = {"top": (inc, "p"), "p": (add, "q", "leaf"), "q": (inc, "r"), "r": (inc, "p"), "leaf": 1}
    with pytest.raises(ValueError, match="cycle") as info:
        client.get(dsk, "top")
    msg = str(info.value)
    assert all(f"'{k}'" in msg for k in ("p", "q", "r")), msg
    assert len(client._states) == held
    # the client is still fine
    assert client.get({"a": 1, "b": (inc, "a")}, "b") == 2


def test_missing_dependency_raises(client: Client) -> None:
    held = len(client._states)
    with pytest.raises(ValueError, match="missing-key"):
        client.get({"a": Task("a", inc, TaskRef("missing-key"))}, "a")
    with pytest.raises(ValueError, match="missing-key"):
        client.get({"a": Alias("a", "missing-key"), "b": Task("b", inc, TaskRef("a"))}, "b")
    with pytest.raises(ValueError, match="missing-key"):
        client.get({"a": (inc, TaskRef("missing-key")), "b": 1}, ["a", "b"])
    assert len(client._states) == held
    assert client.get({"a": 1, "b": (inc, "a")}, "b") == 2


def test_task_error_reraises_original_type(client: Client) -> None:
    with pytest.raises(CustomError, match="exploded on 3") as info:
        dask.delayed(explode)(3).compute()
    assert type(info.value) is CustomError
    bad = dask.delayed(inc)(dask.delayed(explode)(dask.delayed(inc)(1)))
    with pytest.raises(CustomError, match="exploded on 2"):
        client.compute(bad).result(timeout=60)
    arr = da.arange(20, chunks=5).map_blocks(explode_block)
    with pytest.raises(ZeroDivisionError, match="bad block"):
        arr.sum().compute()
    with pytest.raises(ZeroDivisionError):
        dask.compute(arr, da.ones(3))
    with pytest.raises(CustomError):
        client.get({"a": 1, "b": (explode, "a")}, ["b"])
    # a graph error does not break later work
    assert dask.delayed(inc)(1).compute() == 2


def test_compute_again_after_cancel_and_release(client: Client, stop_file: Path) -> None:
    slow = dask.delayed(wait_for_file)(str(stop_file))
    f = client.compute(slow)
    client.cancel(f)
    assert f.cancelled()
    del f  # the cancelled future is gone: computing the collection again starts afresh
    stop_file.touch()
    assert client.compute(slow).result(timeout=60) == "released"
    assert slow.compute() == "released"


def test_compute_again_after_cancel(client: Client, stop_file: Path) -> None:
    slow = dask.delayed(wait_for_file)(str(stop_file))
    f = client.compute(slow)
    client.cancel(f)
    assert f.cancelled()
    stop_file.touch()
    g = client.compute(slow)  # the same collection, so the same keys
    assert g.result(timeout=60) == "released"
    assert f.cancelled()


def test_float_key_does_not_kill_the_client(client: Client) -> None:
    dsk = {1.5: 1, "b": (inc, 1.5)}
    assert dask.get(dsk, "b") == 2  # a valid Dask graph
    assert client.get(dsk, "b") == 2
    # A key no Dask graph may have is refused at submission, naming it.
    with pytest.raises(TypeError, match="invalid key b'bk'"):
        client.submit(inc, 1, key=b"bk")
    with pytest.raises(TypeError, match="invalid key"):
        client.get({("x", frozenset({1})): 1}, ("x", frozenset({1})))
    assert client.status == "running"
    assert client.submit(inc, 41).result(timeout=30) == 42


# ------------------------------------------------------------------------ 7. the function table


class WireCounter:
    """Wraps a connection's transport and keeps every byte written."""

    def __init__(self, transport: Any):
        self._transport = transport
        self.chunks: list[bytes] = []

    def writelines(self, data: Any) -> None:
        data = list(data)
        self.chunks.append(b"".join(bytes(d) for d in data))
        self._transport.writelines(data)

    def write(self, data: Any) -> None:
        self.chunks.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def count(self, needle: bytes) -> int:
        return b"".join(self.chunks).count(needle)


@pytest.fixture(scope="module")
def fast_cluster() -> Any:
    """Like ``cluster`` but without ``validate=True``: checking every invariant after
    every batch is O(tasks), too slow for 20,000 tasks."""
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as c:
        yield c


@pytest.fixture
def fast_client(fast_cluster: LocalCluster) -> Any:
    with Client(fast_cluster, timeout=30) as c:
        yield c


@pytest.fixture
def wire(fast_client: Client) -> Any:
    """Every byte ``fast_client`` sends to the scheduler: through its transport, and
    the frames its calling thread writes on the socket itself (``write_direct``)."""
    conn = fast_client._conn
    assert conn is not None and conn.transport is not None
    original = conn.transport
    counter = WireCounter(original)
    write_direct = conn.write_direct

    def counted_write_direct(msgs: list[Any]) -> bool:
        written = write_direct(msgs)
        if written:
            counter.chunks.append(b"".join(bytes(p) for p in encode_frame(msgs)))
        return written

    conn.transport = counter
    conn.write_direct = counted_write_direct  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        conn.transport = original
        del conn.write_direct


def _sent_once(client: Client, wire: WireCounter, func: Any, marker: bytes) -> None:
    data = cloudpickle.dumps(func, protocol=5)
    fid = function_id(data)
    assert client._functions.bytes.get(fid) == data
    assert fid in client._sent_functions
    assert wire.count(data) == 1, f"the function's bytes went out {wire.count(data)} times"
    assert wire.count(marker) == 1, f"the function's body went out {wire.count(marker)} times"


def test_function_sent_once_map(
    fast_client: Client, fast_cluster: LocalCluster, wire: WireCounter, tmp_path: Path
) -> None:
    loads = UnpickleCounter(str(tmp_path / "loads"))

    def shifted(x):
        assert loads is not None  # loading the function loads ``loads``: one line
        return (x, "marker-map-5c1e")[0] + 3

    n_before = len(fast_client._functions.bytes)
    futs = fast_client.map(shifted, range(20_000))
    assert len(fast_client._functions.bytes) == n_before + 1
    total = fast_client.submit(sum, futs)
    assert total.result(timeout=90) == sum(range(20_000)) + 3 * 20_000
    assert futs[0].result(timeout=10) == 3
    _sent_once(fast_client, wire, shifted, b"marker-map-5c1e")
    # deserialised once per worker (both ran some), never by the scheduler or here
    pids = [int(p) for p in read_lines(loads.path)]
    assert sorted(pids) == sorted(fast_cluster.worker_pids), pids


def test_function_sent_once_partials(
    fast_client: Client, wire: WireCounter, tmp_path: Path
) -> None:
    def path_len(path, i):
        return len(str(path)) + i + len("marker-partial-9d2b") * 0

    n_before = len(fast_client._functions.bytes)
    futs = [
        fast_client.submit(functools.partial(path_len, pathlib.Path(tmp_path, f"f{i}")), i)
        for i in range(20_000)
    ]
    # one table entry for the function; the partials' arguments travel with the tasks
    assert len(fast_client._functions.bytes) == n_before + 1
    assert len({f.key for f in futs}) == 20_000
    total = fast_client.submit(sum, futs)
    base = len(str(tmp_path))
    expected = sum(base + len(f"/f{i}") + i for i in range(20_000))
    assert total.result(timeout=90) == expected
    _sent_once(fast_client, wire, path_len, b"marker-partial-9d2b")


def test_function_sent_once_dask_graphs(fast_client: Client, wire: WireCounter) -> None:
    tag = lambda x: (x, "marker-lambda-77aa")[0] * 2  # noqa: E731
    n_before = len(fast_client._functions.bytes)
    bag = db.from_sequence(range(3000), npartitions=30).map(tag).filter(lambda x: x % 3 == 0)
    expected = [x * 2 for x in range(3000) if (x * 2) % 3 == 0]
    assert bag.compute() == expected
    # many delayed tasks with the same function, and again in a later graph
    outs = dask.compute(*[dask.delayed(tag)(i) for i in range(500)])
    assert list(outs) == [2 * i for i in range(500)]
    outs = fast_client.compute([dask.delayed(tag)(i) for i in range(500, 800)], sync=True)
    assert outs == [2 * i for i in range(500, 800)]
    # an array graph using the same function in every block
    arr = da.arange(200, chunks=10).map_blocks(tag, dtype=int)
    assert_same(arr.compute(), np.arange(200) * 2)
    # functions registered: the lambda, the filter's lambda and Dask's own by-value
    # helpers, if any: never one per task
    assert len(fast_client._functions.bytes) - n_before < 40
    _sent_once(fast_client, wire, tag, b"marker-lambda-77aa")


def test_get_sends_no_task_for_a_key_that_only_names_another(client: Client) -> None:
    """Dask's finalize step of an array reduction is an ``Alias`` of the last reduction:
    through ``get`` (what ``.compute()`` calls) its value is the named key's, with no
    task and no scheduler round trip of its own; ``client.compute`` still gives a future
    under the collection's own key."""
    from shoal.protocol import messages as m

    x = da.ones((100, 100), chunks=50).sum()
    sent: list[Any] = []
    send = client._send

    def recording_send(msg: m.Message) -> None:
        if isinstance(msg, m.SubmitTasks):
            sent.extend(spec.key for spec in msg.tasks)
        send(msg)

    client._send = recording_send  # type: ignore[method-assign]
    try:
        assert dask.compute(x, scheduler=client.get)[0] == 10_000
        through_get = list(sent)
        sent.clear()
        future = client.compute(x)
        assert future.result(timeout=30) == 10_000
    finally:
        del client._send
    assert through_get and not any(str(k).startswith("finalize-") for k in through_get)
    assert str(future.key).startswith("finalize-") and future.key in sent


def _library_threads() -> dict[str, str | None]:
    return {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def test_workers_run_numerical_libraries_single_threaded(client: Client) -> None:
    """A worker's BLAS does not start threads of its own (they oversubscribed the cores:
    a small matmul chunk took 70x its time), unless the user's environment set them."""
    on_workers = client.run(_library_threads)
    assert on_workers
    for values in on_workers.values():
        for variable, value in values.items():
            assert value == os.environ.get(variable, "1"), variable


def test_a_cell_run_again_is_not_ordered_again_and_gives_the_same_result(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same collection computed again: Dask names its final step anew, the client
    finds dask.order's order by the graph's structure (client/graph/order_cache.py)."""
    from order_helpers import count_dask_order

    calls = count_dask_order(monkeypatch)
    x = da.arange(1_000, chunks=100)
    cell = (x + x[::-1]).sum()
    with dask.config.set(scheduler="sync"):
        expected = cell.compute()
    calls.clear()
    hits = client._orders.hits
    first = cell.compute(scheduler=client.get)
    ordered_once = len([n for n in calls if n > 4])
    second = cell.compute(scheduler=client.get)
    assert first == second == expected
    assert ordered_once >= 1 and client._orders.hits == hits + 1
    # (dask's own calls on the two-task finalize graph happen in both; shoal's only once)
    assert len([n for n in calls if n > 4]) == ordered_once
