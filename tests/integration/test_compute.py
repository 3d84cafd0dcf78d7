"""Computing on a process cluster: map/submit, dependencies, scatter/gather, keys,
``wait``, ``as_completed``, callbacks, timeouts and the asynchronous API.

The tests share one module-scoped ``LocalCluster`` (a scheduler process and two
single-threaded worker processes); each opens and closes its own ``Client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tasks import wait_for_file

from shoal import Client, LocalCluster, as_completed, wait

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def pid_after(seconds, tag):
    """Occupy a worker thread for a while; report which process ran us."""
    time.sleep(seconds)
    return os.getpid()


def fail(x):
    raise ValueError(f"failed on {x}")


def combine(a, b):
    return (a, b, os.getpid())


def test_quickstart(client: Client) -> None:
    futs = client.map(inc, range(10_000))
    total = client.submit(sum, futs)
    assert total.result(timeout=60) == 50005000
    assert futs[0].result(timeout=10) == 1
    assert futs[-1].result(timeout=10) == 10_000


def test_dependencies_across_workers(client: Client, cluster: LocalCluster) -> None:
    before = {a: w["tasks_run"] for a, w in client.scheduler_info()["workers"].items()}
    assert len(before) == 2
    # Two root tasks that each hold a single-threaded worker for a while: the
    # scheduler must place one on each worker.
    a = client.submit(pid_after, 0.5, "a", pure=False)
    b = client.submit(pid_after, 0.5, "b", pure=False)
    c = client.submit(combine, a, b)
    pa, pb, pc = c.result(timeout=30)
    assert (pa, pb) == (a.result(timeout=10), b.result(timeout=10))
    assert pa != pb, "both root tasks ran on the same worker"
    assert {pa, pb} == set(cluster.worker_pids)
    assert pc in (pa, pb)
    after = {a: w["tasks_run"] for a, w in client.scheduler_info()["workers"].items()}
    assert after.keys() == before.keys()
    ran = {addr: after[addr] - before[addr] for addr in after}
    assert all(n >= 1 for n in ran.values()), ran
    assert sum(ran.values()) == 3, ran


def test_dependency_chain_and_fan_in(client: Client) -> None:
    xs = client.map(inc, range(50), pure=False)
    ys = [client.submit(add, x, x) for x in xs]
    total = client.submit(sum, ys)
    assert total.result(timeout=30) == sum(2 * (i + 1) for i in range(50))


def test_pure_keys(client: Client) -> None:
    a = client.submit(inc, 1)
    b = client.submit(inc, 1)
    c = client.submit(inc, 2)
    assert a.key == b.key
    assert a.key != c.key
    assert a.key.startswith("inc-")
    x = client.submit(inc, 1, pure=False)
    y = client.submit(inc, 1, pure=False)
    assert len({x.key, y.key, a.key}) == 3
    assert client.gather([a, b, c, x, y]) == [2, 2, 3, 2, 2]


def test_scatter_gather_numpy(client: Client) -> None:
    arr = np.random.default_rng(42).random(1_000_000)
    assert arr.dtype == np.float64
    fut = client.scatter(arr)
    assert fut.status == "finished"
    back = client.gather(fut)
    assert isinstance(back, np.ndarray)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert np.array_equal(back, arr)
    assert np.array_equal(fut.result(timeout=30), arr)
    total = client.submit(np.sum, fut).result(timeout=30)
    assert total == pytest.approx(float(arr.sum()), rel=1e-12)
    # the scattered array also round-trips through a task that returns it
    doubled = client.submit(np.multiply, fut, 2.0).result(timeout=30)
    assert np.array_equal(doubled, arr * 2.0)


def test_scatter_list_and_dict(client: Client) -> None:
    futs = client.scatter([1, "two", {"three": 3}])
    assert isinstance(futs, list) and len(futs) == 3
    assert client.gather(futs) == [1, "two", {"three": 3}]
    named = client.scatter({"x-key": 10, "y-key": 20})
    assert set(named) == {"x-key", "y-key"}
    assert named["x-key"].key == "x-key"
    assert client.submit(add, named["x-key"], named["y-key"]).result(timeout=30) == 30


def test_gather_nested(client: Client) -> None:
    futs = client.map(inc, range(6))
    structure = {
        "a": futs[:2],
        "b": {"c": futs[2], "d": (futs[3], futs[4])},
        "e": [[futs[5]], 7, "plain"],
    }
    assert client.gather(structure) == {
        "a": [1, 2],
        "b": {"c": 3, "d": (4, 5)},
        "e": [[6], 7, "plain"],
    }
    assert client.gather(futs[0]) == 1


def test_wait(client: Client, stop_file: Path) -> None:
    futs = client.map(inc, range(20))
    done, not_done = wait(futs, timeout=30)
    assert done == set(futs) and not not_done
    assert all(f.status == "finished" for f in futs)

    blocked = client.submit(wait_for_file, str(stop_file), pure=False)
    quick = client.submit(inc, 100)
    done, not_done = wait([blocked, quick], timeout=30, return_when="FIRST_COMPLETED")
    assert quick in done and blocked in not_done
    # a future that is done already completes FIRST_COMPLETED at once
    start = time.monotonic()
    done, not_done = wait([blocked, quick], timeout=30, return_when="FIRST_COMPLETED")
    assert time.monotonic() - start < 5, "FIRST_COMPLETED waited for a second future"
    assert done == {quick} and not_done == {blocked}
    # FIRST_EXCEPTION: returns once a future has failed (here: one failed before)
    bad = client.submit(fail, 1)
    assert isinstance(bad.exception(timeout=30), ValueError)
    start = time.monotonic()
    done, not_done = wait([blocked, bad], timeout=30, return_when="FIRST_EXCEPTION")
    assert time.monotonic() - start < 5, "FIRST_EXCEPTION missed a failed future"
    assert done == {bad} and not_done == {blocked}
    # ... and waits for all of them when none fails
    done, not_done = wait([quick, client.submit(inc, 7)], timeout=30, return_when="FIRST_EXCEPTION")
    assert len(done) == 2 and not not_done
    with pytest.raises(TimeoutError):
        wait([blocked], timeout=0.3)
    stop_file.touch()
    done, not_done = wait([blocked], timeout=30)
    assert done == {blocked} and blocked.result(timeout=10) == "released"


def test_as_completed(client: Client) -> None:
    futs = client.map(inc, range(10))
    seen = list(as_completed(futs))
    assert sorted(f.key for f in seen) == sorted(f.key for f in futs)
    assert all(f.done() for f in seen)

    futs2 = client.map(add, range(10), range(10))
    pairs = list(as_completed(futs2, with_results=True))
    assert len(pairs) == 10
    for fut, value in pairs:
        assert value == fut.result(timeout=10)
    assert sorted(v for _, v in pairs) == [2 * i for i in range(10)]


def test_add_done_callback(client: Client) -> None:
    fired = threading.Event()
    calls: list[tuple[str, str]] = []

    def callback(fut):
        calls.append((fut.key, fut.status))
        fired.set()

    f = client.submit(pid_after, 0.2, "cb", pure=False)
    f.add_done_callback(callback)
    assert fired.wait(30)
    assert calls == [(f.key, "finished")]

    # on a future that is already done, the callback runs too
    fired.clear()
    f.add_done_callback(callback)
    assert fired.wait(10)
    assert calls == [(f.key, "finished"), (f.key, "finished")]


def test_result_timeout(client: Client, stop_file: Path) -> None:
    f = client.submit(wait_for_file, str(stop_file), pure=False)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.5)
    assert time.monotonic() - start < 5
    assert f.status == "pending"
    stop_file.touch()
    assert f.result(timeout=30) == "released"


def test_asynchronous_client(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(cluster.scheduler_address, asynchronous=True) as c:
            f = c.submit(inc, 1)
            assert await f == 2
            assert await f.result() == 2
            futs = c.map(inc, range(10))
            assert await c.gather(futs) == list(range(1, 11))
            total = c.submit(sum, futs)
            assert await total == 55
            nested = await c.gather({"a": [futs[0]], "b": (futs[1],)})
            assert nested == {"a": [1], "b": (2,)}
            x = await c.scatter(41)
            assert await c.submit(inc, x) == 42
            info = await c.scheduler_info()
            assert len(info["workers"]) == 2
            more = c.map(add, range(5), range(5))
            results = [v async for _, v in as_completed(more, with_results=True)]
            assert sorted(results) == [0, 2, 4, 6, 8]
            done, not_done = await wait(more)
            assert done == set(more) and not not_done

        # ``await Client(...)`` and an explicit close
        c2 = await Client(cluster.scheduler_address, asynchronous=True)
        try:
            assert await c2.submit(add, 20, 22) == 42
        finally:
            await c2.close()
        assert c2.status == "closed"

    asyncio.run(main())


def test_function_passed_as_an_argument_reaches_the_worker(client):
    # A by-value function inside the arguments goes through the function table like
    # the task's own function; the worker must be sent its entry too.
    assert client.submit(lambda g: g(1), lambda x: x + 41).result(timeout=30) == 42


async def async_inc(x):
    await asyncio.sleep(0.01)
    return x + 1


def test_coroutine_functions_run_to_completion(client):
    # An async function's coroutine is awaited on the worker; the result is its value.
    futs = client.map(async_inc, range(5))
    assert client.gather(futs) == [1, 2, 3, 4, 5]
    assert client.get({"a": (async_inc, 41)}, "a") == 42


def test_a_request_after_a_release_sees_the_release(client: Client) -> None:
    """A client's messages reach the scheduler in the order its caller made them, also
    when one is a release queued for the scheduler connection and the next a request
    written on it directly: asked right after a compute, the cluster no longer holds
    the keys the compute released."""
    import dask

    for i in range(20):
        total = dask.delayed(sum)([i, 1, 2])
        assert total.compute(scheduler=client.get) == i + 3
        held = {k for keys in client.has_what().values() for k in keys}
        assert total.key not in held, f"compute {i}: released key still held"
        future = client.submit(lambda x: x + 1, i, pure=False)
        assert future.result(timeout=10) == i + 1
        key = future.key
        del future
        assert key not in {k for keys in client.has_what().values() for k in keys}


@contextlib.contextmanager
def counted_direct_writes() -> Iterator[list[str]]:
    """The type of every message a calling thread wrote straight on a connection
    (``Connection.write_direct``) while the block runs."""
    from shoal.comm.connection import Connection

    direct: list[str] = []
    write_direct = Connection.write_direct

    def counting(self: Connection, msgs: list) -> bool:
        done = write_direct(self, msgs)
        if done:
            direct.append(type(msgs[0]).__name__)
        return done

    Connection.write_direct = counting  # type: ignore[method-assign]
    try:
        yield direct
    finally:
        Connection.write_direct = write_direct  # type: ignore[method-assign]


def test_a_direct_write_never_overtakes_what_waits_in_the_outbox(client: Client) -> None:
    """A small submission from the calling thread is written straight on the socket
    only when nothing waits in the client's outbox: here the release of the same key
    waits there (the loop is held busy), so the resubmission must queue behind it, or
    the scheduler would see it first and the release would drop the key it brings back."""
    future = client.submit(inc, 1, key="outbox-order")
    assert future.result(timeout=10) == 2
    loop_busy, go_on = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        loop_busy.set()
        go_on.wait(10)

    with counted_direct_writes() as direct:
        try:
            client._loop.call_soon_threadsafe(hold_the_loop)
            assert loop_busy.wait(10)
            del future  # its ReleaseKeys waits in the outbox: the loop cannot write it
            assert client._outbox, "the release should be waiting in the outbox"
            again = client.submit(inc, 1, key="outbox-order")
            go_on.set()
            assert again.result(timeout=10) == 2
        finally:
            go_on.set()
    assert direct == []  # the submission went through the outbox, behind the release
    assert "outbox-order" in {k for keys in client.has_what().values() for k in keys}


def test_caller_threads_writing_directly_and_the_loop_keep_each_threads_order(
    client: Client,
) -> None:
    """Threads computing (the same key again) and dropping results at once (each
    submission written straight on the scheduler connection from its thread, or through
    the loop when something waits there; releases through the loop) while the loop
    sends its own requests: every result is right, and once all futures are gone the
    cluster holds none of their keys (a submission overtaking the release before it
    would be dropped by that release, or leave a key held)."""
    import dask

    errors: list[BaseException] = []
    keys: list[str] = []

    def caller(t: int) -> None:
        try:
            for i in range(40):
                # The same key again and again: its release must not be overtaken by
                # its next submission (the scheduler would drop the resubmitted key).
                total = dask.delayed(sum)([t, 0, 1])
                keys.append(total.key)
                assert total.compute(scheduler=client.get) == t + 1
                future = client.submit(lambda x: x * 2, (t, i), pure=False)
                keys.append(future.key)
                assert future.result(timeout=10) == (t, i, t, i)
                del future
        except BaseException as e:
            errors.append(e)

    with counted_direct_writes() as direct:
        threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            client.has_what()  # the loop's own requests, meanwhile
        for th in threads:
            th.join()
    assert not errors, errors
    assert "SubmitTasks" in direct  # the path was taken
    deadline = time.monotonic() + 10
    while (held := {k for ks in client.has_what().values() for k in ks} & set(keys)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert not held, f"released keys still held: {sorted(held)[:5]}"
