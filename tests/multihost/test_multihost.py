"""A real multi-host cluster: three network namespaces on a private subnet (netns.py),
each with its own /tmp; the scheduler and the client on A, workers on B and C
(conftest.py). Each test runs a client program (scenarios.py) on host A."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from multihost_cluster import Cluster, child_env
from netns import SUBNET, Network

from shoal import Security

pytestmark = pytest.mark.timeout(180)


def test_quickstart_across_hosts(two_workers: Cluster) -> None:
    got = two_workers.run_client("quickstart")
    by_name = {name: address for address, name in got["workers"].items()}
    # B advertises its side of the route to the scheduler; C what --contact-address says
    assert by_name["b"].startswith(f"tcp://{SUBNET}.2:"), by_name
    assert by_name["c"] == f"tcp://{SUBNET}.3:9786", by_name
    assert got["total"] == 50_005_000
    assert got["both"] == sum(range(200))


def test_large_buffers_travel_by_network_between_hosts(two_workers: Cluster) -> None:
    """Same-host transfers (shoal/comm/same_host.py) stay within a host: the hosts
    here differ in network namespace, so nothing is lent and the data travels by TCP."""
    got = two_workers.run_client("large")
    n = 1_000_000
    assert got["total"] == float(2 * sum(range(n)) + 3 * n)
    assert got["gathered"] == float(sum(range(n)) + n)
    assert list(got["leases"].values()) == [0, 0]


def test_dataframe_shuffle_and_merge_equal_pandas(two_workers: Cluster) -> None:
    got = two_workers.run_client("dataframe", timeout=150)
    assert got["rows"] == got["want"]
    assert got["p2p_events"] > 0  # shoal's P2P shuffle ran (pandas equality checked there)


def test_spilling_goes_to_each_hosts_own_disk(two_workers: Cluster) -> None:
    seen: dict[str, list[Path]] = {}

    def look() -> None:
        for host in (two_workers.b, two_workers.c):
            pid = two_workers.workers[host.name].pid
            seen[host.name] = list(host.tmp(pid).glob("worker-*/spill/*"))
        seen["here"] = list(Path(tempfile.gettempdir()).glob("worker-*/spill/*"))

    got = two_workers.run_client("spill", on_step={"persisted": look})
    assert got["sums"] == [float(i * 1_000_000) for i in range(40)]
    assert seen["b"] and seen["c"], seen  # both spilled, each on its own host's /tmp
    b_dirs = {p.parent.parent.name for p in seen["b"]}
    c_dirs = {p.parent.parent.name for p in seen["c"]}
    assert not b_dirs & c_dirs
    here = {p.parent.parent.name for p in seen["here"]}
    assert not (b_dirs | c_dirs) & here  # not in this machine's /tmp


def test_a_worker_killed_on_host_b(two_workers: Cluster) -> None:
    victim = two_workers.workers["b"]

    def kill() -> None:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)

    got = two_workers.run_client("killed", on_step={"running": kill})
    assert got["total"] == sum(range(1, 41))
    assert list(got["workers"].values()) == ["c"]
    assert victim.returncode == -signal.SIGKILL


def test_retire_workers_moves_data_to_the_other_host(two_workers: Cluster) -> None:
    leaving = two_workers.workers["b"]
    got = two_workers.run_client("retire")
    assert got["outcome"] == {"retired": [got["b"]], "refused": {}}
    assert got["values"] == list(range(1, 21))
    assert list(got["workers"].values()) == ["c"]
    assert leaving.wait(timeout=30) == 0


def test_a_worker_advertising_loopback_is_refused(two_workers: Cluster) -> None:
    # over the veth network, 127.0.0.1 is B itself: the scheduler on A must say no
    proc = two_workers.b.popen(
        [
            sys.executable,
            "-m",
            "shoal",
            "worker",
            two_workers.address,
            "--host",
            "127.0.0.1",
            "--timeout",
            "10",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=two_workers.env,
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "advertises the loopback address tcp://127.0.0.1:" in err, err
    assert f"over {SUBNET}.1" in err, err


def test_tls_with_the_token_across_hosts(network: Network, logs: Path) -> None:
    # credentials outside /tmp, which is each host's own
    directory = tempfile.mkdtemp(prefix="shoal-tls-", dir=logs)
    ips = [h.ip for h in network.hosts.values()]
    security = Security.temporary(
        token="multihost-" + os.urandom(8).hex(), directory=directory, hosts=ips
    )
    env = child_env(
        {
            "SHOAL_TOKEN": security.token or "",
            "SHOAL_TLS_CA_FILE": security.tls_ca_file or "",
            "SHOAL_TLS_CERT": security.tls_cert or "",
            "SHOAL_TLS_KEY": security.tls_key or "",
            "SHOAL_REQUIRE_ENCRYPTION": "1",
        }
    )
    tls = Cluster(network, logs, env, c_port=9787)  # beside the module's cluster
    try:
        tls.start_scheduler()
        assert tls.address.startswith(f"tls://{SUBNET}.1:")
        tls.start_worker(tls.b, "--interface", "eth0")
        tls.start_worker(tls.c)
        got = tls.run_client("quickstart")
        by_name = {name: address for address, name in got["workers"].items()}
        assert by_name["b"].startswith(f"tls://{SUBNET}.2:"), by_name  # --interface eth0
        assert by_name["c"] == f"tls://{SUBNET}.3:9787", by_name
        assert got["total"] == 50_005_000 and got["both"] == sum(range(200))
    finally:
        for proc in list(tls.workers.values()):
            proc.kill()
            proc.wait(timeout=10)
