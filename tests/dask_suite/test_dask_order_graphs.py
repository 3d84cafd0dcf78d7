"""Dask's ordering tests (``dask/tests/test_order.py``) through shoal's ordering.

Those tests call ``dask.order.order`` directly, so running them "through shoal" means:
every graph they order is recorded (their module is run by pytest with ``order``
wrapped), and shoal's submission order for it (:func:`submission_order` with the
default ``shoal.client.order.max-tasks``) must hold no more results at once than
``dask.order``'s (peak memory as ``dask.order.diagnostics`` computes it)."""

from __future__ import annotations

import pytest

from benchmarks.order_memory import dask_order, dask_test_graphs, peak_memory, shoal_order


@pytest.fixture(scope="module")
def recorded_graphs():
    graphs = dask_test_graphs()
    assert len(graphs) >= 50, "dask's test_order.py ordered fewer graphs than it has tests"
    return graphs


def test_shoal_order_holds_no_more_than_dask_order_on_dask_test_graphs(recorded_graphs):
    worse = []
    checked = 0
    for test, dsk in recorded_graphs:
        try:
            by_dask = peak_memory(dsk, dask_order(dsk))
        except Exception:  # a graph dask's own tests expect to be refused (a cycle)
            continue
        by_shoal = peak_memory(dsk, shoal_order(dsk))
        checked += 1
        if by_shoal > by_dask:
            worse.append((test, len(dsk), by_dask, by_shoal))
    assert checked >= 50
    assert not worse, f"shoal's order holds more than dask.order's: {worse}"


def test_an_order_found_by_structure_is_dask_orders_for_a_graph_with_its_output_renamed(
    recorded_graphs,
):
    """shoal's client remembers dask.order's orders by graph structure, with a graph's
    one output (the key nothing depends on, which Dask names anew for every compute)
    left out of it (shoal/client/graph/order_cache.py). On every one of dask's own
    ordering test graphs with one output: the order found for the graph with that
    output renamed is dask.order's own for it."""
    from dask.order import order
    from order_helpers import renamed

    from benchmarks.order_memory import as_nodes
    from shoal.client.graph.dask_graph import topological
    from shoal.client.graph.order import DEFAULT_MAX_TASKS, TRIVIAL_TASKS, submission_order
    from shoal.client.graph.order_cache import OrderCache

    checked = 0
    for test, legacy in recorded_graphs:
        dsk = as_nodes(legacy)
        used = {d for node in dsk.values() for d in node.dependencies}
        outputs = [k for k in dsk if k not in used]
        if len(dsk) <= TRIVIAL_TASKS or len(outputs) != 1 or not used <= dsk.keys():
            continue
        try:
            dask_order(dsk)
        except Exception:  # a graph dask's own tests expect to be refused (a cycle)
            continue
        (output,) = outputs
        other = renamed(dsk, output, ("renamed-output", test))
        cache = OrderCache()
        submission_order(dsk, DEFAULT_MAX_TASKS, cache=cache)
        found = submission_order(other, DEFAULT_MAX_TASKS, cache=cache)
        assert cache.hits == 1, test
        assert found == topological(other, order(other)), test
        checked += 1
    assert checked >= 20
