"""Chaos: a tree reduction over a map while a worker is SIGKILLed every ~2 s and its
nanny restarts it. The result must be exact, and every state machine must have held
its invariants throughout (the cluster runs with validate=True: the scheduler and the
workers check every invariant after each batch and exit on the first one broken).

CI runs one round at the issue's size; ``SHOAL_CHAOS_RUNS=10`` runs ten in a row and
``SHOAL_CHAOS_TASKS`` changes the size.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import psutil
import pytest

from shoal import Client, Future, LocalCluster

RUNS = int(os.environ.get("SHOAL_CHAOS_RUNS", "1"))
MAP_TASKS = int(os.environ.get("SHOAL_CHAOS_TASKS", "4400"))  # + the tree: about 5,000
FAN_IN = 8
KILL_EVERY = 2.0


def slow_inc(x: int) -> int:
    time.sleep(0.002)
    return x + 1


def add_all(*xs: int) -> int:
    return sum(xs)


def tree_sum(client: Client, futures: list[Future]) -> tuple[Future, int]:
    level, n = futures, len(futures)
    while len(level) > 1:
        level = [
            client.submit(add_all, *level[i : i + FAN_IN]) for i in range(0, len(level), FAN_IN)
        ]
        n += len(level)
    return level[0], n


class Killer(threading.Thread):
    """SIGKILLs one of the cluster's current worker processes every ~2 s."""

    def __init__(self, cluster: LocalCluster, seed: int):
        super().__init__(name="chaos-killer", daemon=True)
        self.cluster = cluster
        self.random = random.Random(seed)
        self.stopping = threading.Event()
        self.killed: list[int] = []

    def run(self) -> None:
        while not self.stopping.wait(KILL_EVERY * self.random.uniform(0.75, 1.25)):
            pids = [p for p in self.cluster.worker_pids if psutil.pid_exists(p)]
            if len(pids) < 2:
                continue  # the others are still restarting: never kill the last one
            pid = self.random.choice(pids)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append(pid)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("round_", range(RUNS))
def test_tree_reduction_survives_a_worker_killed_every_two_seconds(round_: int) -> None:
    seed = int(os.environ.get("SHOAL_CHAOS_SEED", "0")) + round_
    with (
        LocalCluster(n_workers=3, threads_per_worker=1, validate=True, timeout=60) as cluster,
        Client(cluster, timeout=60) as client,
    ):
        scheduler = psutil.Process(cluster._procs[0].pid)
        killer = Killer(cluster, seed)
        killer.start()
        try:
            mapped = client.map(slow_inc, range(MAP_TASKS))
            total, n_tasks = tree_sum(client, mapped)
            assert n_tasks >= 5_000 or MAP_TASKS != 4400
            value = total.result(timeout=200)
        finally:
            killer.stopping.set()
            killer.join(10)
        print(f"chaos round {round_}: {len(killer.killed)} workers SIGKILLed, {n_tasks} tasks")
        assert value == MAP_TASKS * (MAP_TASKS + 1) // 2
        assert len(killer.killed) >= 2, f"only {len(killer.killed)} kills: no chaos"
        # Still standing, and the invariants still hold: one more batch on every role
        # (validate_state runs after it; a broken invariant would have exited the process).
        client.wait_for_workers(3, timeout=60)
        assert client.gather(client.map(slow_inc, range(30))) == list(range(1, 31))
        assert scheduler.is_running() and scheduler.status() != psutil.STATUS_ZOMBIE
        assert all(psutil.pid_exists(p) for p in cluster.worker_pids)
