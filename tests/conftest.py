import os

import pytest
from hypothesis import settings

# "ci" (the default): no per-example deadline, so a slow or loaded machine does not
# turn timing noise into failures. Choose another profile with HYPOTHESIS_PROFILE=...
settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# With pytest-xdist (``-n 2 --dist loadgroup``, as scripts/test.sh runs the suite), tests
# that share a machine-wide resource run one at a time in one group: the queue systems
# (Grid Engine's is machine-wide), the network namespaces, the browser, and the tests
# that move more than 1 GiB.
_ONE_AT_A_TIME = ("/jobqueue/", "/multihost/", "/browser/", "test_walltime_fit.py")


# The tests of a module that share a module- (or class-) scoped fixture, most often a
# cluster, run in one group too, on one process: spread over both, each process would
# start its own copy of the fixture (a cluster start of several seconds per module).
_SHARED_SCOPES = ("module", "class", "package")


def _uses_a_shared_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values())


# First: xdist's own hook (on each worker) reads the xdist_group marks into the node ids
# the scheduler groups by; marks added after it are ignored.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath)
        if any(part in path for part in _ONE_AT_A_TIME) or item.get_closest_marker("large"):
            item.add_marker(pytest.mark.xdist_group("one-at-a-time"))
        elif _uses_a_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(f"module:{item.nodeid.split('::')[0]}"))
