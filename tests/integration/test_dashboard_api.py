"""The dashboard's JSON API, pushes and security against a real scheduler (in this
process's cluster, over loopback HTTP)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from shoal import Client, LocalCluster
from tests.integration.dashboard_http import EventStream, base_of, get_json, request


def inc(x: int) -> int:
    return x + 1


def fail(x: int) -> int:
    raise ValueError(f"bad input {x}")


@pytest.fixture(scope="module")
def open_cluster() -> Iterator[LocalCluster]:
    """No token: the dashboard is open, as Dask's."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, token=False, timeout=30
    ) as c:
        yield c


@pytest.fixture
def client(open_cluster: LocalCluster) -> Iterator[Client]:
    with Client(open_cluster, timeout=30) as c:
        yield c


def test_api_values_equal_scheduler_info_and_task_groups(client: Client) -> None:
    base = base_of(client.dashboard_link or "")
    futures = client.map(inc, range(30))
    assert client.gather(futures) == list(range(1, 31))
    info = client.scheduler_info()
    summary = get_json(f"{base}/api/v1/summary")
    assert summary["workers"] == info["n_workers"] == 2
    assert summary["scheduler"]["address"] == info["address"]
    assert summary["tasks"] == client.sync(client._info, 0, 0).summary.tasks
    workers = get_json(f"{base}/api/v1/workers")
    assert workers["total"] == 2
    by_address = {w["address"]: w for w in workers["workers"]}
    assert set(by_address) == set(info["workers"])
    for address, expected in info["workers"].items():
        got = by_address[address]
        for field in ("name", "nthreads", "memory_limit", "nbytes", "tasks_run", "status"):
            assert got[field] == expected[field], field
    groups = get_json(f"{base}/api/v1/groups")
    expected_groups = client.task_groups()
    assert [g["name"] for g in groups["groups"]] == list(expected_groups)
    for g in groups["groups"]:
        assert g["states"] == expected_groups[g["name"]]["states"]
    prefixes = get_json(f"{base}/api/v1/prefixes")
    inc_row = next(p for p in prefixes["prefixes"] if p["name"] == "inc")
    assert inc_row["states"]["memory"] >= 30
    page = get_json(f"{base}/api/v1/workers?start=1&limit=1")
    assert [w["address"] for w in page["workers"]] == [workers["workers"][1]["address"]]


def test_task_page_and_task_stream(client: Client) -> None:
    base = base_of(client.dashboard_link or "")
    cursor = get_json(f"{base}/api/v1/task-stream?limit=1")["cursor"]
    ok = client.submit(inc, 1)
    bad = client.submit(fail, 7)
    assert ok.result() == 2
    with pytest.raises(ValueError):
        bad.result()
    task = get_json(f"{base}/api/v1/tasks/{quote(str(ok.key))}")
    assert task["state"] == "memory" and task["prefix"] == "inc"
    assert task["who_has"] == client.who_has([ok])[ok.key]
    assert [e[1:3] for e in task["story"]][-1] == ["processing", "memory"]
    erred = get_json(f"{base}/api/v1/tasks/{quote(str(bad.key))}")
    assert erred["state"] == "erred" and erred["error"] == "ValueError: bad input 7"
    assert "Traceback" in erred["traceback"] and "fail" in erred["traceback"]
    stream = get_json(f"{base}/api/v1/task-stream?cursor={cursor}")
    assert {r["key"] for r in stream["records"]} == {ok.key, bad.key}
    statuses = {r["key"]: r["status"] for r in stream["records"]}
    assert statuses == {ok.key: "memory", bad.key: "erred"}
    assert stream["cursor"] == cursor + 2


def test_worker_page_events_and_system(client: Client, open_cluster: LocalCluster) -> None:
    base = base_of(client.dashboard_link or "")
    address = next(iter(client.scheduler_info()["workers"]))
    deadline = time.monotonic() + 10
    while True:  # heartbeats every 0.5 s fill its history
        worker = get_json(f"{base}/api/v1/workers/{quote(address, safe='')}")
        if len(worker["history"]) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert worker["address"] == address and len(worker["history"]) >= 2
    assert worker["history"][-1]["memory"] > 0 and worker["memory"] > 0
    # In-process workers share one process: none pauses or is restarted for memory.
    assert worker["memory_pause"] is None and worker["memory_terminate"] is None
    state = open_cluster.scheduler.state  # on the cluster's loop, as an adaptive decision
    open_cluster._runner.loop.call_soon_threadsafe(state.log_event, "adaptive", {"action": "up"})
    while not client.get_events("adaptive"):
        time.sleep(0.05)
    events = get_json(f"{base}/api/v1/events?topic=adaptive")
    assert events["events"]["adaptive"][0]["data"] == {"action": "up"}
    assert events["events"]["adaptive"] == [
        {"time": t, "data": d} for t, d in reversed(client.get_events("adaptive"))
    ]
    system = get_json(f"{base}/api/v1/system")
    assert system["latest"]["memory"] > 0 and system["latest"]["connections"] >= 3
    assert len(system["history"]) >= 1


