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
