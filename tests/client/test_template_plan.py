"""Template plans (shoal.protocol.template_plan): a worker decodes a task-argument
template once and fills in each task's slots. Every task must get exactly what the
per-task unpickle of the template gives, with no mutable object shared between tasks;
a template a plan cannot follow is unpickled per task as before."""

from __future__ import annotations

import functools
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sizes import sized
from test_templates import Value, _resolved, array_graph, assert_same, collections_to_test, encode

from shoal.client.graph.dask_graph import Dep
from shoal.client.graph.templates import LayerTemplates
from shoal.protocol import plain_codec
from shoal.protocol.serialize import (
    TEMPLATE,
    FunctionCache,
    FunctionTable,
    Slot,
    loads_task_args,
    template_body,
    template_payload,
)
from shoal.protocol.template_plan import TemplatePlan


class PlanningLoader:
    """A worker's function resolver: templates as plans, where they can be."""

    def __init__(self, functions: dict[str, bytes]):
        self.cache = FunctionCache()
        self.cache.add(functions)
        self.loaded: dict[str, object] = {}
        self.planned: set[str] = set()

    def __call__(self, fid: str):
        obj = self.loaded.get(fid)
        if obj is None:
            obj = self.cache.get(fid)
            if type(obj) is bytes:
                plan = TemplatePlan.compile(obj, self)
                if plan is not None:
                    self.planned.add(fid)
                    obj = plan
            self.loaded[fid] = obj
        return obj


@pytest.mark.parametrize("name", list(collections_to_test()))
def test_planned_templates_decode_to_what_the_template_unpickles_to(name):
    dsk = array_graph(*collections_to_test()[name])
    specs, functions, _ = encode(dsk, templates=True)
    plain = FunctionCache()
    plain.add(functions)
    planning = PlanningLoader(functions)
    templated = [s for s in specs if s.payload.kind == TEMPLATE]
    for spec in specs:
        want = loads_task_args(spec.payload, Value, plain.get)
        got = loads_task_args(spec.payload, Value, planning)
        assert_same(got, want)
    template_ids = {plain_codec.loads(s.payload.data, Value)[0] for s in templated}
    if name in ("graph_scale", "elementwise-2d", "anom", "reduction-axis"):
        # Dask's fused layers: every template is decoded once, not per task
        assert template_ids and planning.planned == template_ids


def test_graph_computed_through_plans_matches_dask():
    from dask._task_spec import execute_graph

    from shoal.server.fused_chains import with_fast_chains

    dsk = array_graph(*collections_to_test()["graph_scale"])
    specs, functions, _ = encode(dsk, templates=True)
    planning = PlanningLoader(functions)
    data: dict = {}
    for spec in specs:
        args, kwargs = loads_task_args(spec.payload, data.__getitem__, planning)
        data[spec.key] = with_fast_chains(planning(spec.func))(*args, **kwargs)
    want = execute_graph(dict(dsk))
    for key in dsk:
        np.testing.assert_equal(data[key], want[key])


def _template(body) -> tuple[FunctionTable, str]:
    from dask._task_spec import Task

    from shoal.client.graph.dask_graph import _reduce_task

    functions = FunctionTable()
    # Dask's tasks as the graph encoder sends them
    encoded = template_body(body, {Dep: lambda d: d.key}, functions, {Task: _reduce_task})
    return functions, functions.register_template(encoded.payload.data)


def _fill(functions: FunctionTable, template_id: str, slots: list, loader=None):
    from shoal.protocol.messages import Payload

    payload = Payload(TEMPLATE, template_payload(template_id, plain_codec.dumps(slots, {}, [])))
    return loads_task_args(payload, Value, loader or PlanningLoader(dict(functions.bytes)))


def test_mutable_objects_are_new_in_every_task():
    array = np.arange(3)
    body = (([1, 2], {"a": [3]}, {4, 5}, array, Slot(0)), {"kw": [6]})
    functions, tid = _template(body)
    loader = PlanningLoader(dict(functions.bytes))
    first = _fill(functions, tid, ["x"], loader)
    assert tid in loader.planned
    (lst, dct, st_, arr, slot), kwargs = first[0], first[1]
    lst.append(99)
    dct["a"].append(99)
    st_.add(99)
    arr[0] = 99
    kwargs["kw"].append(99)
    (lst2, dct2, st2, arr2, slot2), kwargs2 = _fill(functions, tid, ["y"], loader)
    # what one task did to its arguments is not seen by the next
    assert (lst2, dct2, st2, kwargs2) == ([1, 2], {"a": [3]}, {4, 5}, {"kw": [6]})
    np.testing.assert_array_equal(arr2, [0, 1, 2])
    assert (slot, slot2) == ("x", "y")


