"""Coordination primitives on real processes: a Queue between producer and consumer
tasks, a Lock excluding tasks on different workers, Semaphore leases released when
their worker is SIGKILLed or their client process dies, Event, Variable holding a
future, MultiLock, Pub/Sub. Task functions live at module level so that worker
processes import them by name."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from subprocess_env import child_env

from shoal import (
    Client,
    Event,
    LocalCluster,
    Lock,
    MultiLock,
    Pub,
    Queue,
    Semaphore,
    Sub,
    Variable,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two worker processes with two threads each (tasks that wait on each other)."""
    with LocalCluster(n_workers=2, threads_per_worker=2, timeout=60, validate=True) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        c.wait_for_workers(2, timeout=30)
        yield c


# ---------------------------------------------------------------------- task functions


def produce(queue: Queue, n: int) -> int:
    for i in range(n):
        queue.put(i * i)
    return n


def consume(queue: Queue, n: int) -> list[int]:
    return [queue.get(timeout=60) for _ in range(n)]


def in_critical_section(lock: Lock, path: str, tag: int) -> tuple[str, int]:
    """Append enter/exit marks to ``path`` under the lock: they must never interleave."""
    with lock:
        with open(path, "a") as f:
            f.write(f"enter {tag}\n")
        time.sleep(0.05)
        with open(path, "a") as f:
            f.write(f"exit {tag}\n")
    return os.environ.get("SHOAL_WORKER_NAME", ""), os.getpid()


def hold_lease_forever(sem: Semaphore, ready: Event) -> None:
    assert sem.acquire(timeout=30)
    Variable("holder-pid").set(os.getpid())
    ready.set()
    time.sleep(3600)


def wait_for_event(event: Event, timeout: float) -> bool:
    return event.wait(timeout)


def set_event(event: Event) -> bool:
    event.set()
    return True


def make_block(n: int) -> list[int]:
    return list(range(n))


def publish(pub: Pub, n: int) -> int:
    return sum(pub.put(i) for i in range(n))


# ---------------------------------------------------------------------- tests


def test_queue_between_producer_and_consumer_tasks(client: Client) -> None:
    queue = Queue("jobs", maxsize=3)  # smaller than n: the producer blocks on a full queue
    consumer = client.submit(consume, queue, 10, pure=False)
    producer = client.submit(produce, queue, 10, pure=False)
    assert consumer.result(timeout=60) == [i * i for i in range(10)]
    assert producer.result(timeout=60) == 10
    assert queue.qsize() == 0
    with pytest.raises(TimeoutError, match="timed out"):
        queue.get(timeout=0.2)
    queue.put("a")
    queue.put("b")
    assert queue.get(batch=True) == ["a", "b"]
    assert queue.get(batch=True) == []


def test_queue_timeout_is_honoured_promptly(client: Client) -> None:
    queue = Queue(client=client)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 2.0


def test_lock_excludes_tasks_on_different_workers(client: Client, tmp_path: Path) -> None:
    lock = Lock("critical")
    path = tmp_path / "marks"
    futures = client.map(in_critical_section, [lock] * 8, [str(path)] * 8, range(8), pure=False)
    places = {pid for _, pid in client.gather(futures)}
    assert len(places) == 2  # both workers took part
    lines = path.read_text().splitlines()
    assert len(lines) == 16
    for enter, exit_ in zip(lines[::2], lines[1::2]):  # enter i is always followed by exit i
        assert enter.replace("enter", "exit") == exit_
    assert not lock.locked()


def test_lock_acquire_release_and_timeouts(client: Client) -> None:
    a = Lock("plain", client=client)
    b = Lock("plain", client=client)
    assert a.acquire()
    assert a.locked()
    assert not b.acquire(blocking=False)
    start = time.monotonic()
    assert not b.acquire(timeout=0.3)
    assert time.monotonic() - start >= 0.25
    a.release()
    assert b.acquire(timeout=5)
    b.release()
    with pytest.raises(ValueError, match="not acquired"):
        b.release()


def test_semaphore_lease_released_when_its_worker_is_killed() -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as own, Client(own) as c:
        c.wait_for_workers(2, timeout=30)
        sem = Semaphore(max_leases=1, name="one-at-a-time")
        ready = Event("holder-ready")
        holder = c.submit(hold_lease_forever, sem, ready, pure=False)
        assert ready.wait(timeout=30)
        assert sem.get_value() == 1
        assert not sem.acquire(timeout=0.2)
        pid = Variable("holder-pid").get(timeout=5)
        assert pid in {w["pid"] for w in c.scheduler_info()["workers"].values()}
        os.kill(pid, signal.SIGKILL)
        assert sem.acquire(timeout=30)  # the dead worker's lease went with it
        assert sem.get_value() == 1
        sem.release()
        c.cancel([holder])


