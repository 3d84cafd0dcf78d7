"""Plugins on real processes: worker, scheduler and nanny plugins registered by a
client, a failing plugin, the token gate, unregistering, ``--preload``, and the
README's task-budget plugin."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_helpers import (
    TOPIC,
    RaisingSchedulerPlugin,
    RaisingWorkerSetup,
    SchedulerRecorder,
    SetEnvironment,
    TaskBudget,
    WorkerRecorder,
    environment_variable,
    getpid,
    inc,
)

from shoal import Client, LocalCluster, PluginError, WorkerPlugin

Spawn = Callable[..., subprocess.Popen[bytes]]


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def recorded(client: Client, hook: str) -> list[dict[str, Any]]:
    return [data for _, data in client.get_events(TOPIC) if data.get("hook") == hook]


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as c:
        yield c


def test_worker_and_scheduler_plugins_see_every_worker_and_task(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    closed = tmp_path / "closed"
    with Client(cluster, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        first = set(client.scheduler_info()["workers"])
        assert client.register_plugin(SchedulerRecorder(str(closed))) is None
        results = client.register_plugin(WorkerRecorder())
        assert results == {address: {"status": "OK"} for address in first}
        assert [e["address"] for e in recorded(client, "start")] == [cluster.scheduler_address]
        assert {e["worker"] for e in recorded(client, "setup")} == first

        cluster.scale(3)  # a worker that joins later gets the worker plugin too
        client.wait_for_workers(3, timeout=30)
        every = set(client.scheduler_info()["workers"])
        (late,) = every - first
        wait_until(lambda: {e["worker"] for e in recorded(client, "setup")} == every, what="setup")
        assert [e["worker"] for e in recorded(client, "add_worker")] == [late]

        futures = [client.submit(inc, i, workers=[a]) for i, a in enumerate(sorted(every))]
        assert client.gather(futures) == [1, 2, 3]
        keys = {f.key for f in futures}

        def on_workers() -> list[dict[str, Any]]:
            return [e for e in recorded(client, "transition") if "worker" in e]

        wait_until(lambda: len(on_workers()) >= 3, what="worker transitions")
        ran = {e["worker"]: e["key"] for e in on_workers()}
        assert set(ran) == every and set(ran.values()) == keys  # one task on each worker
        on_scheduler = [e for e in recorded(client, "transition") if "worker" not in e]
        assert {e["key"] for e in on_scheduler} == keys
        assert all(e["start"] == "processing" and e["state"] == "memory" for e in on_scheduler)
        graphs = recorded(client, "update_graph")
        assert {k for g in graphs for k in g["tasks"]} == keys
        assert {k for g in graphs for k in g["keys"]} == keys

        cluster.scale(2)
        wait_until(lambda: recorded(client, "remove_worker"), what="remove_worker")
        (removed,) = [e["worker"] for e in recorded(client, "remove_worker")]
        stay = every - {removed}

        client.unregister_plugin("worker-recorder")
        assert {e["worker"] for e in recorded(client, "teardown")} == stay
        assert not closed.exists()
        assert client.unregister_plugin("scheduler-recorder") is None
        assert closed.read_text() == "closed"
        n_transitions = len(recorded(client, "transition"))
        assert client.submit(inc, 10).result() == 11
        time.sleep(0.3)
        assert len(recorded(client, "transition")) == n_transitions  # gone for good
        with pytest.raises(ValueError, match="no plugin named 'worker-recorder'"):
            client.unregister_plugin("worker-recorder")


def test_a_raising_plugin_is_recorded_and_work_goes_on(cluster: LocalCluster) -> None:
    with Client(cluster, timeout=30) as client:
        client.register_plugin(RaisingSchedulerPlugin())
        assert client.gather(client.map(inc, range(20))) == list(range(1, 21))
        failures = [data for _, data in client.get_events("plugins")]
        assert failures and {f["plugin"] for f in failures} == {"raising"}
        assert all(f["hook"] == "transition" for f in failures)
        assert "ZeroDivisionError: no transition for" in failures[0]["error"]
        assert "raise ZeroDivisionError" in failures[0]["traceback"]
        client.unregister_plugin("raising")

        with pytest.raises(PluginError, match="'raising-setup' failed in setup on") as info:
            client.register_plugin(RaisingWorkerSetup())
        assert "ValueError: cannot set up on" in str(info.value)
        assert set(info.value.results) == set(client.scheduler_info()["workers"])
        setup_failures = [
            data for _, data in client.get_events("plugins") if data["hook"] == "setup"
        ]
        assert {f["worker"] for f in setup_failures} == set(info.value.results)
        assert client.submit(inc, 1).result() == 2  # the workers go on
        client.unregister_plugin("raising-setup")


def test_registering_without_a_token_is_refused() -> None:
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, token=False, timeout=60) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        for plugin in (SchedulerRecorder("unused"), WorkerRecorder(), SetEnvironment("x")):
            with pytest.raises(PermissionError, match="start it with a token"):
                client.register_plugin(plugin)
        with pytest.raises(PermissionError, match="no token|has none"):
            client.unregister_plugin("anything")
        assert client.submit(inc, 1).result() == 2


def test_a_plugin_must_be_one_of_the_three_kinds(cluster: LocalCluster) -> None:
    class Duck:
        def setup(self, worker: Any) -> None: ...

    with (
        Client(cluster, timeout=30) as client,
        pytest.raises(TypeError, match="inherit from shoal.SchedulerPlugin"),
    ):
        client.register_plugin(Duck())


def test_nanny_plugin_set_up_on_every_nanny_and_restarts_workers() -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        client.wait_for_workers(2, timeout=30)
        before = {pid for pid, _ in client.gather(client.map(environment_variable, [0, 1]))}
        old_pids = set(cluster.worker_pids)
        results = client.register_plugin(SetEnvironment("set by a nanny plugin"))
        assert set(results) == {"0", "1"}  # by nanny name
        assert all(r == {"status": "OK"} for r in results.values())
        assert {e["nanny"] for e in recorded(client, "nanny-setup")} == {"0", "1"}
        # restart = True: both workers are fresh processes, started in the new environment
        wait_until(lambda: len(set(cluster.worker_pids) - old_pids) == 2, 30, "workers restarted")
        client.wait_for_workers(2, timeout=30)
        seen = client.gather(
            [
                client.submit(environment_variable, i, workers=[a])
                for i, a in enumerate(client.scheduler_info()["workers"])
            ]
        )
        assert all(value == "set by a nanny plugin" for _, value in seen)
        assert not {pid for pid, _ in seen} & (before | old_pids)

        cluster.scale(3)  # a nanny that starts later sets up before its worker starts
        client.wait_for_workers(3, timeout=30)
        wait_until(lambda: len(recorded(client, "nanny-setup")) == 3, what="third nanny")
        assert recorded(client, "nanny-setup")[-1]["nanny"] == "2"
        (third,) = [a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "2"]
        assert client.submit(environment_variable, 9, workers=[third]).result()[1] == (
            "set by a nanny plugin"
        )
        client.unregister_plugin("set-environment")
        assert {e["nanny"] for e in recorded(client, "nanny-teardown")} == {"0", "1", "2"}


def test_task_budget_plugin_limits_tasks_per_worker_process() -> None:
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, timeout=60) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        client.wait_for_workers(1, timeout=30)
        client.register_plugin(TaskBudget(3))
        pids = [client.submit(getpid, i).result(timeout=30) for i in range(10)]
        per_process = Counter(pids)
        assert max(per_process.values()) == 3, per_process  # never more than the budget
        assert len(per_process) == 4  # 3 + 3 + 3 + 1: a fresh process after each budget
        assert set(pids) - set(cluster.worker_pids) == set(per_process) - {pids[-1]}


# ------------------------------------------------------------------------ --preload

SCHEDULER_PRELOAD = """
from pathlib import Path
from shoal import SchedulerPlugin