def test_immutable_objects_and_dask_nodes_are_decoded_once():
    from dask._task_spec import Task, TaskRef

    node = Task("inner", np.add, TaskRef("a"), 1)
    body = ((node, np.dtype("f4"), (1, "s"), functools.partial, Slot(0)), {})
    functions, tid = _template(body)
    loader = PlanningLoader(dict(functions.bytes))
    (node1, dtype1, tup1, cls1, _), _ = _fill(functions, tid, [1], loader)
    (node2, dtype2, tup2, cls2, _), _ = _fill(functions, tid, [2], loader)
    assert tid in loader.planned
    assert node1 is node2 and dtype1 is dtype2 and tup1 is tup2 and cls1 is cls2
    assert node1.key == "inner" and node1.args[0].key == "a" and dtype1 == np.dtype("f4")


def test_an_object_in_two_places_is_unpickled_per_task():
    shared = [1, 2]
    functions, tid = _template(((shared, shared, Slot(0)), {}))
    loader = PlanningLoader(dict(functions.bytes))
    (a, b, slot), _ = _fill(functions, tid, [7], loader)
    assert tid not in loader.planned
    assert a is b and slot == 7  # as its pickle gives it


def test_a_slot_inside_a_call_is_made_per_task():
    from dask._task_spec import Task

    body = ((Task("inner", operator.add, Slot(0), 1), Slot(1)), {})
    functions, tid = _template(body)
    loader = PlanningLoader(dict(functions.bytes))
    (t1, s1), _ = _fill(functions, tid, [2, "a"], loader)
    (t2, s2), _ = _fill(functions, tid, [16, "b"], loader)
    assert tid in loader.planned
    assert (t1(), t2(), s1, s2) == (3, 17, "a", "b")


def test_an_object_built_by_setting_its_state_is_unpickled_per_task():
    # a partial is made, then its state set (pickle's BUILD): not a plain call
    body = ((functools.partial(int, base=Slot(0)), Slot(1)), {})
    functions, tid = _template(body)
    loader = PlanningLoader(dict(functions.bytes))
    (p1, s1), _ = _fill(functions, tid, [2, "a"], loader)
    (p2, s2), _ = _fill(functions, tid, [16, "b"], loader)
    assert tid not in loader.planned
    assert (p1("11"), p2("11"), s1, s2) == (3, 17, "a", "b")


def test_a_key_reference_in_the_template_is_resolved_per_task():
    functions, tid = _template(((Dep("k"), Slot(0)), {}))
    loader = PlanningLoader(dict(functions.bytes))
    from shoal.protocol.messages import Payload

    payload = Payload(TEMPLATE, template_payload(tid, plain_codec.dumps([1], {}, [])))
    values = {"k": "first"}
    assert loads_task_args(payload, values.__getitem__, loader)[0] == ("first", 1)
    values["k"] = "second"
    assert loads_task_args(payload, values.__getitem__, loader)[0] == ("second", 1)
    assert tid in loader.planned


@settings(max_examples=sized(ci=60, full=200), deadline=None)
@given(st.data())
def test_plans_give_what_the_pickle_path_gives_for_any_arguments(data):
    from test_templates import task_args

    tasks = data.draw(st.lists(task_args(), min_size=1, max_size=4))
    functions = FunctionTable()
    cache = LayerTemplates(functions, {Dep: lambda d: d.key})
    loader = None
    for args, kwargs in tasks * 3:  # a miss, then hits (decoded through one plan)
        encoded = cache.encode("fid", args, kwargs)
        if encoded is None:
            continue
        if loader is None or any(f not in loader.cache for f in functions.bytes):
            loader = PlanningLoader(dict(functions.bytes))
        plain = FunctionCache()
        plain.add(dict(functions.bytes))
        got = loads_task_args(encoded.payload, Value, loader)
        assert_same(got, loads_task_args(encoded.payload, Value, plain.get))
        assert_same(got, _resolved((args, kwargs)))
