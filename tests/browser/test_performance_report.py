"""The performance report opened in a real browser (Debian's headless Chromium, driven
by playwright): its script renders the block's prefixes and task counts into the page,
the task stream and memory charts are drawn, and nothing is logged as an error. A
screenshot goes to artifacts/screenshots/performance_report.png (fixtures: conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shoal import Client, LocalCluster, performance_report

pytestmark = pytest.mark.timeout(120)

def square(x: int) -> int:
    time.sleep(0.005)
    return x * x


def fail(x: int) -> int:
    raise ValueError(x)


def total(xs: list[int]) -> int:
    return sum(xs)


def test_report_renders_in_chromium(open_page: Any, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=False) as cluster,
        Client(cluster) as client,
        performance_report(filename=str(path), client=client),
    ):
        futures = client.map(square, range(24))
        assert client.submit(total, futures).result(timeout=30) == sum(x * x for x in range(24))
        bad = client.map(fail, range(3))
        client.gather(bad, errors="skip")
    watched = open_page()
    page = watched.page
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-rendered=true]", timeout=10_000)

    rows = page.eval_on_selector_all(
        "#prefixes tr[data-prefix]",
        "rows => rows.map(r => [r.dataset.prefix, r.querySelector('.count').textContent,"
        " r.querySelector('.erred').textContent])",
    )
    assert sorted(rows) == [["fail", "3", "3"], ["square", "24", "0"], ["total", "1", "0"]]
    assert page.text_content("#summary td[data-field=tasks_run]") == "28"
    assert page.text_content("#summary td[data-field=tasks_erred]") == "3"
    assert page.text_content("#summary td[data-field=workers]") == "2"
    # one bar per execution, coloured per prefix; a line per worker in the memory chart
    bars = page.eval_on_selector_all(
        "#task-stream rect.task", "bars => bars.map(b => b.dataset.prefix)"
    )
    assert sorted(set(bars)) == ["fail", "square", "total"] and len(bars) == 28
    assert len(page.query_selector_all("#memory polyline")) == 2
    assert len(page.query_selector_all("#transfers tr[data-worker]")) == 2
    assert "performance_report(filename=str(path), client=client)" in page.text_content("#code")
    assert watched.errors == []
    assert requests == [path.as_uri()]  # nothing fetched but the file itself
    watched.screenshot("performance_report")