def test_semaphore_lease_released_when_its_client_process_dies(
    cluster: LocalCluster, client: Client
) -> None:
    env = child_env()
    env.update(cluster.security.to_env())
    sem = Semaphore(max_leases=2, name="two-at-a-time")
    script = (
        "import sys, time\n"
        "from shoal import Client, Semaphore\n"
        "c = Client(sys.argv[1], timeout=30)\n"
        "s = Semaphore(max_leases=2, name='two-at-a-time')\n"
        "assert s.acquire(timeout=30) and s.acquire(timeout=30)\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, client.scheduler_address],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"held"
        assert sem.get_value() == 2
        assert not sem.acquire(timeout=0.2)
        proc.send_signal(signal.SIGKILL)
        assert sem.acquire(timeout=30)
        assert sem.acquire(timeout=5)
        sem.release()
        sem.release()
        with pytest.raises(RuntimeError, match="holds no lease"):
            sem.release()
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_semaphore_instances_must_agree_on_max_leases(client: Client) -> None:
    assert Semaphore(max_leases=2, name="agree").acquire()
    with pytest.raises(ValueError, match="max_leases=2"):
        Semaphore(max_leases=3, name="agree").acquire()


def test_event_wait_and_set_across_tasks(client: Client) -> None:
    event = Event("go")
    assert not event.is_set()
    waiter = client.submit(wait_for_event, event, 60, pure=False)
    time.sleep(0.3)
    assert not waiter.done()
    assert client.submit(set_event, event, pure=False).result(timeout=30)
    assert waiter.result(timeout=30) is True
    assert event.is_set()
    event.clear()
    assert not event.is_set()
    assert event.wait(timeout=0.2) is False


def test_variable_holding_a_future_keeps_its_data(client: Client) -> None:
    var = Variable("block")
    future = client.submit(make_block, 5, key="block-5")
    var.set(future)
    del future  # the client no longer holds it: only the variable does
    time.sleep(0.5)
    got = var.get(timeout=30)
    assert got.key == "block-5"
    assert got.result(timeout=30) == [0, 1, 2, 3, 4]
    var.set(42)
    assert var.get() == 42
    var.delete()
    with pytest.raises(TimeoutError):
        var.get(timeout=0.2)


def test_variable_get_waits_until_set(client: Client) -> None:
    var = Variable("later")
    waiter = client.submit(Variable.get, var, 30, pure=False)
    time.sleep(0.3)
    assert not waiter.done()
    var.set({"x": 1})
    assert waiter.result(timeout=30) == {"x": 1}


def test_multilock_takes_all_or_none(client: Client) -> None:
    ab = MultiLock(["a", "b"], client=client)
    bc = MultiLock(["b", "c"], client=client)
    c_only = MultiLock(["c"], client=client)
    assert ab.acquire()
    assert not bc.acquire(timeout=0.2)  # b is held
    assert c_only.acquire(timeout=5)  # bc gave c back when it failed
    c_only.release()
    ab.release()
    assert bc.acquire(timeout=5)
    bc.release()


def test_pub_sub_reaches_current_subscribers(client: Client) -> None:
    early = Sub("news")
    other = Sub("news")
    reached = client.submit(publish, Pub("news"), 3, pure=False).result(timeout=30)
    assert reached == 6  # 3 messages x 2 subscribers
    late = Sub("news")
    assert [early.get(timeout=10) for _ in range(3)] == [0, 1, 2]
    assert [other.get(timeout=10) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(TimeoutError):
        late.get(timeout=0.2)
    other.close()
    assert Pub("news").put("x") == 2
    assert early.get(timeout=10) == "x"
    assert late.get(timeout=10) == "x"


def test_primitives_on_an_asynchronous_client(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(cluster.scheduler_address, asynchronous=True, timeout=30) as c:
            queue = await Queue("async-jobs", client=c, maxsize=1)
            await queue.put(1)
            with pytest.raises(TimeoutError):
                await queue.put(2, timeout=0.1)  # maxsize 1: full
            assert await queue.get() == 1
            lock = Lock("async-lock", client=c)
            async with lock:
                assert await lock.locked()
            assert not await lock.locked()
            var = Variable("async-var", client=c)
            await var.set(c.submit(make_block, 3, key="async-block"))
            future = await var.get()
            assert await future == [0, 1, 2]
            sub = await Sub("async-topic", client=c)
            assert await Pub("async-topic", client=c).put("hi") == 1
            assert await sub.get(timeout=10) == "hi"
            event = Event("async-event", client=c)
            assert await event.wait(0.1) is False
            await event.set()
            assert await event.wait(5) is True

    asyncio.run(main())


def test_a_future_put_without_another_reference_stays_alive(client: Client) -> None:
    queue = Queue("futures", client=client)
    queue.put(client.submit(make_block, 4, key="block-4"))  # the only reference, dropped
    var = Variable("inline", client=client)
    var.set(client.submit(make_block, 2, key="block-2"))
    time.sleep(0.5)
    assert queue.get(timeout=30).result(timeout=30) == [0, 1, 2, 3]
    assert var.get(timeout=30).result(timeout=30) == [0, 1]
