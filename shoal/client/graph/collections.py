"""Dask collections on a shoal client: ``get`` (Dask's scheduler protocol), ``compute``,
``persist``, and being Dask's default scheduler.

Graphs are materialised and encoded here, on the client (see :mod:`dask_graph`): the
scheduler receives task specs, never a pickled expression it would have to open.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from shoal.client.futures import Future
from shoal.client.graph import data as graph_data
from shoal.client.graph.blockwise_expand import materialize  # dask_graph's, Blockwise layers faster
from shoal.client.graph.dask_graph import (
    alias_targets,
    annotations_for,
    check_graph,
    cull,
    skip_aliases,
)
from shoal.client.graph.gc_pause import gc_paused
from shoal.client.graph.lane_graph import LaneGraph, lane_graph
from shoal.client.graph.order import TRIVIAL_TASKS, order_bound, submission_order
from shoal.client.restrictions import duration_hint, task_restrictions
from shoal.core.worker.lanes import GRAPH_TASKS
from shoal.lanes._client import NOT_RUN, graph_prefixes
from shoal.protocol import messages as m
from shoal.protocol.messages import Key
from shoal.shuffle import _dask as shuffle_dask

PART_SIZE = 10_000  # tasks per SubmitTasks message of a large graph
LOST_DATA_ATTEMPTS = 3  # tries of a ``get`` whose graph data is lost with workers
SMALL_GRAPH_TASKS = 4  # a graph of at most this many tasks is encoded without templates

if TYPE_CHECKING:
    from shoal.client.client import Client


@gc_paused()  # the whole submission: see gc_pause
def submit_graph(
    client: Client,
    graph: Any,
    keys: Iterable[Key],
    options: dict[str, Any] | None = None,
    placed: dict[Key, Future] | None = None,
    follow_aliases: bool = False,
    materialized: bool = False,
) -> dict[Key, Future]:
    """Submit the part of ``graph`` that ``keys`` need; futures for ``keys``.

    ``options`` are annotations for every task (``priority``, ``retries``, ``workers``,
    ``resources``, ``allow_other_workers``), under those of the graph's own layers.

    With ``placed`` (a dict, filled with their futures), large data nodes go to the
    workers apart from the graph (:mod:`~shoal.client.graph.data`). Only ``get`` asks for it: it
    gathers the results at once and sends the graph again if that data is lost. The
    futures of ``compute`` and ``persist`` may outlive their data's worker, and must stay
    recomputable from the graph alone.

    With ``materialized``, ``graph`` is what :func:`_materialize` made of it.

    With ``follow_aliases`` (``get``: only values go back), a key that merely names
    another (an ``Alias``) is not a task: its future is the named key's, which saves a
    scheduler round trip per compute."""
    asked = list(dict.fromkeys(keys))
    dsk, by_type, layer_templates = graph if materialized else _materialize(graph)
    if _single_task(dsk, asked):
        return _submit_single_task(client, dsk, by_type, options)
    dsk, targets, keys = cull_to(dsk, asked, follow_aliases)
    marks = shuffle_dask.shuffle_marks(dsk)  # the scheduler coordinates these tasks
    held = client._states
    unknown = [k for k in keys if k not in dsk and k not in held]
    if unknown:
        raise ValueError(f"keys neither in the graph nor held by this client: {unknown[:20]!r}")
    index = check_graph(dsk, held.__contains__)  # the graph on positions, for its order too
    defaults = _annotation_defaults(options)
    encoder = client._graph_encoder()
    # A layer's template pays off from its second task on: a graph this small has no
    # layers to share one, and making and consulting the cache per compute would cost
    # more than its tasks' encoding.
    encoder.start_graph(layer_templates, templates=len(dsk) > SMALL_GRAPH_TASKS)
    # (a graph too small to order needs no bound: no config lookup per small compute)
    bound = order_bound() if len(dsk) > TRIVIAL_TASKS else None
    ordered = submission_order(dsk, bound, index, client._orders)
    del index  # (its lists of positions go before the encoding)
    # Large data nodes are placed on the workers (or found there) before the graph is
    # sent: the graph then depends on their keys like on held futures, held until sent.
    data: dict[Key, Future] = {}
    if placed is not None:
        # The keys asked for stay tasks (a data-only graph): futures of them held by the
        # caller stay recomputable.
        wanted = set(keys)

        def inline(key: Key) -> bool:  # also data tied to workers or resources
            annots = annotations_for(key, by_type, defaults)
            return key in wanted or "workers" in annots or "resources" in annots

        data = graph_data.place(client, dsk, inline)
        placed.update(data)
    if data:
        ordered = [k for k in ordered if k not in data]

    task_options = _TaskOptions()

    def parts() -> Iterator[list[m.TaskSpec]]:
        # Encoded part by part while earlier parts are on their way: the scheduler never
        # holds the whole graph twice (as one decoded message and as tasks).
        # Without per-layer or per-key annotations, every task has the same options:
        # worked out once, not once per task.
        same = not any(by_type.values()) and not any(map(callable, defaults.values()))
        options = None
        if same:
            options = task_options(annotations_for(None, by_type, defaults))  # type: ignore[arg-type]
        task_spec = encoder.task_spec
        for start in range(0, max(len(ordered), 1), PART_SIZE):
            part = []
            for key in ordered[start : start + PART_SIZE]:
                if options is None:
                    priority, retries, restricted, hint = task_options(
                        annotations_for(key, by_type, defaults)
                    )
                else:
                    priority, retries, restricted, hint = options
                spec = task_spec(
                    key, dsk[key], priority=priority, retries=retries, restrictions=restricted
                )
                if marks:
                    spec.shuffle = marks.get(key)
                if hint is not None:
                    spec.duration = hint
                part.append(spec)
            yield part

    futures = dict(zip(keys, client._submit_parts(parts(), keys)))
    del data  # released after the graph that depends on them (the outbox keeps order)
    return {k: futures[targets.get(k, k)] for k in asked}


def cull_to(
    dsk: dict[Key, Any], asked: list[Key], follow_aliases: bool
) -> tuple[dict[Key, Any], dict[Key, Key], list[Key]]:
    """The part of ``dsk`` that ``asked`` (distinct keys) needs, without the aliases
    nobody asked for; with ``follow_aliases``, a key asked for that is an alias is
    answered by the key it names (``targets``). Returns the graph, the targets, and the
    keys to submit (``asked`` through the targets)."""
    dsk = cull(dsk, asked)
    targets = alias_targets(dsk, asked) if follow_aliases else {}
    keys = list(dict.fromkeys(targets.get(k, k) for k in asked))
    if targets:
        dsk = cull(dsk, keys)
    return skip_aliases(dsk, keys), targets, keys


def _materialize(graph: Any) -> tuple[dict[Key, Any], dict[str, dict[Key, Any]], dict[str, Any]]:
    """The graph's tasks by key, its annotations by type, and its expanded layers'
    templates (for the encoder)."""
    shuffle_dask.install()
    layer_templates: dict[str, Any] = {}
    with shuffle_dask.computing():  # a shuffle lowered now is shoal's P2P
        dsk, by_type = materialize(graph, layer_templates)
    return dsk, by_type, layer_templates


def _annotation_defaults(options: dict[str, Any] | None) -> dict[str, Any]:
    """The annotations every task of a submission has unless its layer says otherwise:
    ``dask.annotate``'s, then ``compute``'s options that are set."""
    import dask

    return {**dask.get_annotations(), **{k: v for k, v in (options or {}).items() if v}}


class _TaskOptions:
    """A task's ``(priority, retries, restrictions, duration)`` from its annotations;
    restrictions checked once per distinct set of options (a layer's annotations are
    shared values) and durations parsed once per distinct value, not once per task."""

    def __init__(self) -> None:
        self._placements: dict[tuple, tuple[Any, m.TaskRestrictions | None]] = {}
        self._durations: dict[Any, float | None] = {}

    def __call__(
        self, annots: dict[str, Any]
    ) -> tuple[int, int, m.TaskRestrictions | None, float | None]:
        priority, retries = int(annots.get("priority", 0)), int(annots.get("retries", 0))
        return priority, retries, self._restrictions(annots), self._duration(annots)

    def _restrictions(self, annots: dict[str, Any]) -> m.TaskRestrictions | None:
        workers, resources = annots.get("workers"), annots.get("resources")
        loose = annots.get("allow_other_workers", False)
        if workers is None and resources is None and not loose:
            return None
        cache_key = (id(workers), loose, id(resources))
        hit = self._placements.get(cache_key)
        if hit is None:  # (the values are kept too: their ids stay theirs)
            made = task_restrictions(workers, loose, resources)
            hit = self._placements[cache_key] = ((workers, resources), made)
        return hit[1]

    def _duration(self, annots: dict[str, Any]) -> float | None:
        # dask.annotate(duration="4h")
        value = annots.get("duration")
        if value is None:
            return None
        key = value if isinstance(value, str | int | float) else id(value)
        if key not in self._durations:
            self._durations[key] = duration_hint(value, "the duration annotation")
        return self._durations[key]


# ------------------------------------------------------- a graph of one task (small graphs)


def _single_task(dsk: dict[Key, Any], asked: list[Key]) -> bool:
    """Whether the graph is one task, the one key asked for, depending on nothing (e.g.
    ``delayed(f)(1, 2).compute()``). Then submit_graph's general steps are provably
    no-ops: nothing to cull, no alias to follow or skip (the one node is kept, as asked
    for), no dependency to check nor cycle to find, one order, and no graph data to
    place (a key asked for always stays a task)."""
    if len(dsk) != 1 or len(asked) != 1:
        return False
    node = dsk.get(asked[0])
    return node is not None and not node.dependencies


def _submit_single_task(
    client: Client,
    dsk: dict[Key, Any],
    by_type: dict[str, dict[Key, Any]],
    options: dict[str, Any] | None,
) -> dict[Key, Future]:
    """``submit_graph`` for a graph that :func:`_single_task` accepts: the same task spec
    (annotations, shuffle mark, duration) and submission, without the general steps."""
    spec = _single_task_spec(client, dsk, by_type, options)
    (future,) = client._submit_parts(iter(([spec],)), [spec.key])
    return {spec.key: future}


def _single_task_spec(
    client: Client,
    dsk: dict[Key, Any],
    by_type: dict[str, dict[Key, Any]],
    options: dict[str, Any] | None,
) -> m.TaskSpec:
    ((key, node),) = dsk.items()
    defaults = _annotation_defaults(options)
    encoder = client._graph_encoder()
    encoder.start_graph(None, templates=False)  # one task: no layer to share a template
    priority, retries, restricted, hint = _TaskOptions()(annotations_for(key, by_type, defaults))
    spec = encoder.task_spec(key, node, priority=priority, retries=retries, restrictions=restricted)
    marks = shuffle_dask.shuffle_marks(dsk)
    if marks:
        spec.shuffle = marks.get(key)
    if hint is not None:
        spec.duration = hint
    return spec


def _lane_spec(
    client: Client,
    dsk: dict[Key, Any],
    by_type: dict[str, dict[Key, Any]],
    options: dict[str, Any] | None,
) -> m.TaskSpec | None:
    """The task spec of a one-task graph if it may go by lane (shoal/lanes): no
    retries, restrictions, duration or shuffle; else None."""
    spec = _single_task_spec(client, dsk, by_type, options)
    if spec.retries or spec.restrictions is not None or spec.duration is not None:
        return None
    return None if spec.shuffle is not None else spec


def _submit_lane_graph(client: Client, graph: LaneGraph, asked: list[Key]) -> dict[Key, Future]:
    """Futures for ``asked``, from a graph encoded for a lane: ``submit_graph``'s
    submission of it (the same cull, aliases, order, task specs and options, and no
    graph data to place: lane_graph takes no graph that has any)."""
    futures = dict(zip(graph.keys, client._submit_parts(iter([graph.tasks]), graph.keys)))
    return {k: futures[graph.targets.get(k, k)] for k in asked}


def get(client: Client, dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Dask's scheduler protocol: compute ``keys`` (a key or nested lists of keys) of
    ``dsk`` and return their values in the same structure. Options like ``compute``'s
    are taken; other keywords are tolerated, as Dask passes its own through."""
    flat = list(_flatten(keys))
    options = _options(kwargs)
    if client.asynchronous:
        # The futures live until gathered (in the coroutine), then go, releasing the keys.
        return client.gather(_pack(keys, submit_graph(client, dsk, flat, options)))
    graph, materialized = dsk, False
    if client._lanes.enabled and len(flat) <= GRAPH_TASKS:
        graph, materialized = _materialize(dsk), True
        tasks, by_type, layer_templates = graph
        if _single_task(tasks, flat):
            value = client._lanes.run(
                flat[0], lambda: _lane_spec(client, tasks, by_type, options)
            )
            if value is not NOT_RUN:
                return _pack(keys, {flat[0]: value})
        elif len(tasks) <= 2 * GRAPH_TASKS:  # (aliases and unused keys go before it runs)
            values, offered = client._lanes.run_graph(
                graph_prefixes(tasks),
                lambda: lane_graph(client, tasks, by_type, layer_templates, flat, options),
            )
            if values is not NOT_RUN:
                return _pack(keys, values)
            if offered is not None:  # declined: the same tasks to the scheduler, encoded once
                return client.gather(_pack(keys, _submit_lane_graph(client, offered, flat)))
    for attempt in range(1, LOST_DATA_ATTEMPTS + 1):
        placed: dict[Key, Future] = {}
        futures: dict[Key, Future] = {}
        try:
            futures = submit_graph(
                client, graph, flat, options, placed, follow_aliases=True, materialized=materialized
            )
            return client.gather(_pack(keys, futures))
        except Exception:
            # Graph data lost with a worker during the compute: the client still has the
            # values, so the graph goes again (its data sent again) instead of failing.
            if attempt == LOST_DATA_ATTEMPTS or not graph_data.lost(client, placed):
                raise
        del placed  # the futures of the failed attempt go before the next one
        # The error raised sits in its key's state, and its traceback holds frames that
        # hold the futures: the failed attempt's keys would stay held, erred, and be
        # found again by the next attempt. Cut that loop so that they are released.
        sent = {f.key for f in futures.values()} | set(flat)
        del futures
        erred = [st for k in sent if (st := client._states.get(k)) is not None]
        for st in erred:
            if st.exception is not None:
                st.exception.__traceback__ = None
        if erred:
            del st, erred
            gc.collect()
    raise AssertionError("unreachable")


