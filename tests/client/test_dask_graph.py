"""Dask graphs encoded as shoal tasks, run the way a worker runs them, with no network.

Every graph here is encoded by :class:`GraphEncoder`, sent through the real wire
encoder, then executed task by task as the worker does (function table, payload
decoding with dependency values from a local dict). The results must equal those of
Dask's own reference executor on the same graph.
"""

from __future__ import annotations

import functools
import operator
import pathlib

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
from dask._task_spec import Alias, DataNode, Dict, List, Set, Task, TaskRef, Tuple, execute_graph
from dask.order import order

from shoal.client.graph.dask_graph import GraphEncoder, check_graph, cull, materialize, topological
from shoal.protocol import messages as m
from shoal.protocol.framing import decode_body, encode_body
from shoal.protocol.serialize import FunctionCache, FunctionTable, loads_task_args


class FakeFuture:
    """Stands in for a client's Future: anything in ref_types becomes a reference."""

    def __init__(self, key):
        self.key = key


def encode(dsk, functions=None):
    functions = functions if functions is not None else FunctionTable()
    encoder = GraphEncoder(functions, {FakeFuture: lambda f: f.key})
    priorities = order(dsk)
    specs = [encoder.task_spec(k, dsk[k]) for k in sorted(dsk, key=priorities.__getitem__)]
    # Through the real wire encoder, as the scheduler would receive and forward them.
    (msg,) = decode_body(encode_body([m.SubmitTasks(specs, [], dict(functions.bytes))]))
    return msg.tasks, functions


def run(specs, functions, data=None):
    """Run specs in order as a worker would; every value by key."""
    cache = FunctionCache()
    cache.add(dict(functions.bytes))
    data = dict(data or {})
    for spec in specs:
        for dk in spec.deps:
            assert dk in data, f"{spec.key!r} ran before its dependency {dk!r}"
        func = cache.get(spec.func)
        args, kwargs = loads_task_args(spec.payload, data.__getitem__, cache.get)
        data[spec.key] = func(*args, **kwargs)
    return data


def same_as_dask(dsk, keys, external=None):
    specs, functions = encode(dsk)
    got = run(specs, functions, external)
    want = execute_graph({**{k: DataNode(k, v) for k, v in (external or {}).items()}, **dsk})
    for key in keys:
        np.testing.assert_equal(got[key], want[key])
    return specs, functions


def inc(x):
    return x + 1


def add(a, b=0):
    return a + b


# ------------------------------------------------------------------------ node kinds


def test_legacy_tuple_graph():
    dsk, _ = materialize({"a": 1, "b": (add, "a", 10), "c": (sum, ["a", "b"]), "d": "c"})
    specs, _ = same_as_dask(dsk, ["a", "b", "c", "d"])
    assert {s.key: sorted(s.deps) for s in specs}["c"] == ["a", "b"]


def test_containers_inline_tasks_data_and_aliases():
    dsk = {
        "x": DataNode("x", 3),
        "y": Task("y", inc, TaskRef("x")),
        "lst": Task("lst", sum, List(TaskRef("x"), TaskRef("y"), 100)),
        "tup": Task("tup", tuple, Tuple(TaskRef("y"), 1)),
        "dct": Task("dct", dict, Dict({"p": TaskRef("x"), "q": TaskRef("lst")})),
        "st": Task("st", sorted, Set(TaskRef("x"), TaskRef("y"))),
        "inline": Task("inline", add, Task(None, inc, TaskRef("y")), b=TaskRef("x")),
        "deep": Task("deep", sum, List(Task(None, inc, TaskRef("x")), Task(None, inc, 10))),
        "data_arg": Task("data_arg", add, DataNode(None, 5), b=TaskRef("y")),
        "alias": Alias("alias", "deep"),
        "kw": Task("kw", add, 1, b=TaskRef("y")),
    }
    specs, _ = same_as_dask(dsk, list(dsk))
    deps = {s.key: set(s.deps) for s in specs}
    assert deps["inline"] == {"y", "x"}
    assert deps["deep"] == {"x"}
    assert deps["alias"] == {"deep"}


