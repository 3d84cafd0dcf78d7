"""Prometheus /metrics of the scheduler and the workers, on real processes: parsed with
prometheus_client's own parser and checked against what the client is told
(scheduler_info, task_prefixes, has_what), while work is held running and after it;
the bearer token; the worker's HTTP port as the scheduler reports it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import dask
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tasks import wait_for_file

from shoal import Client
from shoal.comm.security import Security
from shoal.server.scheduler import Scheduler
from shoal.server.worker import Worker

pytestmark = pytest.mark.timeout(90)

Spawn = Callable[..., subprocess.Popen[bytes]]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def fetch(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


def scrape(url: str, token: str | None = None) -> Samples:
    status, text = fetch(url, token)
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start_scheduler(spawn: Spawn, tmp_path: Path, *args: str) -> tuple[str, str]:
    """A scheduler process; its address and its /metrics URL (from its scheduler file)."""
    path = tmp_path / "scheduler.json"
    spawn("scheduler", "--port", "0", "--scheduler-file", str(path), "--quiet", *args)
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the scheduler did not start"
        time.sleep(0.05)
    data = json.loads(path.read_text())
    return data["address"], data.get("metrics", "")


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)


def count(*xs: object) -> int:
    return len(xs)


def test_metrics_match_what_the_client_is_told(spawn: Spawn, tmp_path: Path) -> None:
    address, metrics_url = start_scheduler(spawn, tmp_path, "--metrics-address", "127.0.0.1:0")
    assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")
    for i in range(2):  # the default --dashboard-address: a free port on the worker's host
        spawn("worker", address, "--nthreads", "1", "--name", f"w{i}")
    stop = tmp_path / "stop"
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        futures = client.map(wait_for_file, [str(stop)] * 6, pure=False)
        prefix = futures[0].key.rsplit("-", 1)[0]

        # While they run (held until the file exists): every task is placed (two run,
        # others wait their turn), and no count moves until the file appears, so the
        # two views must agree exactly.
        def placed() -> bool:
            states = client.task_prefixes().get(prefix, {}).get("states", {})
            return (
                set(states) <= {"queued", "processing"}
                and states.get("processing", 0) >= 2
                and sum(states.values()) == 6
            )

        wait_until(placed)
        running = scrape(metrics_url)
        states = client.task_prefixes()[prefix]["states"]
        summary = client.scheduler_info()["summary"]
        for state, n in states.items():
            assert (
                value(running, "shoal_scheduler_prefix_tasks", task_prefix_name=prefix, state=state)
                == n
            )
        for state, n in summary["tasks"].items():
            assert value(running, "dask_scheduler_tasks", state=state) == n
        assert value(running, "dask_scheduler_workers", state="busy") == 2

        stop.touch()
        total = client.submit(count, *futures)  # its dependencies travel between workers
        assert total.result(timeout=30) == 6
        info = client.scheduler_info()
        prefixes = client.task_prefixes()
        done = scrape(metrics_url)
        workers = info["workers"]
        assert (
            sum(
                value(done, "dask_scheduler_workers", state=s)
                for s in ("idle", "busy", "paused", "retiring")
            )
            == info["n_workers"]
            == 2
        )
        assert value(done, "dask_scheduler_workers", state="idle") == 2
        assert value(done, "dask_scheduler_clients") == 1
        assert value(done, "shoal_scheduler_threads") == sum(
            w["nthreads"] for w in workers.values()
        )
        assert (
            value(done, "dask_scheduler_tasks", state="memory")
            == info["summary"]["tasks"]["memory"]
            == 7
        )
        for name, counters in prefixes.items():
            labels = {"task_prefix_name": name}
            n_done = counters["states"]["memory"]
            assert (
                value(done, "dask_scheduler_prefix_state_totals_total", state="memory", **labels)
                == n_done
            )
            assert (
                value(done, "shoal_scheduler_tasks_compute_count_total", **labels)
                == counters["duration_count"]
                == n_done
            )
            assert value(
                done, "dask_scheduler_tasks_compute_seconds_total", **labels
            ) == pytest.approx(counters["duration_sum"])
            assert value(done, "dask_scheduler_tasks_output_bytes", **labels) == counters["nbytes"]
        assert (
            value(
                done,
                "dask_scheduler_prefix_state_totals_total",
                task_prefix_name=prefix,
                state="processing",
            )
            >= 6
        )
        assert value(done, "shoal_scheduler_task_stream_records_total") == 7
        assert value(done, "shoal_scheduler_open_connections") == 3  # two workers, one client
        assert value(done, "shoal_scheduler_received_messages_total") > 7
        assert value(done, "shoal_scheduler_sent_bytes_total") > 0
        assert value(done, "shoal_scheduler_event_loop_latency_seconds_count") >= 1

        # Each worker's own port, as the scheduler reports it.
        held = client.has_what()
        incoming = 0.0
        for addr, w in workers.items():
            assert w["http_address"].startswith("http://127.0.0.1:"), w
            assert fetch(w["http_address"] + "/health") == (200, "ok")
            samples = scrape(w["http_address"] + "/metrics")
            assert value(samples, "dask_worker_threads") == w["nthreads"]
            in_memory = value(samples, "dask_worker_tasks", state="memory")
            assert in_memory + value(samples, "dask_worker_tasks", state="disk") == len(held[addr])
            assert value(samples, "shoal_worker_process_memory_bytes") > 0
            incoming += value(samples, "shoal_worker_transfer_incoming_bytes_total")
            # the heartbeat carries the same totals to the scheduler (scheduler_info)
            got = value(samples, "shoal_worker_transfer_incoming_bytes_total")
            wait_until(
                lambda a=addr, g=got: client.scheduler_info()["workers"][a]["transferred_in"] == g
            )
            sent = value(samples, "dask_worker_transfer_outgoing_bytes_total")
            wait_until(
                lambda a=addr, s=sent: client.scheduler_info()["workers"][a]["transferred_out"] >= s
            )
        assert incoming > 0  # the sum fetched the results the other worker held

        # A one-task get by lane (shoal/lanes): counted by the worker that ran it and,
        # from its report, by the scheduler.
        def by_lane() -> bool:
            assert dask.delayed(count)(1, 2).compute(scheduler=client.get) == 2
            return client._lanes.runs > 0

        wait_until(by_lane)
        runs = client._lanes.runs
        assert value(scrape(metrics_url), "shoal_scheduler_lanes") == 1
        wait_until(lambda: value(scrape(metrics_url), "shoal_scheduler_lane_runs_total") == runs)
        worker_runs = sum(
            value(scrape(w["http_address"] + "/metrics"), "shoal_worker_lane_runs_total")
            for w in workers.values()
        )
        assert worker_runs == runs

        # A small graph by lane: one run for the workers, a task each for the scheduler.
        def graph_by_lane() -> bool:
            graph = dask.delayed(count)(dask.delayed(count)(1), dask.delayed(count)(2, 3))
            assert graph.compute(scheduler=client.get) == 2
            time.sleep(0.1)  # (the scheduler shares the prefix's duration every 0.5 s)
            return client._lanes.graph_runs > 0

        wait_until(graph_by_lane)
        graphs = client._lanes.graph_runs
        worker_samples = [scrape(w["http_address"] + "/metrics") for w in workers.values()]
        assert sum(value(s, "shoal_worker_lane_graph_runs_total") for s in worker_samples) == graphs
        assert sum(value(s, "shoal_worker_lane_runs_total") for s in worker_samples) == (
            client._lanes.runs
        )
        assert sum(value(s, "shoal_worker_lane_graphs_stopped_total") for s in worker_samples) == 0
        wait_until(
            lambda: value(scrape(metrics_url), "shoal_scheduler_lane_runs_total")
            == runs + 3 * graphs
        )


def _get(url: str, token: str | None = None) -> int:
    return fetch(url, token)[0]


def test_bearer_token_guards_metrics() -> None:
    async def main() -> None:
        cluster = Security(token="cluster-secret")
        s = await Scheduler(
            security=cluster, metrics_address="127.0.0.1:0", metrics_token="scrape-me"
        ).start()
        # a worker's own port, with a cluster token: the cluster token as bearer
        plain = await Worker(s.address, security=cluster, dashboard_address="127.0.0.1:0").start()
        # with a metrics token too: that one on its port; its /metrics-only site open
        scraped = await Worker(
            s.address,
            security=cluster,
            dashboard_address=":0",
            metrics_address="127.0.0.1:0",
            metrics_token="worker-scrape",
        ).start()
        try:
            url = s.metrics_url + "/metrics"
            answers = await asyncio.to_thread(
                lambda: [
                    _get(url),
                    _get(url, "wrong"),
                    _get(url, "cluster-secret"),
                    _get(url, "scrape-me"),
                    _get(plain.http_address + "/metrics"),
                    _get(plain.http_address + "/metrics", "cluster-secret"),
                    _get(plain.http_address + "/health"),
                    _get(scraped.http_address + "/metrics", "cluster-secret"),
                    _get(scraped.http_address + "/metrics", "worker-scrape"),
                ]
            )
            assert answers == [401, 401, 401, 200, 401, 200, 200, 401, 200]
            metrics_site = scraped._http_sites[1].url + "/metrics"
            status, text = await asyncio.to_thread(fetch, metrics_site, "worker-scrape")
            assert status == 200 and "dask_worker_threads 1.0" in text
            assert await asyncio.to_thread(_get, metrics_site) == 401
        finally:
            await plain.close()
            await scraped.close()
            await s.close()

    asyncio.run(main())


def test_worker_without_http_port_reports_none() -> None:
    async def main() -> None:
        s = await Scheduler().start()
        w = await Worker(s.address).start()  # the Worker class opens no port by default
        try:
            (info,) = s.state.worker_infos()
            assert info.http_address == "" and w.http_address == ""
        finally:
            await w.close()
            await s.close()

    asyncio.run(main())


def test_bad_http_address_is_a_clear_error() -> None:
    for option in ("--dashboard-address", "--metrics-address"):
        proc = subprocess.run(
            [sys.executable, "-m", "shoal", "worker", "tcp://127.0.0.1:1", option, "nowhere"],
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == 2
        err = proc.stderr.decode()
        assert option in err and "not an HTTP address: 'nowhere'" in err
