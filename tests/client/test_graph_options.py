"""Options of a compute (priority, retries, restrictions, duration) reach every task of
the graph; annotations of its layers (``dask.annotate``) override them per key."""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
from specs_client import SpecsClient

from shoal.client.graph import collections
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.protocol.serialize import FunctionTable


def submitted(collection: Any, **options: Any) -> dict:
    client = SpecsClient()
    keys = list(collections._flatten(collection.__dask_keys__()))
    graph = collection.__dask_graph__()
    collections.submit_graph(client, graph, keys, collections._options(options))  # type: ignore[arg-type]
    return {s.key: s for s in client.specs}


def test_the_options_of_a_compute_reach_every_task():
    x = (da.ones((12,), chunks=2) + 1).sum()
    specs = submitted(x, priority=3, retries=2, workers=["w1"], duration="2s")
    assert len(specs) > 6
    for s in specs.values():
        assert (s.priority, s.retries, s.duration) == (3, 2, 2.0)
        assert s.restrictions is not None and s.restrictions.workers == ["w1"]
    plain = submitted(x)
    for s in plain.values():
        assert (s.priority, s.retries, s.duration, s.restrictions) == (0, 0, None, None)


def test_layer_annotations_override_the_options_per_key():
    with dask.annotate(priority=7, retries=1):
        a = da.ones((8,), chunks=2) + 1
    total = (a * 2).sum()
    specs = submitted(total, priority=3)
    annotated = {s.priority for s in specs.values() if s.retries == 1}
    others = {s.priority for s in specs.values() if s.retries == 0}
    assert annotated == {7} and others == {3}


def test_a_callable_option_is_asked_per_key():
    x = (da.ones((6,), chunks=2) + 1).sum()
    keys = []

    def priority(key: Any) -> int:
        keys.append(key)
        return len(keys)

    client = SpecsClient()
    names = list(collections._flatten(x.__dask_keys__()))
    with dask.annotate(priority=priority):
        graph = x.__dask_graph__()
        collections.submit_graph(client, graph, names, collections._options({}))  # type: ignore[arg-type]
    assert sorted(s.priority for s in client.specs) == list(range(1, len(client.specs) + 1))


def test_a_bad_key_in_a_graph_is_refused_naming_it():
    import pytest
    from dask._task_spec import DataNode, Task, TaskRef

    encoder = GraphEncoder(FunctionTable(), {})
    encoder.start_graph()
    for bad in [b"bk", ("x", frozenset({1})), float("nan"), ("x", (1, ("y", ("z", (2,)))))]:
        with pytest.raises(TypeError, match="invalid key"):
            encoder.task_spec(bad, DataNode(bad, 1))
        with pytest.raises(TypeError, match="invalid key"):
            encoder.task_spec(bad, Task(bad, max, TaskRef("a"), 2))
    assert encoder.task_spec(("x", 1), DataNode(("x", 1), 1)).key == ("x", 1)
