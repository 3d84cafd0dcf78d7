"""client.get_task_stream() and get_task_stream() in Dask's record shape, and
performance_report's HTML file: self-contained, with the block's prefixes and counts."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

import shoal
from shoal import Client, LocalCluster, get_task_stream, performance_report
from shoal.client.task_stream import select

pytestmark = pytest.mark.timeout(90)


def slow_inc(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def fail(x: int) -> int:
    raise ValueError(f"no {x}")


def total(xs: list[int]) -> int:
    return sum(xs)


def test_get_task_stream_records_as_dask(client: Client) -> None:
    before = time.time()
    with get_task_stream(client) as ts:
        assert client.gather(client.map(slow_inc, range(12))) == list(range(1, 13))
        erred = client.submit(fail, 3)
        with pytest.raises(ValueError, match="no 3"):
            erred.result(timeout=30)
    data = ts.data
    assert len(data) == 13
    workers = set(client.scheduler_info()["workers"])
    for r in data:
        assert set(r) >= {"key", "worker", "status", "startstops", "nbytes"}
        assert r["worker"] in workers
        (startstop,) = r["startstops"]
        assert startstop["action"] == "compute"
        assert before - 1 <= startstop["start"] <= startstop["stop"] <= time.time() + 1
    ok = [r for r in data if r["prefix"] == "slow_inc"]
    assert len(ok) == 12 and all(r["status"] == "OK" and r["nbytes"] > 0 for r in ok)
    assert all(r["stop"] - r["start"] >= 0.009 for r in (x["startstops"][0] for x in ok))
    (bad,) = [r for r in data if r["prefix"] == "fail"]
    assert bad["status"] == "error" and bad["key"] == erred.key

    # The client's own query: everything kept, oldest first; the same records in it.
    everything = client.get_task_stream()
    keys = [r["key"] for r in everything]
    assert [r["key"] for r in data] == keys[len(keys) - 13 :]
    assert [r["key"] for r in client.get_task_stream(count=3)] == keys[-3:]
    first = min(r["startstops"][0]["start"] for r in data)  # (kept in the order they ended)
    assert [r["key"] for r in client.get_task_stream(start=first)] == keys[len(keys) - 13 :]
    assert client.get_task_stream(start=first, count=2) == everything[len(keys) - 13 :][:2]
    assert client.get_task_stream(stop=first) == everything[: len(keys) - 13]
    assert client.get_task_stream(start="1h") == everything


def test_task_stream_selection_rejects_bad_arguments(client: Client) -> None:
    with pytest.raises(ValueError, match="count must be >= 0, not -1"):
        client.get_task_stream(count=-1)
    with pytest.raises(ValueError, match="a task stream time"):
        client.get_task_stream(start="yesterday")
    with pytest.raises(TypeError, match="seconds since the epoch"):
        select([], start=[1])  # type: ignore[arg-type]


def test_get_task_stream_uses_the_default_client(client: Client) -> None:
    with client.as_current(), get_task_stream() as ts:
        client.submit(slow_inc, 100).result(timeout=30)
    assert [r["prefix"] for r in ts.data] == ["slow_inc"]


def _report_data(page: str) -> dict:
    match = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_performance_report_file(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    with client.as_current(), performance_report(filename=str(path)):
        futures = client.map(slow_inc, range(30))
        assert client.submit(total, futures).result(timeout=30) == sum(range(1, 31))
        time.sleep(0.4)  # at least one memory sample besides the first and the last
    page = path.read_text()
    # self-contained: no script, style sheet or image fetched from anywhere
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:", page)
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert style.strip() and not re.search(r"@import|url\(", style)
    data = _report_data(page)
    counts = {p["name"]: p["count"] for p in data["prefixes"]}
    assert counts == {"slow_inc": 30, "total": 1}
    inc = next(p for p in data["prefixes"] if p["name"] == "slow_inc")
    assert inc["total"] >= 0.3 and inc["mean"] == pytest.approx(inc["total"] / 30)
    assert len(data["records"]) == 31
    summary = data["summary"]
    info = client.scheduler_info()
    assert summary["workers"] == len(info["workers"]) == 2
    assert summary["scheduler"] == info["address"] and summary["tasks_run"] == 31
    assert summary["version"] == shoal.__version__
    assert len(data["memory"]) >= 3
    assert all(set(s["workers"]) == set(info["workers"]) for s in data["memory"])
    assert all(m > 0 for s in data["memory"] for m in s["workers"].values())
    # the sum fetched what the other worker computed: bytes in equal bytes out
    moved = {t["worker"]: t for t in data["transfers"]}
    assert set(moved) == set(info["workers"])
    assert sum(t["bytes_in"] for t in moved.values()) > 0
    # the calling code, as Dask's: this test's source
    assert "def test_performance_report_file" in data["code"]
    assert "with client.as_current(), performance_report(" in page


def test_performance_report_async(tmp_path: Path) -> None:
    path = tmp_path / "async.html"

    async def main() -> None:
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster:
            async with (
                Client(cluster, asynchronous=True) as client,
                performance_report(filename=str(path), client=client),
            ):
                await client.gather(client.map(slow_inc, range(5)))

    asyncio.run(main())
    data = _report_data(path.read_text())
    assert [(p["name"], p["count"]) for p in data["prefixes"]] == [("slow_inc", 5)]


def test_performance_report_arguments() -> None:
    with pytest.raises(ValueError, match="interval must be positive, not 0"):
        performance_report(interval=0)
    with pytest.raises(ValueError, match="stacklevel must be at least 1, not 0"):
        performance_report(stacklevel=0)