def test_user_containers_are_passed_as_they_are():
    # A TaskRef inside the user's own list is a value to Dask, not a dependency.
    ref = TaskRef("not-a-dep")
    dsk = {"a": Task("a", len, [ref, ref])}
    specs, functions = encode(dsk)
    assert specs[0].deps == []
    assert run(specs, functions)["a"] == 2


def test_fused_subgraph_with_a_by_value_function():
    marker = "fused-marker-81d3"
    dsk = {
        "x": DataNode("x", 4),
        "a": Task("a", lambda v: v + len(marker), TaskRef("x")),
        "b": Task("b", inc, TaskRef("a")),
    }
    fused = Task.fuse(dsk["a"], dsk["b"])
    graph = {"x": dsk["x"], "b": fused}
    specs, functions = same_as_dask(graph, ["b"])
    (fspec,) = [s for s in specs if s.key == "b"]
    assert fspec.deps == ["x"]
    # The lambda inside the fused task is a table entry, named by the task...
    assert len(fspec.funcs) >= 1 and set(fspec.funcs) <= set(functions.bytes)
    # ... and its body is not in the payload.
    assert marker.encode() not in fspec.payload.data
    assert sum(marker.encode() in b for b in functions.bytes.values()) == 1


def test_partials_share_one_table_entry():
    def f(path):
        return str(path)

    dsk = {
        ("p", i): Task(("p", i), functools.partial(f, pathlib.Path(f"/data/{i}")))
        for i in range(200)
    }
    specs, functions = same_as_dask(dsk, list(dsk))
    assert len({s.func for s in specs}) == 1
    assert len(functions.bytes) == 1


def test_one_function_in_many_fused_tasks_is_serialised_once():
    marker = "shared-inner-func-5e1a"

    def scale(v):
        return v * len(marker)

    tasks = {}
    for i in range(300):
        a = Task(("a", i), scale, i)
        b = Task(("b", i), inc, TaskRef(("a", i)))
        tasks[("b", i)] = Task.fuse(a, b)
    specs, functions = same_as_dask(tasks, list(tasks))
    assert sum(marker.encode() in b for b in functions.bytes.values()) == 1
    assert not any(marker.encode() in s.payload.data for s in specs)


def test_futures_are_dependencies():
    dsk = {"a": Task("a", add, FakeFuture("held"), b=TaskRef("x")), "x": DataNode("x", 1)}
    specs, functions = encode(dsk)
    assert {s.key: set(s.deps) for s in specs}["a"] == {"held", "x"}
    assert run(specs, functions, {"held": 41})["a"] == 42


def test_operator_and_builtin_functions():
    dsk, _ = materialize({"a": (operator.mul, 6, 7), "b": (max, "a", 3), "c": (str, "b")})
    same_as_dask(dsk, ["c"])


# ------------------------------------------------------------------------ real collections


@pytest.mark.parametrize(
    "make",
    [
        lambda: da.arange(100, chunks=10).reshape(10, 10).rechunk(5) @ da.ones((10, 3), chunks=5),
        lambda: da.random.default_rng(0).random((40, 40), chunks=10).mean(axis=0),
        lambda: (lambda x: (x + x.T)[::3, 1:7].std())(da.ones((30, 30), chunks=7)),
        lambda: db.from_sequence(range(50), npartitions=5).map(inc).filter(lambda v: v % 3).sum(),
        lambda: db.from_sequence(range(50), npartitions=5).foldby(lambda v: v % 4, operator.add),
        lambda: dask.delayed(sum)([dask.delayed(inc)(i) for i in range(10)]),
    ],
    ids=["matmul-rechunk", "random-mean", "slice-std", "bag-map-filter", "bag-foldby", "delayed"],
)
def test_collection_graphs_match_dask(make):
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.core import flatten

    coll = make()
    expr = FinalizeCompute(collections_to_expr([coll])).optimize()
    keys = list(flatten(expr.__dask_keys__()))
    dsk, _ = materialize(expr)
    dsk = cull(dsk, keys)
    specs, functions = encode(dsk)
    got = run(specs, functions)[keys[0]]
    (want,) = dask.compute(coll, scheduler="sync")
    np.testing.assert_equal(got, want)
    # The scheduler only ever sees bytes; the functions are table entries, few of them.
    assert len(functions.bytes) < 40


