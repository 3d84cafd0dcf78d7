"""The dashboard's pages in headless Chromium against a real cluster (processes on
loopback): live updates arrive by push, no console errors, a screenshot of each page,
and the token's one-time login."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from shoal import Client, LocalCluster
from tests.browser.browser_tasks import add, fail, slow_inc

PAGES = ("status", "workers", "groups", "events", "system")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=2, token=False, timeout=60) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        yield c


def _dom(page: Any) -> dict[str, str]:
    return page.evaluate(
        """() => ({
            total: document.getElementById("tasks-total").textContent,
            memory: document.querySelector("#state-memory .n")?.textContent ?? "",
            received: document.getElementById("task-stream").dataset.received ?? "0",
            bars: document.getElementById("task-stream").dataset.bars,
        })"""
    )


def test_status_page_updates_live_while_a_workload_runs(
    client: Client, cluster: LocalCluster, open_page: Any
) -> None:
    url = client.dashboard_link
    assert url is not None and url.endswith("/status")
    watched = open_page()
    page = watched.page
    page.goto(url)
    page.wait_for_selector("#state-memory", timeout=15_000)
    futures = client.map(slow_inc, range(300))  # ~4 s on 4 threads
    page.wait_for_function(
        "() => Number(document.getElementById('task-stream').dataset.received || 0) > 0",
        timeout=20_000,
    )
    first = _dom(page)
    time.sleep(1.5)
    second = _dom(page)
    assert first["memory"] != second["memory"]  # tasks per state moved, pushed
    assert int(second["received"]) > int(first["received"])  # new bars in the task stream
    client.gather(futures)
    page.wait_for_function(
        "() => document.querySelector('#progress [data-prefix=\"slow_inc\"] .counts')"
        "?.textContent.startsWith('300 done')",
        timeout=20_000,
    )
    rows = page.locator("#cpu-table tbody tr").count()
    assert rows == 2  # a row per worker, from the workers push
    page.wait_for_function(  # every execution drawn, within the last minute
        "() => Number(document.getElementById('task-stream').dataset.bars) >= 300",
        timeout=10_000,
    )
    watched.screenshot("status")
    assert watched.errors == []


def test_every_page_loads_without_console_errors(
    client: Client, cluster: LocalCluster, open_page: Any
) -> None:
    x = client.submit(slow_inc, 1, 0.0)
    y = client.submit(add, x, 10)
    bad = client.submit(fail, 3)
    assert y.result() == 12
    with pytest.raises(ValueError):
        bad.result()
    base = (client.dashboard_link or "").rsplit("/", 1)[0]
    worker = next(iter(client.scheduler_info()["workers"]))
    targets = {
        **{name: f"{base}/{name}" for name in PAGES},
        "worker": f"{base}/worker?address={quote(worker, safe='')}",
        "task": f"{base}/task?key={quote(str(y.key), safe='')}",
        "task-erred": f"{base}/task?key={quote(str(bad.key), safe='')}",
    }
    ready = {
        "status": "#state-memory",
        "workers": "#workers-table tbody tr",
        "groups": "#groups-table tbody tr",
        "events": "#events-table",
        "system": "#system-now tbody tr",
        "worker": "#worker-info tbody tr",
        "task": "#story tbody tr",
        "task-erred": "#task-error-section:not([hidden])",
    }
    for name, url in targets.items():
        watched = open_page()
        watched.page.goto(url)
        watched.page.wait_for_selector(ready[name], timeout=15_000)
        time.sleep(1.0)  # a push or two, and a redraw
        watched.screenshot(name)
        assert watched.errors == [], (name, watched.errors)
    # What the pages show is what the scheduler holds.
    watched = open_page()
    watched.page.goto(targets["task"])
    watched.page.wait_for_selector("#deps tbody tr", timeout=15_000)
    assert watched.page.locator("#deps tbody tr td a").first.text_content() == str(x.key)
    watched.page.goto(targets["task-erred"])
    watched.page.wait_for_selector("#task-error-section:not([hidden])", timeout=15_000)
    assert watched.page.text_content("#task-error") == "ValueError: bad input 3"
    watched.page.goto(targets["workers"])
    watched.page.wait_for_selector("#workers-table tbody tr", timeout=15_000)
    assert watched.page.locator("#workers-table tbody tr").count() == 2
    watched.page.click("th[data-key='name']")
    watched.page.click("th[data-key='name']")  # descending
    names = watched.page.locator("#workers-table tbody tr td:nth-child(2)").all_text_contents()
    assert names == sorted(names, reverse=True)
    assert watched.errors == []


def test_pages_need_the_token_and_a_login_link_works_once(open_page: Any) -> None:
    with LocalCluster(n_workers=1, timeout=60) as cluster:  # a cluster token
        link = cluster.dashboard_link
        assert link is not None and "/login?" in link
        base = link.split("/login?")[0]
        watched = open_page()
        response = watched.page.goto(f"{base}/status")
        assert response is not None and response.status == 401
        assert "needs the cluster token" in watched.page.text_content("body")
        response = watched.page.goto(link)  # the one-time link: a cookie, then the page
        assert response is not None and response.status == 200
        assert watched.page.url == f"{base}/status"
        watched.page.wait_for_selector("#state-memory", timeout=15_000)
        watched.page.wait_for_function(
            "() => document.querySelectorAll('#cpu-table tbody tr').length === 1",
            timeout=15_000,
        )
        watched.screenshot("status-after-login")
        other = open_page()  # another browser (no cookie) with the same link
        response = other.page.goto(link)
        assert response is not None and response.status == 403
        assert "used already" in other.page.text_content("body")
        response = other.page.goto(f"{base}/workers")
        assert response is not None and response.status == 401
