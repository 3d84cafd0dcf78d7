"""A graph of at most ``SMALL_GRAPH_TASKS`` tasks is encoded task by task: it has no
layers for a template to pay off in, so no template cache is made or consulted per
small compute; larger graphs keep them."""

from __future__ import annotations

from typing import Any

import numpy as np
from specs_client import SpecsClient

from shoal.client.graph import collections
from shoal.protocol.serialize import TEMPLATE

DTYPE = np.dtype("float64")  # an object every task refers to: a shape, not a plain value


def same_shape_graph(n: int) -> dict:
    """``n`` tasks of one shape (a function, a shared dtype and an int), summed by one
    more."""
    graph: dict[Any, Any] = {f"x-{i}": (np.full, 3, i, DTYPE) for i in range(n)}
    graph["total"] = (sum, [f"x-{i}" for i in range(n)])
    return graph


def submit(client: SpecsClient, graph: dict) -> dict:
    collections.submit_graph(client, graph, ["total"], collections._options({}))  # type: ignore[arg-type]
    return {s.key: s for s in client.specs}


def test_a_small_graph_is_encoded_without_templates():
    client = SpecsClient()
    graph = same_shape_graph(collections.SMALL_GRAPH_TASKS - 1)
    assert len(graph) == collections.SMALL_GRAPH_TASKS
    specs = submit(client, graph)
    assert set(specs) == set(graph)
    assert all(s.payload.kind != TEMPLATE for s in specs.values())


def test_a_larger_graph_of_one_shape_still_uses_a_template():
    client = SpecsClient()
    graph = same_shape_graph(collections.SMALL_GRAPH_TASKS + 2)
    specs = submit(client, graph)
    kinds = [specs[f"x-{i}"].payload.kind for i in range(collections.SMALL_GRAPH_TASKS + 2)]
    assert kinds.count(TEMPLATE) >= collections.SMALL_GRAPH_TASKS  # all but the first


def test_a_small_graph_after_a_large_one_does_not_reuse_its_templates():
    client = SpecsClient()
    submit(client, same_shape_graph(collections.SMALL_GRAPH_TASKS + 2))
    client.specs.clear()
    specs = submit(client, same_shape_graph(2))
    assert all(s.payload.kind != TEMPLATE for s in specs.values())
