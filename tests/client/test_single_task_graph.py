"""A graph of one task asked for, with no dependencies (``delayed(f)(1, 2).compute()``),
skips ``submit_graph``'s general steps, which are no-ops for it: the task spec it
submits must be the very one the general path makes, options and annotations included;
graphs it does not fit keep the general path."""

from __future__ import annotations

from typing import Any

import dask
import pytest
from dask._task_spec import Alias, DataNode, Task, TaskRef
from specs_client import SpecsClient

from shoal.client.graph import collections


def specs(graph: Any, keys: list, general: bool, **options: Any) -> list:
    client = SpecsClient()
    if general:
        single, collections._single_task = collections._single_task, lambda dsk, asked: False
    try:
        out = collections.submit_graph(client, graph, keys, collections._options(options))  # type: ignore[arg-type]
    finally:
        if general:
            collections._single_task = single
    assert list(out) == keys
    return client.specs


def one_task(key: str = "f-1") -> dict:
    return {key: Task(key, max, 1, 2)}


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"priority": 3, "retries": 2, "workers": ["w1"], "duration": "2s"},
        {"resources": {"GPU": 1}},
        {"workers": ["w1"], "allow_other_workers": True},
    ],
)
def test_one_task_gets_the_general_paths_spec(options):
    fast = specs(one_task(), ["f-1"], general=False, **options)
    assert fast == specs(one_task(), ["f-1"], general=True, **options)
    assert len(fast) == 1 and fast[0].key == "f-1"


def test_annotations_reach_one_task_as_on_the_general_path():
    with dask.annotate(priority=7, retries=1, duration="1m"):
        cell = dask.delayed(max)(1, 2)
    graph, keys = cell.__dask_graph__(), [cell.key]
    fast = specs(graph, keys, general=False, priority=3)
    assert fast == specs(graph, keys, general=True, priority=3)
    assert (fast[0].priority, fast[0].retries, fast[0].duration) == (7, 1, 60.0)


def test_a_callable_annotation_is_asked_for_the_one_key():
    asked: list = []

    def priority(key: Any) -> int:
        asked.append(key)
        return 5

    with dask.annotate(priority=priority):
        (spec,) = specs(one_task(), ["f-1"], general=False)
    assert spec.priority == 5 and asked == ["f-1"]


def test_a_delayed_compute_is_one_task_with_its_call():
    cell = dask.delayed(sum)([1, 2, 3])
    expr = cell.__dask_graph__()
    (spec,) = specs(expr, [cell.key], general=False)
    assert spec == specs(expr, [cell.key], general=True)[0]


@pytest.mark.parametrize(
    "graph, keys",
    [
        ({"x": DataNode("x", 1), "y": Task("y", max, TaskRef("x"), 2)}, ["y"]),  # two nodes
        ({"y": Task("y", max, TaskRef("x"), 2)}, ["y"]),  # a dependency nowhere
        ({"y": Task("y", max, TaskRef("y"), 2)}, ["y"]),  # on itself
        ({"y": Alias("y", "z")}, ["y"]),  # an alias of a key nowhere
    ],
)
def test_graphs_that_are_not_one_free_task_keep_the_general_path(graph, keys):
    def outcome(general: bool) -> Any:
        try:
            return specs(dict(graph), keys, general=general)
        except ValueError as e:
            return str(e)

    assert outcome(False) == outcome(True)
    if len(graph) == 1:
        assert isinstance(outcome(False), str)  # refused: nowhere, or a cycle


def test_which_graphs_are_one_free_task():
    assert collections._single_task(one_task(), ["f-1"])
    assert collections._single_task({"d": DataNode("d", 5)}, ["d"])
    assert not collections._single_task(one_task(), ["g"])  # not the key asked for
    assert not collections._single_task(one_task(), ["f-1", "g"])
    assert not collections._single_task({"y": Task("y", max, TaskRef("x"), 2)}, ["y"])
    assert not collections._single_task({**one_task(), **one_task("f-2")}, ["f-1"])
