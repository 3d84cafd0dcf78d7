"""A preload that registers plugins whose ``transition`` hooks do nothing: what plugins
cost the per-task path once they watch transitions (README, Plugins). Run with

    SHOAL_SCHEDULER_PRELOAD=benchmarks.noop_plugins SHOAL_WORKER_PRELOAD=benchmarks.noop_plugins \\
        python benchmarks/run.py --only map --systems shoal
"""

from typing import Any

from shoal import SchedulerPlugin, WorkerPlugin
from shoal.server.worker import Worker


class NoOpSchedulerTransitions(SchedulerPlugin):
    name = "noop-transitions"

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        pass


class NoOpWorkerTransitions(WorkerPlugin):
    name = "noop-transitions"

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        pass


def shoal_setup(server: Any) -> None:
    if isinstance(server, Worker):
        server.add_plugin(NoOpWorkerTransitions())
    else:
        server.add_plugin(NoOpSchedulerTransitions())
