"""Configuration: ``shoal.*`` keys in dask.config (YAML defaults, ``SHOAL_*``
variables), CLI defaults from them, and the ``distributed.*`` keys honoured or warned
about once."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import dask.config
import pytest
from subprocess_env import child_env

from shoal import Client, LocalCluster, config


def test_defaults_are_in_dask_config() -> None:
    assert dask.config.get("shoal.scheduler.allowed-failures") == 3
    assert config.get("scheduler.worker-ttl") == 300
    assert config.get("worker.memory.target") == 0.6
    with pytest.raises(KeyError, match="no shoal config key 'scheduler.nope'"):
        config.get("scheduler.nope")


def test_shoal_variables_map_as_dask_variables_do() -> None:
    env = {
        "SHOAL_WORKER__NTHREADS": "4",
        "SHOAL_WORKER__MEMORY__TARGET": "False",
        "SHOAL_SCHEDULER__WORKER_TTL": "2 minutes",
        # variables with a meaning of their own stay out of the config
        "SHOAL_TOKEN": "secret",
        "SHOAL_TLS_CA_FILE": "/ca.pem",
        "SHOAL_WORKER_PRELOAD": "mod",
        "DASK_OTHER": "1",
    }
    assert config.collect_env(env) == {
        "shoal": {
            "worker": {"nthreads": 4, "memory": {"target": False}},
            "scheduler": {"worker-ttl": "2 minutes"},
        }
    }


def test_precedence_shoal_key_then_distributed_key_then_default() -> None:
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        assert config.get("scheduler.allowed-failures") == 1
        with dask.config.set({"shoal.scheduler.allowed-failures": 5}):
            assert config.get("scheduler.allowed-failures") == 5  # shoal's own key wins
    with dask.config.set({"distributed.scheduler.worker-ttl": "90s"}):
        assert config.get("scheduler.worker-ttl") == 90
    with dask.config.set({"distributed.worker.memory.spill": False}):
        assert config.get("worker.memory.spill") is None  # off, as in Dask
    with dask.config.set({"distributed.comm.timeouts.connect": "7s"}):
        assert config.get("comm.timeouts.connect") == 7


def test_unhonoured_distributed_keys_are_warned_about_once() -> None:
    key = "distributed.scheduler.work-stealing-interval"
    with dask.config.set({key: "123ms"}):
        with pytest.warns(UserWarning, match="work-stealing-interval.*no equivalent"):
            config.get("scheduler.port")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config.get("scheduler.port")  # once only


def test_distributed_keys_reach_an_in_process_cluster_and_client() -> None:
    with (
        dask.config.set(
            {
                "distributed.scheduler.allowed-failures": 1,
                "distributed.scheduler.worker-ttl": "45s",
                "distributed.worker.memory.target": 0.5,
                "distributed.comm.timeouts.connect": "11s",
            }
        ),
        LocalCluster(n_workers=1, processes=False, timeout=30) as cluster,
        Client(cluster) as c,
    ):
        state = cluster.scheduler.state
        assert (state.allowed_failures, state.worker_ttl) == (1, 45)
        assert c.timeout == 11
        [fractions] = c.run(lambda dask_worker: tuple(dask_worker.memory_fractions)).values()
        assert fractions[0] == 0.5


def allowed_failures(dask_scheduler: object) -> tuple[int, float]:
    state = dask_scheduler.state  # type: ignore[attr-defined]
    return state.allowed_failures, state.worker_ttl


def test_shoal_variables_reach_worker_and_scheduler_processes() -> None:
    env = {
        **child_env(),
        "SHOAL_SCHEDULER__ALLOWED_FAILURES": "6",
        "SHOAL_WORKER__MEMORY__PAUSE": "0.75",
    }
    script = (
        "from shoal import Client\n"
        "c = Client(n_workers=1, threads_per_worker=1)\n"
        "print(c.run_on_scheduler(allowed_failures))\n"
        "print(list(c.run(lambda dask_worker: dask_worker.memory_fractions.pause).values()))\n"
        "c.close()\n"
    )
    prelude = "from test_config import allowed_failures\n"
    out = subprocess.run(
        [sys.executable, "-c", prelude + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=os.path.dirname(__file__),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["(6, 300.0)", "[0.75]"]


def test_cli_help_shows_defaults_from_the_config() -> None:
    env = {**child_env(), "SHOAL_SCHEDULER__ALLOWED_FAILURES": "9", "SHOAL_WORKER__NTHREADS": "3"}
    sched = subprocess.run(
        [sys.executable, "-m", "shoal", "scheduler", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "9, config shoal.scheduler.allowed-failures" in " ".join(sched.split())
    work = subprocess.run(
        [sys.executable, "-m", "shoal", "worker", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "3, config shoal.worker.nthreads" in " ".join(work.split())


def test_distributed_keys_are_read_afresh_after_every_change() -> None:
    # (user_distributed_keys caches its scan of the distributed tree while it is unchanged)
    key = "distributed.scheduler.allowed-failures"
    default = config.get("scheduler.allowed-failures")
    for value in (7, 8, 7):
        with dask.config.set({key: value}):
            assert config.get("scheduler.allowed-failures") == value
            assert config.get("scheduler.allowed-failures") == value
        assert config.get("scheduler.allowed-failures") == default
    tree = dask.config.config.setdefault("distributed", {}).setdefault("scheduler", {})
    before = tree.get("allowed-failures", missing := object())
    tree["allowed-failures"] = 9  # changed in place, as dask.config.set does
    try:
        assert config.get("scheduler.allowed-failures") == 9
    finally:
        if before is missing:
            del tree["allowed-failures"]
        else:
            tree["allowed-failures"] = before
    assert config.get("scheduler.allowed-failures") == default