# ------------------------------------------------------------------------ refused graphs


def test_cycle_is_refused_naming_the_keys():
    dsk, _ = materialize({"a": (inc, "b"), "b": (inc, "c"), "c": (inc, "a"), "d": (inc, 1)})
    with pytest.raises(ValueError, match="cycle") as info:
        check_graph(dsk, lambda k: False)
    assert all(repr(k) in str(info.value) for k in ("a", "b", "c"))
    assert "'d'" not in str(info.value)


def test_missing_dependency_is_refused_naming_it():
    dsk = {"a": Task("a", inc, TaskRef("nowhere-7c1"))}
    with pytest.raises(ValueError, match="nowhere-7c1"):
        check_graph(dsk, lambda k: False)
    check_graph(dsk, lambda k: k == "nowhere-7c1")  # held by the client: fine


def test_cull_keeps_what_the_keys_need():
    dsk, _ = materialize({"a": 1, "b": (inc, "a"), "c": (inc, "b"), "unused": (inc, "a")})
    assert set(cull(dsk, ["c"])) == {"a", "b", "c"}


def test_submission_order_puts_dependencies_first():
    dsk = {
        "a": Task("a", inc, TaskRef("b")),
        "b": Task("b", inc, TaskRef("c")),
        "c": DataNode("c", 1),
        "d": DataNode("d", 2),
    }
    # Priorities that would send a task before its dependencies are corrected...
    assert topological(dsk, {"a": 0, "d": 1, "b": 2, "c": 3}) == ["c", "b", "a", "d"]
    # ... and a valid order is kept as it is.
    assert topological(dsk, {"d": 0, "c": 1, "b": 2, "a": 3}) == ["d", "c", "b", "a"]


def test_alias_targets_follow_chains_within_the_graph():
    from shoal.client.graph.dask_graph import alias_targets

    dsk = {
        "c": Task("c", operator.add, 1, 2),
        "b": Alias("b", "c"),
        "a": Alias("a", "b"),
        "outside": Alias("outside", "held-elsewhere"),  # its target is not in the graph
        "loop1": Alias("loop1", "loop2"),
        "loop2": Alias("loop2", "loop1"),
    }
    assert alias_targets(dsk, ["a", "b", "c", "outside"]) == {"a": "c", "b": "c"}
    # A cycle of aliases (refused later by check_graph) does not hang the walk.
    assert alias_targets(dsk, ["loop1"]) == {"loop1": "loop2"}


def test_skip_aliases_points_dependents_at_the_aliased_key():
    from shoal.client.graph.dask_graph import skip_aliases

    dsk = {
        "x": Task("x", operator.add, 1, 2),
        "a": Alias("a", "x"),
        "b": Alias("b", "a"),  # a chain
        "y": Task("y", operator.mul, TaskRef("b"), List(TaskRef("a"), 3)),
        "out": Alias("out", "y"),  # kept: a key asked for
    }
    got = skip_aliases(dsk, ["out"])
    assert set(got) == {"x", "y", "out"}
    assert got["y"].dependencies == {"x"}
    assert execute_graph(got)["out"] == 3 * [3, 3]
    assert execute_graph(got)["out"] == execute_graph(dsk)["out"]
    # Nothing to skip, or a cycle of aliases (refused later, by check_graph): as it was.
    plain = {"x": dsk["x"]}
    assert skip_aliases(plain, []) is plain
    loop = {"p": Alias("p", "q"), "q": Alias("q", "p")}
    assert skip_aliases(loop, []) is loop
