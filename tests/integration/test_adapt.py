"""``cluster.adapt(...)`` on process LocalClusters: from no worker up under load, back
to the minimum when idle, nothing recomputed; replaced by a second ``adapt``; stopped by
``scale``; stopped with the cluster."""

from __future__ import annotations

import threading
import time

import pytest
from scale_tasks import record, runs
from test_scale import n_workers, wait_until

from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(60)


def test_adapt_from_zero_under_load_and_back_to_the_minimum(tmp_path):
    path = str(tmp_path / "runs")
    with (
        LocalCluster(n_workers=0, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        adaptive = cluster.adapt(
            minimum=1, maximum=3, target_duration="1s", wait_count=2, interval="100ms"
        )
        client.wait_for_workers(1, timeout=20)  # the minimum, with nothing to do
        seen = [n_workers(client)]
        stop = threading.Event()

        gate = tmp_path / "three-workers-seen"

        def watch() -> None:
            while not stop.is_set():
                seen.append(n_workers(client))
                if seen[-1] == 3:
                    gate.touch()
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            # 16 tasks of 0.3 s (4.8 s of work) in 1 s: more than the maximum of 3. Each
            # task then waits until the watcher has seen 3 workers (for up to 20 s), so
            # the load outlasts the start of new worker processes on a loaded machine.
            futures = client.map(
                record,
                range(16),
                path=path,
                seconds=0.3,
                gate=str(gate),
                gate_deadline=time.time() + 20,
            )
            results = [f.result(timeout=40) for f in futures]
        finally:
            stop.set()
            watcher.join()
        assert [r[0] for r in results] == list(range(16))
        assert max(seen) == 3
        # Idle, holding results: back to one worker, which keeps every result.
        wait_until(lambda: n_workers(client) == 1, timeout=15, what="back to the minimum")
        wait_until(lambda: len(cluster.nanny_pids) == 1, what="retired nannies reaped")
        time.sleep(0.5)
        assert n_workers(client) == 1
        assert [f.result(timeout=20)[0] for f in futures] == list(range(16))
        assert sorted(runs(path)) == list(range(16))  # nothing ran twice
        assert adaptive.running
        assert adaptive.last is not None and adaptive.last.action in ("same", "wait")
        # Every decision that did something, with its reason and numbers.
        events = client.get_events("adaptive")
        assert all(isinstance(when, float) and when > 1e9 for when, _ in events)  # wall clock
        decisions = [e for _, e in events]
        ups = [e for e in decisions if e["action"] == "up"]
        downs = [e for e in decisions if e["action"] == "down"]
        assert ups and downs
        assert sum(e["start"] for e in ups) >= 3  # the minimum, then two more under load
        assert any("tasks" in e["reason"] and e["tasks"] > 0 for e in ups)
        assert sum(len(e["closing"]) + len(e["stop"]) for e in downs) == 2
        assert all("lower 2 times in a row" in e["reason"] for e in downs)
        assert all(e["maximum"] == 3 and e["minimum"] == 1 for e in decisions)
    assert not adaptive.running  # stopped with the cluster


def test_adapt_replaced_by_a_second_and_stopped_by_scale():
    with LocalCluster(n_workers=0, threads_per_worker=1) as cluster, Client(cluster) as client:
        first = cluster.adapt(minimum=1, maximum=2, interval="50ms")
        client.wait_for_workers(1, timeout=20)
        second = cluster.adapt(minimum=2, maximum=2, interval="50ms")
        assert not first.running and second.running and cluster.adaptive is second
        client.wait_for_workers(2, timeout=20)
        cluster.scale(1)
        assert not second.running and cluster.adaptive is None
        wait_until(lambda: n_workers(client) == 1, what="scale(1) to hold")
        time.sleep(0.5)  # no adapt loop brings the second worker back
        assert n_workers(client) == 1
        second.stop()  # stopping a stopped one is a no-op
        third = cluster.adapt(minimum=0, maximum=1, interval="50ms")
        third.stop()
        assert not third.running


def test_adapt_bad_input_names_the_option():
    with LocalCluster(n_workers=0, processes=False) as cluster:
        with pytest.raises(ValueError, match=r"minimum \(3\) must not exceed maximum \(2\)"):
            cluster.adapt(minimum=3, maximum=2)
        with pytest.raises(ValueError, match="interval must be a duration"):
            cluster.adapt(interval="soon")
        with pytest.raises(ValueError, match="target_duration must be a duration"):
            cluster.adapt(target_duration="-5s")
        with pytest.raises(ValueError, match="wait_count"):
            cluster.adapt(wait_count=0)
        assert cluster.adaptive is None