def compute(
    client: Client,
    collections: Any,
    sync: bool = False,
    optimize_graph: bool = True,
    traverse: bool = True,
    **kwargs: Any,
) -> Any:
    """A future for each collection (values with ``sync=True``); other items pass through."""
    import dask
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    singleton = not isinstance(collections, list | tuple | set | frozenset)
    items = [collections] if singleton else list(collections)
    if traverse:
        items = [
            dask.delayed(a) if isinstance(a, list | set | tuple | dict | Iterator) else a
            for a in items
        ]
    variables = [a for a in items if dask.is_dask_collection(a)]
    futures: list[Future] = []
    if variables:
        shuffle_dask.install()
        with shuffle_dask.computing():
            expr = FinalizeCompute(collections_to_expr(variables, optimize_graph)).optimize()
        names = list(_flatten(expr.__dask_keys__()))
        by_key = submit_graph(client, expr, names, _options(kwargs))
        futures = [by_key[k] for k in names]
    it = iter(futures)
    out = [next(it) if dask.is_dask_collection(a) else a for a in items]
    if sync:
        out = client.gather(out)
    return out[0] if singleton else out


def persist(client: Client, collections: Any, optimize_graph: bool = True, **kwargs: Any) -> Any:
    """Start computing collections; return equivalent collections backed by futures,
    at once (the work goes on in the background)."""
    from dask.base import collections_to_expr

    singleton = not isinstance(collections, list | tuple | set | frozenset)
    items = [collections] if singleton else list(collections)
    shuffle_dask.install()
    with shuffle_dask.computing():
        expr = collections_to_expr(items, optimize_graph).optimize()
    keys = expr.__dask_keys__()
    futures = submit_graph(client, expr, _flatten(keys), _options(kwargs))
    out = []
    for coll, ks in zip(items, keys):
        rebuild, args = coll.__dask_postpersist__()
        out.append(rebuild({k: futures[k] for k in _flatten(ks)}, *args))
    return out[0] if singleton else out


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "priority": kwargs.get("priority", 0),
        "retries": kwargs.get("retries"),
        "workers": kwargs.get("workers"),
        "resources": kwargs.get("resources"),
        "allow_other_workers": kwargs.get("allow_other_workers"),
        "duration": kwargs.get("duration"),
    }


