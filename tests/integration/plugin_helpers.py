"""Plugins the plugin tests register (the scheduler, workers and nannies import them
by name, as a user's installed module). Each reports what it saw as events in the
scheduler's log, which the tests read with ``client.get_events``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shoal import NannyPlugin, SchedulerPlugin, WorkerPlugin

TOPIC = "test-plugins"


class WorkerRecorder(WorkerPlugin):
    name = "worker-recorder"

    def setup(self, worker: Any) -> None:
        self.worker = worker
        worker.log_event(TOPIC, {"hook": "setup", "pid": os.getpid()})

    def teardown(self, worker: Any) -> None:
        worker.log_event(TOPIC, {"hook": "teardown"})

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "memory":
            self.worker.log_event(
                TOPIC,
                {"hook": "transition", "key": key, "start": start, "sid": kwargs["stimulus_id"]},
            )


class SchedulerRecorder(SchedulerPlugin):
    name = "scheduler-recorder"

    def __init__(self, closed_file: str):
        self.closed_file = closed_file

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.log_event(TOPIC, {"hook": "start", "address": scheduler.address})

    def add_worker(self, scheduler: Any, worker: str) -> None:
        scheduler.log_event(TOPIC, {"hook": "add_worker", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kw: Any) -> None:
        scheduler.log_event(TOPIC, {"hook": "remove_worker", "worker": worker})

    def update_graph(
        self, scheduler: Any, *, client: str, keys: set, tasks: list, **kw: Any
    ) -> None:
        scheduler.log_event(
            TOPIC, {"hook": "update_graph", "client": client, "keys": sorted(keys), "tasks": tasks}
        )

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "memory":
            state = self.scheduler.tasks[key].state  # the read-only view agrees
            self.scheduler.log_event(
                TOPIC, {"hook": "transition", "key": key, "start": start, "state": state}
            )

    async def close(self) -> None:
        Path(self.closed_file).write_text("closed")


class RaisingSchedulerPlugin(SchedulerPlugin):
    name = "raising"

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError(f"no transition for {key!r}")


class RaisingWorkerSetup(WorkerPlugin):
    name = "raising-setup"

    def setup(self, worker: Any) -> None:
        raise ValueError(f"cannot set up on {worker.address}")


class NoOpTransitions(SchedulerPlugin):
    """A transition hook that does nothing (what the benchmark measures)."""

    name = "noop-transitions"

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        pass


class SetEnvironment(NannyPlugin):
    """Sets a variable in the nanny, which the worker processes it starts inherit."""

    name = "set-environment"
    restart = True

    def __init__(self, value: str):
        self.value = value

    def setup(self, nanny: Any) -> None:
        os.environ["SHOAL_PLUGIN_TEST"] = self.value
        nanny.log_event(TOPIC, {"hook": "nanny-setup", "nanny": nanny.name})

    def teardown(self, nanny: Any) -> None:
        os.environ.pop("SHOAL_PLUGIN_TEST", None)
        nanny.log_event(TOPIC, {"hook": "nanny-teardown", "nanny": nanny.name})


class TaskBudget(WorkerPlugin):
    """The README's: a worker process runs at most ``max_tasks`` tasks, then hands its
    results off and (under a nanny) is replaced by a fresh process."""

    name = "task-budget"
    idempotent = True

    def __init__(self, max_tasks: int):
        self.max_tasks = max_tasks

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.started = 0

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            self.started += 1
            if self.started == self.max_tasks:
                self.worker.close_gracefully(reason=f"ran its budget of {self.max_tasks} tasks")


def environment_variable(_: object = None) -> tuple[int, str | None]:
    return os.getpid(), os.environ.get("SHOAL_PLUGIN_TEST")


def getpid(_: object = None) -> int:
    return os.getpid()


def inc(x: int) -> int:
    return x + 1
