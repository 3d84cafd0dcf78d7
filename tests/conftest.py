import os

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


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        path = str(item.fspath)
        if any(part in path for part in _ONE_AT_A_TIME) or item.get_closest_marker("large"):
            item.add_marker(pytest.mark.xdist_group("one-at-a-time"))
