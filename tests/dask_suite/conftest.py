"""Dask's own test functions run through one shoal cluster (test_dask_own_tests.py).

Dask's conftest is not loaded here: its fixtures that the chosen tests use are below.
At most ``PARAMS_PER_TEST`` parametrizations of each of Dask's test functions run
(the first ones), so that the module fits a CI budget on two cores.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

PARAMS_PER_TEST = 2
# Dask's marks for what needs the internet, a GPU (cudf), or more than this budget
SKIPPED_MARKS = ("network", "gpu", "slow")


def pytest_configure(config):
    for mark in (
        *SKIPPED_MARKS,
        "flaky",
        "skip_with_pyarrow_strings",
        "xfail_with_pyarrow_strings",
    ):
        config.addinivalue_line("markers", f"{mark}: one of Dask's own marks")


@pytest.fixture(params=["tasks", "p2p"])
def shuffle_method(request):  # dask's own has "disk" too: shoal refuses it (see the module)
    import dask

    with dask.config.set({"dataframe.shuffle.method": request.param}):
        yield request.param


def pytest_collection_modifyitems(config, items):
    seen: dict[tuple[str, str], int] = defaultdict(int)
    keep, drop = [], []
    for item in items:
        if "dask_suite" not in str(item.fspath):
            keep.append(item)
            continue
        if any(item.get_closest_marker(mark) for mark in SKIPPED_MARKS):
            drop.append(item)
            continue
        name = getattr(item, "originalname", item.name)
        seen[(str(item.fspath), name)] += 1
        (keep if seen[(str(item.fspath), name)] <= PARAMS_PER_TEST else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def xfail(request: pytest.FixtureRequest):  # as Dask's conftest has it
    def _(reason: str | None = None) -> None:
        request.node.add_marker(pytest.mark.xfail(reason=reason))

    return _