class Joins(SchedulerPlugin):
    name = "joins"
    def add_worker(self, scheduler, worker):
        scheduler.log_event("preload", {"joined": worker})

    async def close(self):  # the scheduler closes
        Path(__file__).with_suffix(".closed").write_text("closed")

def shoal_setup(scheduler):
    scheduler.add_plugin(Joins())

def shoal_teardown(scheduler):
    Path(__file__).with_suffix(".done").write_text(scheduler.address)
"""

WORKER_PRELOAD = """
from pathlib import Path
from shoal import WorkerPlugin

class Hello(WorkerPlugin):
    def setup(self, worker):
        worker.log_event("preload", {"worker-setup": worker.name})

def dask_setup(worker):  # Dask's name works too
    worker.add_plugin(Hello())

def dask_teardown(worker):
    Path(__file__).with_suffix(".done").write_text(worker.name)
"""


def read_scheduler_file(path: Path, proc: subprocess.Popen[bytes]) -> str:
    import json

    def address() -> str | None:
        assert proc.poll() is None, f"the scheduler exited with {proc.returncode}"
        try:
            return str(json.loads(path.read_text())["address"])
        except (FileNotFoundError, ValueError):
            return None

    return str(wait_until(address, 30, "scheduler file"))


def test_preload_on_scheduler_and_worker_cli(spawn: Spawn, tmp_path: Path) -> None:
    scheduler_preload = tmp_path / "scheduler_preload.py"
    scheduler_preload.write_text(SCHEDULER_PRELOAD)
    worker_preload = tmp_path / "worker_preload.py"
    worker_preload.write_text(WORKER_PRELOAD)
    sched_file = tmp_path / "scheduler.json"
    sched = spawn(
        "scheduler",
        "--port",
        "0",
        "--quiet",
        "--scheduler-file",
        str(sched_file),
        "--preload",
        str(scheduler_preload),
    )
    address = read_scheduler_file(sched_file, sched)
    # Under a nanny: the nanny passes --preload on to the worker process it starts.
    worker = spawn("worker", address, "--nanny", "--name", "w0", "--preload", str(worker_preload))
    with Client(address, timeout=30) as client:
        client.wait_for_workers(1, timeout=30)
        (w,) = client.scheduler_info()["workers"]
        wait_until(lambda: len(client.get_events("preload")) == 2, what="preload events")
        events = [data for _, data in client.get_events("preload")]
        assert {"joined": w} in events
        assert {"worker-setup": "w0", "worker": w} in events
    worker.send_signal(2)
    assert worker.wait(20) == 0
    assert worker_preload.with_suffix(".done").read_text() == "w0"
    sched.send_signal(2)
    assert sched.wait(20) == 0
    assert scheduler_preload.with_suffix(".done").read_text() == address
    assert scheduler_preload.with_suffix(".closed").read_text() == "closed"


@pytest.mark.parametrize("command", ["scheduler", "worker"])
def test_a_preload_that_cannot_be_imported_stops_the_process(spawn: Spawn, command: str) -> None:
    args = ["--port", "0"] if command == "scheduler" else ["tcp://127.0.0.1:9", "--timeout", "1"]
    proc = spawn(command, *args, "--preload", "no_such_preload_module", stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "--preload 'no_such_preload_module': cannot import it: ModuleNotFoundError" in (
        err.decode()
    )


def test_a_preload_whose_setup_raises_stops_the_process(spawn: Spawn, tmp_path: Path) -> None:
    bad = tmp_path / "bad_preload.py"
    bad.write_text("def shoal_setup(server):\n    raise RuntimeError('not today')\n")
    message = f"--preload '{bad}': its setup raised RuntimeError: not today"
    proc = spawn("scheduler", "--port", "0", "--preload", str(bad), stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert message in err.decode()

    sched_file = tmp_path / "scheduler.json"
    sched = spawn("scheduler", "--port", "0", "--quiet", "--scheduler-file", str(sched_file))
    address = read_scheduler_file(sched_file, sched)
    proc = spawn("worker", address, "--preload", str(bad), stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert message in err.decode()


def test_a_plugin_defined_in_a_function_travels_by_value(cluster: LocalCluster) -> None:
    class CountTasks(WorkerPlugin):  # no importable name: cloudpickle sends the class
        name = "count"

        def setup(self, worker: Any) -> None:
            self.worker = worker

        def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
            if finish == "memory":
                self.worker.log_event("count", {"key": key, "python": sys.version_info[0]})

    with Client(cluster, timeout=30) as client:
        client.register_plugin(CountTasks())
        future = client.submit(inc, 41)
        assert future.result() == 42
        key = future.key
        wait_until(lambda: client.get_events("count"), what="count events")
        assert [d["key"] for _, d in client.get_events("count")] == [key]
        client.unregister_worker_plugin("count")  # Dask's name
        with pytest.raises(ValueError, match="no worker plugin named 'count'"):
            client.unregister_worker_plugin("count")
