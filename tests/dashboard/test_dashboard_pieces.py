"""Pure pieces of the dashboard: deltas, task stream rows, links and addresses."""

from __future__ import annotations

import random
from urllib.parse import parse_qs, urlsplit

import pytest

from shoal.dashboard.auth import NonceRegistry, check_login
from shoal.dashboard.deltas import (
    apply_rows,
    apply_summary,
    rows_delta,
    summary_delta,
    summary_dict,
)
from shoal.dashboard.lanes import Lanes
from shoal.dashboard.links import dashboard_link, format_link, login_link, parse_address
from shoal.protocol import messages as m


def _summary(version: int, prefixes: dict[str, dict[str, int]]) -> m.ClusterState:
    return m.ClusterState(
        version,
        2,
        4,
        100,
        10,
        0,
        {"memory": version},
        [m.PrefixCounts(name, states) for name, states in prefixes.items()],
    )


def test_summary_delta_lists_only_changed_and_removed_prefixes() -> None:
    a = _summary(1, {"inc": {"memory": 1}, "add": {"waiting": 2}, "sum": {"queued": 1}})
    b = _summary(2, {"inc": {"memory": 2}, "add": {"waiting": 2}, "new": {"released": 1}})
    delta = summary_delta(a, b)
    assert delta["base"] == 1 and delta["version"] == 2
    assert [p["name"] for p in delta["prefixes"]] == ["inc", "new"]
    assert delta["removed"] == ["sum"]
    page = apply_summary(apply_summary(None, summary_dict(a)), delta)
    assert page["prefixes"] == apply_summary(None, summary_dict(b))["prefixes"]
    assert page["tasks"] == {"memory": 2}


def test_a_delta_on_another_version_is_refused() -> None:
    a, b, c = (_summary(v, {"inc": {"memory": v}}) for v in (1, 2, 3))
    page = apply_summary(None, summary_dict(a))
    with pytest.raises(ValueError, match="version 2 cannot apply to 1"):
        apply_summary(page, summary_delta(b, c))


def test_rows_delta_round_trips_random_changes() -> None:
    rng = random.Random(5)
    page: dict[str, dict[str, object]] = {}
    before: dict[str, dict[str, object]] = {}
    for _ in range(200):
        now = {
            f"w{i}": {"name": f"w{i}", "cpu": rng.choice([0, 50, 100])}
            for i in range(10)
            if rng.random() < 0.8
        }
        delta = rows_delta(before, now)
        if delta is None:
            assert now == before
        else:
            changed, removed = delta
            assert all(before.get(row["name"]) != row for row in changed)
            apply_rows(page, changed, removed, "name")
        assert page == now
        before = now


def test_lanes_one_per_thread_when_tasks_overlap() -> None:
    lanes = Lanes()
    # Two threads: two overlapping tasks take two rows, the next ones reuse them.
    assert lanes.assign("w1", 0.0, 1.0) == 0
    assert lanes.assign("w1", 0.5, 1.5) == 1
    assert lanes.assign("w1", 1.0, 2.0) == 0  # row 0 free at 1.0
    assert lanes.assign("w1", 1.6, 2.5) == 1
    assert lanes.assign("w2", 0.0, 5.0) == 0  # rows are per worker
    lanes.forget({"w2"})
    assert lanes.assign("w1", 0.0, 1.0) == 0 and len(lanes) == 2


def test_lanes_never_overlap_in_a_row() -> None:
    rng = random.Random(7)
    lanes = Lanes()
    bars: dict[int, list[tuple[float, float]]] = {}
    t = 0.0
    for _ in range(500):  # 4 threads running back to back
        t += rng.random() * 0.3
        start, stop = t, t + rng.random()
        bars.setdefault(lanes.assign("w", start, stop), []).append((start, stop))
    for row in bars.values():
        for (_, stop), (start, _) in zip(row, row[1:]):
            assert start >= stop
    assert len(bars) <= 10


def test_link_template_formats_host_port_and_environment() -> None:
    assert format_link("10.0.0.1", 8787, "{scheme}://{host}:{port}/status") == (
        "http://10.0.0.1:8787/status"
    )
    template = "/user/{JUPYTERHUB_USER}/proxy/{port}/status"
    env = {"JUPYTERHUB_USER": "ada"}
    assert format_link("h", 99, template, env) == "/user/ada/proxy/99/status"
    assert format_link("::1", 1, "http://{host}:{port}/") == "http://[::1]:1/"
    with pytest.raises(ValueError, match="uses {NOPE}"):
        format_link("h", 1, "http://{NOPE}/", {})


def test_link_template_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_DASHBOARD_LINK", "https://proxy/{host}/{port}/status")
    assert dashboard_link("node7", 8787) == "https://proxy/node7/8787/status"


def test_login_link_opens_the_templated_page() -> None:
    link = login_link("/user/ada/proxy/8787/status", "tok", now=1000.0, ttl=60)
    parts = urlsplit(link)
    assert parts.path == "/user/ada/proxy/8787/login"
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert query["next"] == "status" and query["expires"] == "1060"
    check_login("tok", query, 1001.0, NonceRegistry())


def test_parse_dashboard_address() -> None:
    assert parse_address(":8787", "10.1.1.1") == ("10.1.1.1", 8787)
    assert parse_address("8787", "h") == ("h", 8787)
    assert parse_address("0.0.0.0:0", "h") == ("0.0.0.0", 0)
    assert parse_address("[::1]:5", "h") == ("::1", 5)
    with pytest.raises(ValueError, match="no port number"):
        parse_address("localhost:http", "h")
    with pytest.raises(ValueError, match="out of range"):
        parse_address(":70000", "h")


def test_no_web_framework_until_a_dashboard_listens() -> None:
    """aiohttp is imported only when a scheduler opens a dashboard port."""
    import subprocess
    import sys

    code = (
        "import sys, shoal, shoal.server.scheduler, shoal.server.worker, shoal.deploy.local, "
        "shoal.client.client, shoal.dashboard.links, shoal.dashboard.api, shoal.dashboard.push\n"
        "assert 'aiohttp' not in sys.modules, 'aiohttp imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
