"""A participant SIGKILLed in the middle of a P2P shuffle: the shuffle restarts on the
remaining workers and the result still equals pandas (a real signal, real processes)."""

from __future__ import annotations

import os
import signal
import time

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(180)


def slowly(df: pd.DataFrame) -> pd.DataFrame:
    """An input partition that takes a while: the shuffle is still going on when the
    test kills a worker."""
    time.sleep(0.15)
    return df


def p2p_events(client: Client) -> list[dict]:
    return [data for _, data in client.get_events("p2p")]


def test_a_participant_killed_mid_shuffle_still_gives_the_right_result():
    n = 6000
    rng = np.random.default_rng(7)
    pdf = pd.DataFrame(
        {
            "id": np.arange(n),
            "k": rng.integers(0, 500, n),
            "s": pd.array([f"v{i % 97}" for i in range(n)], "string"),
        }
    )
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, timeout=60, validate=True) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        ddf = dd.from_pandas(pdf, npartitions=24).map_partitions(slowly)
        future = client.compute(ddf.shuffle("k", npartitions=12))
        deadline = time.monotonic() + 30
        # Wait until the shuffle runs (a start event, or its first transfers done).
        while time.monotonic() < deadline:
            events = p2p_events(client)
            if any(e["action"] == "start" for e in events):
                break
            time.sleep(0.05)
        time.sleep(0.6)  # some transfers done, others to come
        assert not future.done()
        info = client.scheduler_info()["workers"]
        victim, pid = sorted((a, w["pid"]) for a, w in info.items())[-1]
        os.kill(pid, signal.SIGKILL)
        got = future.result(timeout=120)
        pd.testing.assert_frame_equal(
            got.sort_values("id").reset_index(drop=True),
            pdf.sort_values("id").reset_index(drop=True),
        )
        events = p2p_events(client)
        restarts = [e for e in events if e["action"] == "restart"]
        assert restarts and victim in restarts[0]["why"]
        assert victim not in restarts[0]["participants"]
        assert [e for e in events if e["action"] == "finish"]
