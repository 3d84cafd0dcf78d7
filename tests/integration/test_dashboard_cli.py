"""``shoal scheduler`` and its dashboard: the URL printed, a port in use replaced, the
options checked, the warning for an open dashboard beyond loopback."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
from collections.abc import Callable

import pytest

from shoal.dashboard.app import is_loopback
from tests.integration.dashboard_http import request


def _dashboard_url(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    """The URL the scheduler printed, and what it printed before."""
    assert proc.stderr is not None
    before = ""
    for _ in range(20):
        line = proc.stderr.readline().decode()
        match = re.search(r"shoal dashboard at (http://\S+/status)", line)
        if match:
            return match.group(1), before
        before += line
    raise AssertionError(f"the scheduler printed no dashboard URL: {before}")


def test_scheduler_prints_its_dashboard_and_replaces_a_port_in_use(
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    with socket.socket() as taken:  # the configured port is in use (another scheduler's)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn(
            "scheduler",
            "--port",
            "0",
            "--dashboard-address",
            f"127.0.0.1:{port}",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        url, before = _dashboard_url(proc)
        assert "is in use: serving on a free port instead" in before
        assert not url.endswith(f":{port}/status")  # another, free port
        status, _, body = request(url.replace("/status", "/api/v1/summary"))
        assert status == 200 and b'"workers":0' in body
        proc.terminate()
        proc.wait(30)


def test_no_dashboard_and_bad_addresses(spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    proc = spawn(
        "scheduler", "--port", "0", "--no-dashboard", stderr=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"tcp://")  # up, and said nothing of a dashboard
    proc.terminate()
    proc.wait(30)
    assert b"dashboard" not in proc.stderr.read()
    bad = spawn("scheduler", "--dashboard-address", "localhost:http", stderr=subprocess.PIPE)
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and b"has no port number" in err


def test_an_open_dashboard_beyond_loopback_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from shoal import LocalCluster

    with (
        caplog.at_level(logging.WARNING, logger="shoal.dashboard"),
        LocalCluster(
            n_workers=0, processes=False, token=False, dashboard_address="0.0.0.0:0", timeout=30
        ) as cluster,
    ):
        assert cluster.dashboard_link is not None
    assert "has no token: anyone who can reach it sees the cluster" in caplog.text
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("10.0.0.1")
