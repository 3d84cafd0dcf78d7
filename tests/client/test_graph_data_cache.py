"""The graph-data cache on its own (shoal/client/graph/data.py): which keys count as
named by their content, the LRU bound in bytes, and entries that are not reused."""

from __future__ import annotations

import weakref
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask._task_spec import DataNode
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.client.graph.dask_graph import materialize
from shoal.client.graph.data import Entry, GraphDataCache, content_keyed, data_size


class FakeFuture:
    """What the cache looks at: a key and a status; ``released`` when dropped."""

    def __init__(self, key: Any, status: str = "finished"):
        self.key = key
        self.status = status


def entry(key: Any, nbytes: int, type_name: str = "pandas.DataFrame") -> Entry:
    return Entry(FakeFuture(key), type_name, nbytes)  # type: ignore[arg-type]


@pytest.fixture
def cache() -> GraphDataCache:
    return GraphDataCache(None)  # type: ignore[arg-type]


def data_keys(coll: Any) -> list[Any]:
    dsk, _ = materialize(coll.__dask_graph__())
    return [k for k, node in dsk.items() if type(node) is DataNode]


def test_dask_names_its_data_by_content_except_plain_delayed() -> None:
    df = pd.DataFrame({"a": np.arange(1000)})
    for coll in (
        dd.from_pandas(df, npartitions=2),
        da.from_array(np.arange(1000), chunks=500),
        dask.delayed(df, pure=True),
    ):
        keys = data_keys(coll)
        assert keys and all(content_keyed(k) for k in keys), keys
    # the same content gives the same keys; other content other keys
    assert data_keys(dask.delayed(df.copy(), pure=True)) == data_keys(dask.delayed(df, pure=True))
    assert data_keys(dd.from_pandas(df, npartitions=2)) == data_keys(
        dd.from_pandas(df.copy(), npartitions=2)
    )
    changed = df.copy()
    changed.loc[3, "a"] = -1
    assert set(data_keys(dd.from_pandas(changed, npartitions=2))).isdisjoint(
        data_keys(dd.from_pandas(df, npartitions=2))
    )
    # delayed(obj) without pure=True is named by a uuid: not content
    assert not any(content_keyed(k) for k in data_keys(dask.delayed(df)))
    for key in ("x", ("x", 0), "data-1", ("array-abc", 0), 5):
        assert not content_keyed(key)


def test_the_cache_keeps_the_recently_used_within_its_bytes(cache: GraphDataCache) -> None:
    with dask.config.set({"shoal.client.graph-data.cache-bytes": 300}):
        cache.add({"a-1": entry("a-1", 100), "b-1": entry("b-1", 100)}, {"a-1", "b-1"})
        assert cache.lookup("a-1", "pandas.DataFrame", 100) is not None  # a is now recent
        dropped = weakref.ref(cache._entries["b-1"].future)
        cache.add({"c-1": entry("c-1", 150)}, {"c-1"})
        assert list(cache._entries) == ["a-1", "c-1"] and cache.nbytes == 250
        assert dropped() is None  # the evicted future is released
        # the graph being submitted keeps its own data even beyond the limit, while
        # it is submitted (pinned), and nothing of it is cached beyond the limit
        cache.add({"d-1": entry("d-1", 280)}, {"d-1"})
        assert list(cache._entries) == ["d-1"] and cache.nbytes == 280
        cache.add({"e-1": entry("e-1", 400)}, {"e-1"})
        assert len(cache) == 0 and cache.nbytes == 0


def test_entries_that_cannot_be_reused_are_dropped(cache: GraphDataCache) -> None:
    cache.add({"a-1": entry("a-1", 100), "b-1": entry("b-1", 100)}, set())
    assert cache.lookup("a-1", "numpy.ndarray", 100) is None  # another type
    assert cache.lookup("b-1", "pandas.DataFrame", 99) is None  # another size
    assert len(cache) == 0 and cache.nbytes == 0
    for status in ("error", "cancelled", "pending"):
        cache.add({"c-1": entry("c-1", 10)}, set())
        cache._entries["c-1"].future.status = status
        assert cache.lookup("c-1", "pandas.DataFrame", 10) is None
        assert "c-1" not in cache
    cache.add({"d-1": entry("d-1", 10)}, set())
    cache.drop(["d-1", "unknown"])
    assert len(cache) == 0 and cache.nbytes == 0


def test_a_bad_setting_is_named(cache: GraphDataCache) -> None:
    with (
        dask.config.set({"shoal.client.graph-data.cache-bytes": "lots"}),
        pytest.raises(ValueError, match="cache-bytes"),
    ):
        cache.add({"a-1": entry("a-1", 1)}, set())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "lookup", "lookup-same", "fail", "drop", "clear"]),
            st.sampled_from(["a-1", "b-1", "c-1"]),
            st.sampled_from([50, 100]),
            st.sampled_from(["pandas.DataFrame", "numpy.ndarray"]),
        ),
        max_size=40,
    ),
    st.integers(0, 300),
)
def test_any_sequence_keeps_the_bound_and_never_returns_a_stale_entry(
    ops: list[tuple[str, str, int, str]], limit: int
) -> None:
    """Whatever happens, the byte count is the entries' sum, within the limit after an
    add, and a lookup only returns a finished future of the same type and size: an
    erred (lost) entry or another value under the key is sent again, never reused."""
    cache = GraphDataCache(None)  # type: ignore[arg-type]
    with dask.config.set({"shoal.client.graph-data.cache-bytes": limit}):
        for op, key, nbytes, type_name in ops:
            if op == "add":
                cache.add({key: entry(key, nbytes, type_name)}, {key})
                assert cache.nbytes <= limit
            elif op.startswith("lookup"):
                kept = cache._entries.get(key)
                if op == "lookup-same" and kept is not None:  # the value it was added with
                    nbytes, type_name = kept.nbytes, kept.type_name
                found = cache.lookup(key, type_name, nbytes)
                if found is not None:
                    assert kept is not None and found is kept.future
                    assert (kept.type_name, kept.nbytes, found.status) == (
                        type_name,
                        nbytes,
                        "finished",
                    )
                else:
                    assert key not in cache
            elif op == "fail" and key in cache:
                cache._entries[key].future.status = "error"
            elif op == "drop":
                cache.drop([key])
                assert key not in cache
            elif op == "clear":
                cache.clear()
            assert cache.nbytes == sum(e.nbytes for e in cache._entries.values())


def test_a_data_nodes_size_is_cheap_for_frames_and_arrays_and_dasks_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Frames and arrays: shoal's estimate (Dask's deep memory_usage costs 60-110 µs a
    partition at every compute), within a few percent of Dask's for numbers. Anything
    else: Dask's sizeof, which looks into a list's items."""
    from dask.sizeof import sizeof as dask_sizeof

    frame = pd.DataFrame({"a": np.arange(5_000), "b": np.random.default_rng(0).random(5_000)})
    array = np.ones((100, 100))
    words = ["x" * 1_000 for _ in range(200)]
    assert data_size(frame) == pytest.approx(dask_sizeof(frame), rel=0.05)
    assert data_size(frame["b"]) == pytest.approx(dask_sizeof(frame["b"]), rel=0.05)
    assert data_size(array) == array.nbytes
    assert data_size(words) == dask_sizeof(words) > 200_000  # large: placed on a worker

    import dask.sizeof

    def refuse(obj: Any) -> int:
        raise AssertionError("dask's sizeof asked about a frame or an array")

    monkeypatch.setattr(dask.sizeof, "sizeof", refuse)
    assert data_size(frame) > 80_000 and data_size(array) == 80_000
