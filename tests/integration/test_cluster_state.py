"""The cluster summary pushed to subscribed clients, and paged worker lists."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from shoal import Client, LocalCluster
from shoal.protocol.framing import FrameDecoder
from shoal.server.worker import Worker

pytestmark = pytest.mark.timeout(60)


def inc(x: int) -> int:
    return x + 1


def test_summary_is_pushed_and_a_joining_worker_shows_within_an_interval(
    inproc_cluster: LocalCluster,
) -> None:
    with Client(inproc_cluster) as client:
        client.wait_for_workers(2, timeout=10)
        first = client.cluster_summary()
        assert first["workers"] == 2 and first["nthreads"] == 2
        futures = client.map(inc, range(10))
        assert client.gather(futures) == list(range(1, 11))
        deadline = time.monotonic() + 5
        while client.cluster_summary()["tasks"].get("memory") != 10:
            assert time.monotonic() < deadline, client.cluster_summary()
            time.sleep(0.05)
        summary = client.cluster_summary()
        assert summary["version"] > first["version"]
        assert summary["prefixes"]["inc"]["states"] == {"memory": 10}
        assert summary["prefixes"]["inc"]["duration_count"] == 10

        # a third worker joins: pushed within one interval (0.5 s), with no request
        runner = inproc_cluster._runner
        assert runner is not None

        async def add_worker() -> Worker:
            address = inproc_cluster.scheduler_address
            return await Worker(address, 3, name="late", security=inproc_cluster.security).start()

        late = runner.run_sync(add_worker(), 10)
        try:
            joined = time.monotonic()
            while client.cluster_summary()["workers"] != 3:
                assert time.monotonic() - joined < 1.5, "the join was not pushed in time"
                time.sleep(0.02)
            assert client.cluster_summary()["nthreads"] == 5
        finally:
            runner.run_sync(late.close(), 10)


def test_scheduler_info_pages_the_worker_list(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        client.wait_for_workers(2, timeout=10)
        full = client.scheduler_info()
        assert full["n_workers"] == 2 and len(full["workers"]) == 2
        first = client.scheduler_info(n_workers=1)
        second = client.scheduler_info(n_workers=1, start=1)
        assert first["n_workers"] == second["n_workers"] == 2
        assert len(first["workers"]) == len(second["workers"]) == 1
        assert {*first["workers"], *second["workers"]} == set(full["workers"])
        assert client.scheduler_info(n_workers=5, start=2)["workers"] == {}


def test_a_client_that_does_not_subscribe_gets_no_pushes(inproc_cluster: LocalCluster) -> None:
    with (
        Client(inproc_cluster, subscribe=False) as quiet,
        Client(inproc_cluster) as loud,
    ):
        scheduler = inproc_cluster._scheduler
        assert quiet.id not in scheduler._subscribers
        assert loud.id in scheduler._subscribers
        assert loud.cluster_summary()["workers"] == 2  # pushed at once on joining
        assert quiet.cluster_summary() == {}  # nothing pushed
        quiet.wait_for_workers(2, timeout=10)  # works by asking instead
        assert quiet.cluster_summary()["workers"] == 2


def test_task_prefixes_count_tasks_per_state(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        futures = client.map(inc, range(20))
        client.gather(futures)
        prefixes = client.task_prefixes()
        assert prefixes["inc"]["states"] == {"memory": 20}
        assert prefixes["inc"]["duration_count"] == 20
        del futures
        deadline = time.monotonic() + 5
        while "inc" in client.task_prefixes():  # all released: the prefix has no live task
            assert time.monotonic() < deadline
            time.sleep(0.05)


def double(x: int) -> int:
    return 2 * x


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def as_dict(summary: Any) -> dict[str, Any]:
    """A summary with its prefixes by name (a merged delta keeps another order)."""
    fields = msgspec.structs.asdict(summary)
    fields["prefixes"] = {p.name: p for p in summary.prefixes}
    return fields


def test_pushed_deltas_rebuild_the_summary_the_scheduler_has(
    inproc_cluster: LocalCluster,
) -> None:
    """After the first full summary the scheduler pushes only what changed: prefixes
    whose counters moved, and those now gone. A client that joins later starts from the
    full summary the next delta builds on. Each ends up with the scheduler's summary."""
    scheduler = inproc_cluster._scheduler
    pushed: list[Any] = []
    with Client(inproc_cluster) as early:
        conn = scheduler._subscribers[early.id]
        send_frame = conn.send_frame

        def recording(pieces: Any) -> None:
            data = b"".join(bytes(piece) for piece in pieces)
            pushed.extend(msg for frame in FrameDecoder().feed(data) for msg in frame.messages)
            send_frame(pieces)

        conn.send_frame = recording  # type: ignore[method-assign]
        incs = early.map(inc, range(5))
        doubles = early.map(double, range(5))
        early.gather([*incs, *doubles])

        def pushed_states(name: str) -> dict[str, int]:
            return early.cluster_summary()["prefixes"].get(name, {}).get("states", {})

        wait_until(lambda: pushed_states("double") == pushed_states("inc") == {"memory": 5})
        with Client(inproc_cluster) as late:
            n = len(pushed)
            del incs
            wait_until(lambda: "inc" not in {p.name for p in scheduler.state.summary().prefixes})
            truth = scheduler.state.summary()
            for client in (early, late):
                wait_until(lambda c=client: c._summary.version >= truth.version)
                assert as_dict(client._summary) == as_dict(truth)
                assert client.cluster_summary()["tasks"] == {"memory": 5}
        deltas = [msg for msg in pushed[n:] if msg.base >= 0]
        assert deltas and all(msg.prefixes == [] for msg in deltas), deltas  # double: as was
        assert [name for msg in deltas for name in msg.removed] == ["inc"]
