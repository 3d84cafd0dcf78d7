"""Tasks for test_loop_tasks (importable by the workers)."""

from __future__ import annotations

import operator
from typing import Any

import shoal
from shoal import WorkerPlugin


def tiny_sums_from_a_task(n: int, worker: str) -> list[int]:
    """Submit ``n`` tiny tasks to ``worker`` (this task's, which runs them on its loop)
    from a task, and wait for them."""
    with shoal.worker_client() as client:
        futures = [client.submit(operator.add, i, 1, workers=worker, pure=False) for i in range(n)]
        return client.gather(futures)


def tiny_sum_after_get_client(values: list[int]) -> int:
    """Wait, without seceding, on a tiny task (the loop waiting here could never end)."""
    client = shoal.get_client()
    return client.submit(sum, values, pure=False).result(timeout=30)


def secede_then_sum(values: list[int]) -> int:
    shoal.secede()
    return sum(values)


def loop_task_count(dask_worker: Any) -> int:
    return dask_worker.loop_task_count


class TransitionLog(WorkerPlugin):
    """Keeps the worker's transitions, (start, finish) by key."""

    name = "transition-log"

    def setup(self, worker: Any) -> None:
        self.log: dict[Any, list[tuple[str, str]]] = {}

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        self.log.setdefault(key, []).append((start, finish))


def transitions_of(dask_worker: Any) -> dict[Any, list[tuple[str, str]]]:
    return dask_worker.plugins.registry.plugins[TransitionLog.name].log


def add_transition_log(dask_worker: Any) -> None:
    dask_worker.add_plugin(TransitionLog())
