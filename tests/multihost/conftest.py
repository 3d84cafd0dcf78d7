"""A shoal cluster across three network-namespace hosts (netns.py): the scheduler on
host A (10.200.14.1), a worker on B (its default address: the route to the scheduler)
and one on C (``--listen-address`` on every interface, ``--contact-address`` naming
C), the client programs (scenarios.py) on A. Skipped where the machine cannot build
namespaces; under ``CI=true`` that is a failure instead."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from multihost_cluster import Cluster, child_env
from netns import Network, unavailable


def _require_namespaces() -> None:
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the multi-host tests must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    _require_namespaces()
    with Network() as net:
        yield net


@pytest.fixture(scope="module")
def logs() -> Iterator[Path]:
    # not under /tmp: each host's /tmp is its own, and the processes write here
    path = Path(tempfile.mkdtemp(prefix="shoal-multihost-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(network: Network, logs: Path) -> Iterator[Cluster]:
    c = Cluster(network, logs, child_env())
    c.start_scheduler()
    c.ensure_workers()
    yield c
    for host in network.hosts.values():
        host.kill_all()


@pytest.fixture
def two_workers(cluster: Cluster) -> Cluster:
    cluster.ensure_workers()
    return cluster
