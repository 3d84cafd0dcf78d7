"""Workers that die, freeze or retire, and a scheduler that goes away: real processes
(``python -m shoal ...``), real TCP on loopback, real signals."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tasks import die_with_sigkill, getpid, make_list, wait_for_file
from test_lifecycle import read_scheduler_file, wait_until

from shoal import CancelledError, Client, KilledWorker, LocalCluster

pytestmark = pytest.mark.timeout(90)

Spawn = Callable[..., subprocess.Popen[bytes]]


def inc(x: int) -> int:
    return x + 1


def start_scheduler(
    spawn: Spawn, tmp_path: Path, *args: str
) -> tuple[subprocess.Popen[bytes], str]:
    sched_file = tmp_path / f"scheduler-{time.monotonic_ns()}.json"
    sched = spawn("scheduler", "--port", "0", "--scheduler-file", str(sched_file), "--quiet", *args)
    return sched, read_scheduler_file(sched_file, sched)


def start_workers(
    spawn: Spawn, address: str, n: int, *args: str, first: int = 0
) -> dict[str, subprocess.Popen[bytes]]:
    return {
        f"w{i}": spawn("worker", address, "--name", f"w{i}", *args) for i in range(first, first + n)
    }


def addresses(client: Client) -> dict[str, str]:
    """Worker name -> address."""
    return {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}


def test_sigkilled_worker_running_tasks_rerun_and_its_results_are_recomputed(
    spawn: Spawn, tmp_path: Path
) -> None:
    _, address = start_scheduler(spawn, tmp_path, "--validate")
    workers = start_workers(spawn, address, 2, "--validate")
    stop = tmp_path / "stop"
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        names = addresses(client)
        held = client.map(make_list, range(100, 140))  # lists stay on the workers
        client.gather(held)
        only_there = client.scatter([1000], workers=["w0"], hash=False)[0]
        elsewhere = client.scatter([2000], workers=["w1"], hash=False)[0]
        blocked = [client.submit(wait_for_file, str(stop), pure=False) for _ in range(2)]
        assert wait_until(
            lambda: all(w["processing"] for w in client.scheduler_info()["workers"].values()), 10
        ), "the blocking tasks did not start on both workers"
        workers["w0"].send_signal(signal.SIGKILL)
        workers["w0"].wait(10)
        assert wait_until(lambda: names["w0"] not in client.scheduler_info()["workers"], 10)
        stop.touch()
        # the task it was running runs again on the survivor; its results are recomputed
        assert [f.result(timeout=30) for f in blocked] == ["released", "released"]
        assert [len(x) for x in client.gather(held)] == list(range(100, 140))
        # scattered data that existed only there cannot be recomputed: a clear error
        with pytest.raises(RuntimeError, match="lost with the worker"):
            client.submit(inc, only_there).result(timeout=30)
        assert client.submit(inc, elsewhere).result(timeout=30) == 2001


def test_task_that_kills_its_workers_errs_with_killed_worker(spawn: Spawn, tmp_path: Path) -> None:
    _, address = start_scheduler(spawn, tmp_path, "--allowed-failures", "1")
    start_workers(spawn, address, 3)
    with Client(address, timeout=30) as client:
        client.wait_for_workers(3, timeout=30)
        names = {a: n for n, a in addresses(client).items()}
        bad = client.submit(die_with_sigkill, 1)
        with pytest.raises(KilledWorker) as info:
            bad.result(timeout=60)
        exc = info.value
        assert exc.key == bad.key
        assert len(exc.workers) == 2 and set(exc.workers) <= set(names)  # 1 allowed + 1
        assert f"task {bad.key!r} was running on 2 workers that died" in str(exc)
        # the one worker left goes on working
        assert len(client.scheduler_info()["workers"]) == 1
        assert client.gather(client.map(inc, range(10))) == list(range(1, 11))


def test_frozen_worker_is_removed_after_the_ttl(spawn: Spawn, tmp_path: Path) -> None:
    _, address = start_scheduler(spawn, tmp_path, "--worker-ttl", "1", "--validate")
    workers = start_workers(spawn, address, 2)
    stop = tmp_path / "stop"
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        names = addresses(client)
        pids = {w["name"]: w["pid"] for w in client.scheduler_info()["workers"].values()}
        assert pids == {n: p.pid for n, p in workers.items()}
        blocked = [client.submit(wait_for_file, str(stop), pure=False) for _ in range(2)]
        assert wait_until(
            lambda: all(w["processing"] for w in client.scheduler_info()["workers"].values()), 10
        )
        frozen = workers["w0"]
        frozen.send_signal(signal.SIGSTOP)  # alive, connected, silent
        try:
            start = time.monotonic()
            assert wait_until(lambda: names["w0"] not in client.scheduler_info()["workers"], 15)
            waited = time.monotonic() - start
            assert 1.5 < waited < 6, f"removed after {waited:.1f}s (TTL: 4 heartbeats of 0.5s)"
            stop.touch()
            assert [f.result(timeout=30) for f in blocked] == ["released", "released"]
        finally:
            frozen.send_signal(signal.SIGCONT)
        # woken up, it finds its connection closed and exits
        assert frozen.wait(20) == 0


def test_retire_worker_moves_its_data_and_closes_it(spawn: Spawn, tmp_path: Path) -> None:
    _, address = start_scheduler(spawn, tmp_path, "--validate")
    workers = start_workers(spawn, address, 2, "--validate")
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        names = addresses(client)
        futs = client.map(make_list, range(50, 90))
        client.gather(futs)
        before = client.scheduler_info()["workers"]
        assert before[names["w0"]]["nbytes"] > 0
        ran_on_w1 = before[names["w1"]]["tasks_run"]
        result = client.retire_workers(["w0"])
        assert result == {"retired": [names["w0"]], "refused": {}}
        assert workers["w0"].wait(20) == 0  # closed by the scheduler, cleanly
        info = client.scheduler_info()["workers"]
        assert list(info) == [names["w1"]]
        # nothing was recomputed: every result was copied over first
        assert [len(x) for x in client.gather(futs)] == list(range(50, 90))
        assert client.scheduler_info()["workers"][names["w1"]]["tasks_run"] == ran_on_w1
        # refused when no other worker could take the data; the worker keeps working
        result = client.retire_workers(["w1"])
        assert (
            result["retired"] == [] and "no other running worker" in result["refused"][names["w1"]]
        )
        assert workers["w1"].poll() is None
        assert client.submit(inc, 1).result(timeout=30) == 2
        assert client.submit(getpid, 0, pure=False).result(timeout=30) == workers["w1"].pid


def test_frozen_scheduler_is_noticed_by_clients_and_workers(spawn: Spawn, tmp_path: Path) -> None:
    sched, address = start_scheduler(spawn, tmp_path)
    workers = start_workers(spawn, address, 1, "--scheduler-timeout", "2")
    stop = tmp_path / "stop"
    client = Client(address, timeout=30, scheduler_timeout=2)
    try:
        client.wait_for_workers(1, timeout=30)
        pending = client.submit(wait_for_file, str(stop), pure=False)
        time.sleep(0.3)
        sched.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(CancelledError, match="did not answer for 2"):
            pending.result(timeout=15)
        assert time.monotonic() - start < 8
        assert wait_until(lambda: client.status == "closed", 5)
        stop.touch()
        assert workers["w0"].wait(20) == 0  # the worker gave up on it too, and exited
    finally:
        sched.send_signal(signal.SIGCONT)
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_reconnects_to_a_restarted_scheduler(spawn: Spawn, tmp_path: Path) -> None:
    port = str(free_port())
    address = f"tcp://127.0.0.1:{port}"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    sched = spawn("scheduler", "--port", port, "--quiet", "--scheduler-file", str(first))
    assert read_scheduler_file(first, sched) == address
    worker = spawn("worker", address, "--name", "phoenix", "--reconnect", "--timeout", "30")
    with Client(address, timeout=30) as client:
        client.wait_for_workers(1, timeout=30)
        assert client.submit(inc, 1).result(timeout=30) == 2
    sched.send_signal(signal.SIGKILL)
    sched.wait(10)
    time.sleep(0.5)
    assert worker.poll() is None, "the worker exited instead of waiting for the scheduler"
    again = spawn("scheduler", "--port", port, "--quiet", "--scheduler-file", str(second))
    assert read_scheduler_file(second, again) == address
    with Client(address, timeout=30) as client:
        client.wait_for_workers(1, timeout=30)
        [info] = client.scheduler_info()["workers"].values()
        assert info["name"] == "phoenix" and info["pid"] == worker.pid
        assert client.submit(inc, 41).result(timeout=30) == 42


def test_worker_without_reconnect_exits_when_the_scheduler_dies(
    spawn: Spawn, tmp_path: Path
) -> None:
    sched, address = start_scheduler(spawn, tmp_path)
    workers = start_workers(spawn, address, 1)
    with Client(address, timeout=30) as client:
        client.wait_for_workers(1, timeout=30)
    sched.send_signal(signal.SIGKILL)
    assert workers["w0"].wait(20) == 0


def test_killed_worker_under_nannies_that_restart_the_workers() -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, allowed_failures=1) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        first = set(cluster.worker_pids)
        bad = client.submit(die_with_sigkill, 2)
        with pytest.raises(KilledWorker) as info:
            bad.result(timeout=60)
        assert len(info.value.workers) == 2
        # the nannies bring both workers back, under their names, in new processes
        client.wait_for_workers(2, timeout=30)
        assert wait_until(lambda: len(cluster.worker_pids) == 2, 10)
        assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == ["0", "1"]
        assert set(cluster.worker_pids) != first
        assert client.gather(client.map(inc, range(10))) == list(range(1, 11))
