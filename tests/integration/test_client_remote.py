"""The rest of the Client on real processes: ``run``, ``run_on_scheduler`` (token
holders only), ``upload_file``, ``who_has``/``has_what``/``nthreads``,
``get_executor``, ``as_completed.batches``, ``get_worker``."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from pathlib import Path

import pytest

from shoal import Client, LocalCluster, as_completed, get_worker


def worker_name(dask_worker: object) -> str:
    return dask_worker.name  # type: ignore[attr-defined]


async def async_pid() -> int:
    return os.getpid()


def fail() -> None:
    raise KeyError("broken on purpose")


def test_run_calls_on_every_worker_process(client: Client, cluster: LocalCluster) -> None:
    pids = client.run(os.getpid)
    assert sorted(pids.values()) == sorted(cluster.worker_pids)
    assert set(pids) == set(client.scheduler_info()["workers"])
    assert sorted(client.run(worker_name).values()) == ["0", "1"]
    assert client.run(async_pid) == pids  # coroutine functions are awaited


def test_run_on_chosen_workers_by_name_or_address(client: Client) -> None:
    info = client.scheduler_info()["workers"]
    by_name = {w["name"]: a for a, w in info.items()}
    assert list(client.run(worker_name, workers=["1"])) == [by_name["1"]]
    assert client.run(worker_name, workers=by_name["0"]) == {by_name["0"]: "0"}
    with pytest.raises(ValueError, match="no worker 'nope'"):
        client.run(os.getpid, workers=["nope"])


def test_run_errors_raise_return_or_ignore(client: Client) -> None:
    with pytest.raises(KeyError, match="broken on purpose") as info:
        client.run(fail)
    assert any("raised by the function run on tcp://" in n for n in info.value.__notes__)
    returned = client.run(fail, on_error="return")
    assert len(returned) == 2 and all(isinstance(v, KeyError) for v in returned.values())
    assert client.run(fail, on_error="ignore") == {}
    with pytest.raises(ValueError, match="on_error"):
        client.run(fail, on_error="shrug")
    with pytest.raises(ValueError, match="nanny=True"):
        client.run(os.getpid, nanny=True)


def scheduler_facts(dask_scheduler: object, extra: int = 0) -> tuple[str, int, int]:
    return dask_scheduler.address, len(dask_scheduler.state.workers), os.getpid() + extra  # type: ignore[attr-defined]


def test_run_on_scheduler_gets_the_scheduler_object(client: Client, cluster: LocalCluster) -> None:
    address, n_workers, pid = client.run_on_scheduler(scheduler_facts, extra=0)
    assert address == cluster.scheduler_address and n_workers == 2
    assert pid == cluster._procs[0].pid  # ran in the scheduler's own process
    assert client.run_on_scheduler(sum, [1, 2, 3]) == 6
    with pytest.raises(KeyError, match="broken on purpose"):
        client.run_on_scheduler(fail)


def test_run_on_scheduler_is_refused_without_a_cluster_token() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, token=False, timeout=30) as cluster,
        Client(cluster, timeout=30) as c,
    ):
        with pytest.raises(PermissionError, match="cluster token"):
            c.run_on_scheduler(scheduler_facts)
        assert c.run(worker_name) != {}  # workers run client functions as they run tasks


def read_uploaded() -> tuple[int, str]:
    import shoal_uploaded_module  # type: ignore[import-not-found]

    return shoal_uploaded_module.VALUE, get_worker().name


def test_upload_file_reaches_every_worker_and_reloads(client: Client, tmp_path: Path) -> None:
    module = tmp_path / "shoal_uploaded_module.py"
    module.write_text("VALUE = 1\n")
    assert list(client.upload_file(module).values()) == [{"status": "OK"}] * 2
    names = client.run(lambda: __import__("shoal_uploaded_module").VALUE)
    assert set(names.values()) == {1}
    module.write_text("VALUE = 2\n")
    client.upload_file(module)  # a new version replaces the module, as in Dask
    results = client.gather(
        [client.submit(read_uploaded, pure=False, workers=[n]) for n in ("0", "1")]
    )
    assert sorted(results) == [(2, "0"), (2, "1")]


def test_who_has_has_what_nthreads(client: Client) -> None:
    info = client.scheduler_info()["workers"]
    by_name = {w["name"]: a for a, w in info.items()}
    f = client.submit(sum, [4, 5], workers=["1"])
    assert f.result(timeout=10) == 9
    assert client.who_has([f]) == {f.key: [by_name["1"]]}
    assert client.who_has(f) == {f.key: [by_name["1"]]}
    assert f.key in client.who_has()
    has = client.has_what()
    assert set(has) == set(info) and f.key in has[by_name["1"]]
    assert f.key not in has[by_name["0"]]
    assert client.has_what(workers=["0"]) == {by_name["0"]: []}
    assert client.nthreads() == {a: 1 for a in info}
    assert client.nthreads(["1"]) == {by_name["1"]: 1}


def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def test_get_executor_is_a_concurrent_futures_executor(client: Client) -> None:
    with client.get_executor() as ex:
        assert isinstance(ex, cf.Executor)
        futures = [ex.submit(slow_square, i) for i in range(6)]
        assert [f.result(timeout=20) for f in futures] == [i * i for i in range(6)]
        assert list(ex.map(slow_square, range(4), timeout=20)) == [0, 1, 4, 9]
        bad = ex.submit(fail)
        with pytest.raises(KeyError, match="broken on purpose"):
            bad.result(timeout=20)
    with pytest.raises(RuntimeError, match="shut down"):
        ex.submit(slow_square, 1)
    pinned = client.get_executor(workers=["0"])
    assert pinned.submit(lambda: get_worker().name).result(timeout=20) == "0"
    pinned.shutdown()


def test_as_completed_batches_and_counts(client: Client) -> None:
    futures = client.map(slow_square, range(8), pure=False)
    ac = as_completed(futures[:4])
    assert ac.count() == 4 and not ac.is_empty()
    ac.update(futures[4:])
    assert ac.count() == 8
    seen = []
    for batch in ac.batches():
        assert batch  # never an empty batch
        seen.extend(batch)
    assert sorted(f.key for f in seen) == sorted(f.key for f in futures)
    assert ac.is_empty() and ac.next_batch() == []
    with_results = as_completed(client.map(slow_square, [2, 3], pure=False), with_results=True)
    pairs = [p for batch in with_results.batches() for p in batch]
    assert sorted(v for _, v in pairs) == [4, 9]


def test_get_worker_inside_and_outside_a_task(client: Client) -> None:
    f = client.submit(lambda: (get_worker().address, get_worker().nthreads), pure=False)
    address, nthreads = f.result(timeout=10)
    assert address in client.scheduler_info()["workers"] and nthreads == 1
    with pytest.raises(ValueError, match="inside a task"):
        get_worker()


def test_replicate_copies_results_to_workers(client: Client) -> None:
    info = client.scheduler_info()["workers"]
    by_name = {w["name"]: a for a, w in info.items()}
    futures = [client.submit(bytes, 1000 + i, workers=["0"]) for i in range(3)]
    client.gather(futures)
    assert {k: len(v) for k, v in client.who_has(futures).items()} == {f.key: 1 for f in futures}
    client.replicate(futures)  # every worker, by default
    assert all(sorted(v) == sorted(info) for v in client.who_has(futures).values())
    # the copy is used: the only original holder's copy can be asked for elsewhere
    only_1 = client.run(
        lambda dask_worker, keys=[f.key for f in futures]: all(
            k in dask_worker.state.data for k in keys
        ),
        workers=["1"],
    )
    assert only_1 == {by_name["1"]: True}
    with pytest.raises(ValueError, match="n >= 1"):
        client.replicate(futures, n=0)
    one = client.submit(bytes, 5, workers=["1"])
    client.replicate([one], n=1, workers=["0"])
    assert by_name["0"] in client.who_has(one)[one.key]


def mark_file(path: str) -> None:
    Path(path).write_text("ran")


def test_run_without_waiting(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "ran"
    assert client.run(mark_file, str(path), wait=False, workers=["0"]) is None
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.read_text() == "ran"
