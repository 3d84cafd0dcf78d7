"""Actors on real processes: a counter incremented from the client and from several
tasks, attribute reads straight from its worker, errors raised by methods, and the pin:
retire_workers refuses the actor's worker until the actor is released. Classes and
task functions live at module level so that worker processes import them by name."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Iterator

import pytest

from shoal import Actor, ActorFuture, Client, LocalCluster

pytestmark = pytest.mark.timeout(120)


class Counter:
    def __init__(self, start: int = 0):
        self.n = start
        self.pid = os.getpid()

    def increment(self, by: int = 1) -> int:
        self.n += by
        return self.n

    def fail(self) -> None:
        raise KeyError("no such thing")


def bump(counter: Actor, times: int) -> int:
    """A task calling the actor it took as an argument."""
    return max(counter.increment().result(timeout=30) for _ in range(times))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=2, timeout=60, validate=True) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        c.wait_for_workers(2, timeout=30)
        yield c


def test_counter_incremented_from_the_client_and_from_tasks(client: Client) -> None:
    future = client.submit(Counter, 10, actor=True)
    counter = future.result(timeout=30)
    assert isinstance(counter, Actor) and counter.key == future.key
    call = counter.increment(5)
    assert isinstance(call, ActorFuture)
    assert call.result(timeout=30) == 15
    assert counter.n == 15  # an attribute read, from the worker
    workers = client.scheduler_info()["workers"]
    assert counter.pid == workers[counter.worker]["pid"]  # it lives on that worker
    assert counter.pid != os.getpid()
    tasks = client.map(bump, [counter] * 4, [5] * 4, pure=False)
    assert max(client.gather(tasks)) == 35  # 20 increments, none lost
    assert counter.n == 35


def test_method_errors_reach_the_caller(client: Client) -> None:
    counter = client.submit(Counter, actor=True).result(timeout=30)
    with pytest.raises(KeyError, match="no such thing"):
        counter.fail().result(timeout=30)
    with pytest.raises(AttributeError):
        counter.missing_attribute  # noqa: B018 - the read is the test
    assert counter.increment().result(timeout=30) == 1  # the actor lives on


def test_map_makes_one_actor_per_element(client: Client) -> None:
    futures = client.map(Counter, [1, 2, 3], actor=True)
    actors = [f.result(timeout=30) for f in futures]
    assert [a.increment().result(timeout=30) for a in actors] == [2, 3, 4]
    assert len({a.key for a in actors}) == 3


def test_actor_class_required(client: Client) -> None:
    with pytest.raises(TypeError, match="needs a class"):
        client.submit(len, [1], actor=True)


def test_the_actors_worker_cannot_retire_until_it_is_released(cluster: LocalCluster) -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as own, Client(own) as c:
        c.wait_for_workers(2, timeout=30)
        future = c.submit(Counter, actor=True)
        counter = future.result(timeout=30)
        holder = counter.worker
        (other,) = [a for a in c.scheduler_info()["workers"] if a != holder]
        refused = c.retire_workers([holder])
        assert refused["retired"] == []
        assert "holds an actor" in refused["refused"][holder]
        assert counter.increment().result(timeout=30) == 1  # still there
        del counter, future
        gc.collect()
        deadline = time.monotonic() + 30
        while c.scheduler_info()["workers"][holder]["pins"]:
            assert time.monotonic() < deadline, "the actor's pin did not go"
            time.sleep(0.1)
        result = c.retire_workers([holder])
        assert result["retired"] == [holder]
        assert list(c.scheduler_info()["workers"]) == [other]


def test_actors_on_an_asynchronous_client(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(cluster.scheduler_address, asynchronous=True, timeout=30) as c:
            counter = await c.submit(Counter, 1, actor=True)
            assert await counter.increment(2) == 3
            assert await counter.increment(2).result(timeout=30) == 5
            assert await counter.n == 5

    asyncio.run(main())