def test_errors_are_clear_and_nothing_but_get_is_allowed(client: Client) -> None:
    base = base_of(client.dashboard_link or "")
    status, _, body = request(f"{base}/api/v1/workers/tcp%3A%2F%2Fnowhere%3A1")
    assert status == 404 and "no worker 'tcp://nowhere:1'" in json.loads(body)["error"]
    status, _, body = request(f"{base}/api/v1/tasks/never-submitted")
    assert status == 404 and "no task 'never-submitted'" in json.loads(body)["error"]
    status, _, body = request(f"{base}/api/v1/workers?limit=abc")
    assert status == 400 and "'limit' must be an integer" in json.loads(body)["error"]
    status, _, body = request(f"{base}/api/v1/stream?topics=nope")
    assert status == 400 and "unknown topics nope" in json.loads(body)["error"]
    for method in ("POST", "PUT", "DELETE"):
        status, headers, _ = request(f"{base}/api/v1/summary", method=method)
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, _ = request(f"{base}/status")
    assert status == 200 and "default-src 'self'" in headers["Content-Security-Policy"]


def test_pushes_are_deltas_encoded_once_for_every_page(
    client: Client, open_cluster: LocalCluster
) -> None:
    base = base_of(client.dashboard_link or "")
    hub = open_cluster.scheduler.dashboard.hub
    url = f"{base}/api/v1/stream?topics=summary,task-stream"
    pages = [EventStream(url) for _ in range(3)]
    try:
        snapshots = [dict((e[0], e[1]) for e in (p.next_event(), p.next_event())) for p in pages]
        versions = {s["summary"]["version"] for s in snapshots}
        assert len(versions) == 1 and all(s["summary"]["base"] == -1 for s in snapshots)
        encodes = hub.encodes
        futures = client.map(inc, range(100, 140))
        client.gather(futures)
        keys = {f.key for f in futures}
        received = []
        for page in pages:
            seen: set[str] = set()

            def done(event: tuple[str, object, bytes], seen: set[str] = seen) -> bool:
                topic, data, _ = event
                if topic == "task-stream":
                    seen.update(r["key"] for r in data["records"])  # type: ignore[index]
                return keys <= seen

            received.append(page.events_until(done))
        # Every page got the same bytes: one encoding per topic per tick.
        shortest = min(len(r) for r in received)
        assert all(r[:shortest] == received[0][:shortest] for r in received)
        assert hub.encodes - encodes >= shortest  # (ticks after the last one read count too)
        deltas = [e[1] for e in received[0] if e[0] == "summary"]
        assert deltas and deltas[0]["base"] == versions.pop()
        for before, after in zip(deltas, deltas[1:]):
            assert after["base"] == before["version"]  # a chain of deltas, none missed
        lanes = [r["lane"] for e in received[0] if e[0] == "task-stream" for r in e[1]["records"]]
        assert set(lanes) <= {0}  # one thread per worker: one row each
    finally:
        for page in pages:
            page.close()


def test_an_idle_scheduler_pushes_nothing(client: Client, open_cluster: LocalCluster) -> None:
    base = base_of(client.dashboard_link or "")
    hub = open_cluster.scheduler.dashboard.hub
    page = EventStream(f"{base}/api/v1/stream?topics=summary,task-stream", timeout=2)
    try:
        page.next_event(), page.next_event()  # the snapshots
        time.sleep(1.5)  # what the snapshot's version missed (the client's last release)
        encodes = hub.encodes
        time.sleep(2.5)  # five ticks, nothing happening
        assert hub.encodes == encodes
    finally:
        page.close()


def test_token_guards_every_page_and_a_link_works_once() -> None:
    with LocalCluster(n_workers=1, processes=False, timeout=30) as cluster:  # a token
        link = cluster.dashboard_link
        assert link is not None and "/login?" in link
        base = base_of(link)
        for path in (
            "/status",
            "/workers",
            "/api/v1/summary",
            "/api/v1/stream",
            "/static/shoal.js",
        ):
            status, _, body = request(f"{base}{path}")
            assert status == 401, path
            assert b"needs the cluster token" in body and b"nthreads" not in body
        status, headers, _ = request(f"{base}/api/v1/summary", cookie="shoal-dashboard-1=x")
        assert status == 401  # another dashboard's cookie is no cookie here
        port = link.split(":")[2].split("/")[0]
        status, _, body = request(f"{base}/api/v1/summary", cookie=f"shoal-dashboard-{port}=a.1.b")
        assert status == 403 and b"invalid session cookie" in body
        status, headers, _ = request(link)
        assert status == 302 and headers["Location"] == "status"
        cookie_header = headers["Set-Cookie"]
        assert "HttpOnly" in cookie_header and "SameSite=Strict" in cookie_header
        cookie = cookie_header.split(";")[0]
        summary = get_json(f"{base}/api/v1/summary", cookie=cookie)
        assert summary["workers"] == 1
        status, _, _ = request(f"{base}/status", cookie=cookie)
        assert status == 200
        status, _, body = request(link)  # the same link again
        assert status == 403 and b"used already" in body
        forged = link.replace("nonce=", "nonce=x")
        status, _, body = request(forged)
        assert status == 403 and b"signature" in body


def test_no_dashboard_when_turned_off() -> None:
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None, timeout=30) as c:
        assert c.dashboard_link is None
        with Client(c, timeout=30) as client:
            assert client.dashboard_link is None and "dashboard=" not in repr(client)