def _flatten(keys: Any) -> Iterator[Key]:
    if isinstance(keys, list):
        for k in keys:
            yield from _flatten(k)
    else:
        yield keys


def _pack(keys: Any, futures: dict[Key, Future]) -> Any:
    if isinstance(keys, list):
        return [_pack(k, futures) for k in keys]
    return futures[keys]


# ------------------------------------------------------------------------ default client

_default_lock = threading.Lock()
_defaults: list[Client] = []  # clients that asked to be the default, newest last
_no_scheduler = object()
_before: Any = _no_scheduler  # dask's "scheduler" setting before the first of them


def set_default(client: Client) -> None:
    """Make ``client.get`` Dask's scheduler until ``client`` closes."""
    import dask

    global _before
    with _default_lock:
        if not _defaults:
            _before = dask.config.get("scheduler", _no_scheduler)
        _defaults.append(client)
        dask.config.set(scheduler=client.get)
    shuffle_dask.install()  # dask.dataframe picks shoal's P2P shuffle under shoal


def unset_default(client: Client) -> None:
    """``client`` closed: the newest open default client takes over, or whatever Dask's
    setting was before (only if nobody has changed it since)."""
    import dask

    global _before
    with _default_lock:
        if client not in _defaults:
            return
        ours = dask.config.get("scheduler", None) == _defaults[-1].get
        _defaults.remove(client)
        if not ours:
            return
        if _defaults:
            dask.config.set(scheduler=_defaults[-1].get)
        elif _before is _no_scheduler:
            dask.config.config.pop("scheduler", None)
        else:
            dask.config.set(scheduler=_before)
