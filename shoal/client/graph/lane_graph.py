"""Which small graphs a ``get`` offers to its lane whole (``shoal/lanes``), encoded as
the scheduler would receive them: the same cull, aliases, order and task specs (a
graph the lane declines goes to the scheduler as encoded here, not encoded again).

The client decides what may go (the graph's shape and options); the worker decides
whether it is short enough (``shoal/core/worker/lanes.py``, by the prefixes'
durations), and may stop it part way. A graph goes only when nothing about it needs
the scheduler: no key held by a future, no annotation (retries, restrictions,
resources, a duration), no P2P shuffle, and no large constant (those are kept on the
workers between computes, :mod:`~shoal.client.graph.data`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.client.graph import data as graph_data
from shoal.client.graph.dask_graph import check_graph
from shoal.core.worker.lanes import GRAPH_TASKS
from shoal.protocol import messages as m
from shoal.protocol.messages import Key
from shoal.shuffle import _dask as shuffle_dask

if TYPE_CHECKING:
    from shoal.client.client import Client

GRAPH_BYTES = 256 * 1024  # a graph whose encoding is larger goes through the scheduler
_NEEDS_SCHEDULER = ("retries", "workers", "resources", "allow_other_workers", "duration")


class LaneGraph:
    """A graph encoded for a lane: its tasks (dependencies first), the keys whose values
    come back, and the key each key asked for is answered by (through aliases)."""

    __slots__ = ("tasks", "keys", "targets")

    def __init__(self, tasks: list[m.TaskSpec], keys: list[Key], targets: dict[Key, Key]):
        self.tasks = tasks
        self.keys = keys
        self.targets = targets


def lane_graph(
    client: Client,
    dsk: dict[Key, Any],
    by_type: dict[str, dict[Key, Any]],
    layer_templates: dict[str, Any],
    asked: list[Key],
    options: dict[str, Any] | None,
) -> LaneGraph | None:
    """``dsk`` (materialised) encoded for a lane, or None if it may not go by one."""
    from shoal.client.graph.collections import SMALL_GRAPH_TASKS, _annotation_defaults, cull_to
    from shoal.client.graph.order import submission_order

    if any(by_type.values()):
        return None  # (a layer's annotations: the scheduler honours them)
    defaults = _annotation_defaults(options)
    if any(defaults.get(name) for name in _NEEDS_SCHEDULER):
        return None
    dsk, targets, keys = cull_to(dsk, list(dict.fromkeys(asked)), follow_aliases=True)
    if not 0 < len(dsk) <= GRAPH_TASKS or any(k not in dsk for k in keys):
        return None
    if shuffle_dask.shuffle_marks(dsk) or graph_data.has_large_data(dsk):
        return None
    try:
        index = check_graph(dsk, lambda k: True)
    except ValueError:
        return None  # (a cycle: the scheduler's path raises the error)
    if index.outside:
        return None  # (it depends on futures: their data is on the cluster)
    encoder = client._graph_encoder()
    encoder.start_graph(layer_templates, templates=len(dsk) > SMALL_GRAPH_TASKS)
    ordered = submission_order(dsk, None, index, client._orders)
    tasks = []
    size = 0
    priority = int(defaults.get("priority", 0))  # (for the scheduler, if declined)
    for key in ordered:
        spec = encoder.task_spec(key, dsk[key], priority=priority)
        size += len(spec.payload.data)
        # A future in a task's arguments is a dependency the graph does not have.
        if size > GRAPH_BYTES or any(dep not in dsk for dep in spec.deps):
            return None
        tasks.append(spec)
    return LaneGraph(tasks, keys, targets)
