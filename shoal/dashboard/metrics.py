"""Prometheus ``/metrics`` for the scheduler and the worker (text format, rendered by
``prometheus_client``).

Dask's metric names where Dask has one (``dask_scheduler_*``, ``dask_worker_*``), so
that existing dashboards and alerts keep working; ``shoal_*`` for the rest. Every value
comes from a counter the server keeps as it goes (the core's per-prefix counters, the
connections' :class:`~shoal.comm.traffic.Traffic`, the loop probe, the worker's
transfer totals): a scrape costs O(prefixes + workers), never O(tasks).

Each render uses a registry of its own, never ``prometheus_client.REGISTRY``: several
servers in one process (``LocalCluster(processes=False)``) each report their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)

if TYPE_CHECKING:
    from shoal.comm.traffic import Traffic
    from shoal.server.loop_latency import LoopLatency
    from shoal.server.scheduler import Scheduler
    from shoal.server.worker import Worker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_scheduler_metrics(scheduler: Scheduler) -> bytes:
    """The scheduler's metrics in the Prometheus text format."""
    return _render(_SchedulerCollector(scheduler))


def render_worker_metrics(worker: Worker) -> bytes:
    """A worker's metrics in the Prometheus text format."""
    return _render(_WorkerCollector(worker))


def _render(collector: Any) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


class _SchedulerCollector:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        state = s.state
        yield GaugeMetricFamily(
            "dask_scheduler_clients", "Number of clients connected", value=s.client_count
        )
        workers = GaugeMetricFamily(
            "dask_scheduler_workers",
            "Number of workers known by the scheduler, by state (idle: running nothing)",
            labels=["state"],
        )
        by_state = {"idle": 0, "busy": 0, "paused": 0, "retiring": 0}
        for ws in state.workers.values():  # O(workers)
            if ws.status == "running":
                by_state["busy" if ws.processing else "idle"] += 1
            else:
                by_state[ws.status] = by_state.get(ws.status, 0) + 1
        for name, n in by_state.items():
            workers.add_metric([name], n)
        yield workers
        yield GaugeMetricFamily(
            "shoal_scheduler_threads", "Threads of all workers", value=state.total_threads
        )
        yield GaugeMetricFamily(
            "shoal_scheduler_memory_limit_bytes",
            "Memory limits of all workers summed",
            value=state.total_memory,
        )
        yield GaugeMetricFamily(
            "shoal_scheduler_results_bytes",
            "Bytes of results held by workers (each key once per holder)",
            value=state.total_nbytes,
        )

        counts = state.task_counts
        tasks = GaugeMetricFamily(
            "dask_scheduler_tasks", "Number of tasks known by the scheduler", labels=["state"]
        )
        for name, n in counts.items():
            if name != "forgotten":
                tasks.add_metric([name], n)
        yield tasks
        yield CounterMetricFamily(
            "dask_scheduler_tasks_forgotten",
            "Total number of tasks forgotten (done and no longer wanted)",
            value=counts.get("forgotten", 0),
        )
        yield GaugeMetricFamily(
            "dask_scheduler_task_groups",
            "Number of task groups known by the scheduler",
            value=len(state.groups),
        )
        yield from self._prefixes()
        yield GaugeMetricFamily(
            "shoal_scheduler_pins", "Pins holding workers", value=len(state.pins)
        )
        yield CounterMetricFamily(
            "shoal_scheduler_task_stream_records",
            "Executions recorded in the task stream",
            value=state.task_stream.count,
        )
        yield GaugeMetricFamily(
            "shoal_scheduler_lanes",
            "Lanes open (a client's one-task gets sent straight to a worker)",
            value=len(state.lanes),
        )
        yield CounterMetricFamily(
            "shoal_scheduler_lane_runs",
            "Tasks run by lane, as the workers reported them",
            value=state.lane_runs,
        )
        yield from _loop_metrics("shoal_scheduler", s.loop_latency)
        yield from _traffic_metrics("shoal_scheduler", s.traffic)

    def _prefixes(self) -> Iterator[Metric]:
        prefixes = self.scheduler.state.prefixes.values()  # O(prefixes)
        compute = CounterMetricFamily(
            "dask_scheduler_tasks_compute",
            "Total amount of compute time spent in each prefix",
            labels=["task_prefix_name"],
            unit="seconds",
        )
        measured = CounterMetricFamily(
            "shoal_scheduler_tasks_compute_count",
            "Executions whose duration was measured, per prefix",
            labels=["task_prefix_name"],
        )
        output = GaugeMetricFamily(
            "dask_scheduler_tasks_output",
            "Bytes in memory (each key once) for each prefix",
            labels=["task_prefix_name"],
            unit="bytes",
        )
        entered = CounterMetricFamily(
            "dask_scheduler_prefix_state_totals",
            "Accumulated count of task prefix in each state",
            labels=["task_prefix_name", "state"],
        )
        current = GaugeMetricFamily(
            "shoal_scheduler_prefix_tasks",
            "Tasks of each prefix now in each state",
            labels=["task_prefix_name", "state"],
        )
        for tp in prefixes:
            compute.add_metric([tp.name], tp.duration_sum)
            measured.add_metric([tp.name], tp.duration_count)
            output.add_metric([tp.name], tp.nbytes)
            for name, n in tp.entered.items():
                if n:
                    entered.add_metric([tp.name, name], n)
            for name, n in tp.states.items():
                if n and name != "forgotten":
                    current.add_metric([tp.name, name], n)
        yield from (compute, measured, output, entered, current)


class _WorkerCollector:
    def __init__(self, worker: Worker):
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        ws = w.state
        spill = w.spill_buffer
        tasks = GaugeMetricFamily("dask_worker_tasks", "Number of tasks at worker", labels=["state"])
        if ws is not None:
            counts = ws.task_counts()
            if spill is not None and counts.get("memory"):  # as Dask: those on disk apart
                on_disk = spill.spilled_count
                counts["memory"] -= on_disk
                counts["disk"] = on_disk
            for name, n in counts.items():
                tasks.add_metric([name], n)
        yield tasks
        yield GaugeMetricFamily("dask_worker_threads", "Number of worker threads", value=w.nthreads)
        rss, spilled = w.memory_metrics()
        yield GaugeMetricFamily(
            "shoal_worker_process_memory_bytes", "Resident memory of the process", value=rss
        )
        yield GaugeMetricFamily(
            "shoal_worker_memory_limit_bytes", "The worker's memory limit", value=w.memory_limit
        )
        if spill is not None:  # results are measured only where they can spill
            managed = min(rss, spill.memory_bytes)
            memory = GaugeMetricFamily("dask_worker_memory_bytes", "Memory breakdown", labels=["type"])
            memory.add_metric(["managed"], managed)
            memory.add_metric(["unmanaged"], rss - managed)
            memory.add_metric(["spilled"], spilled)
            yield memory
            yield from _spill_metrics(spill)
        yield from self._transfers()
        yield CounterMetricFamily(
            "shoal_worker_lane_runs",
            "Runs by lane answered (of one task or of a small graph)",
            value=w.lanes.runs,
        )
        yield CounterMetricFamily(
            "shoal_worker_lane_graph_runs",
            "Small graphs run whole by lane and answered",
            value=w.lanes.graph_runs,
        )
        yield CounterMetricFamily(
            "shoal_worker_lane_graphs_stopped",
            "Graphs run by lane that stopped part way (too long or too large) and went "
            "through the scheduler",
            value=w.lanes.graphs_stopped,
        )
        yield CounterMetricFamily(
            "shoal_worker_lane_declined",
            "Runs by lane declined (busy, paused, limited, lane not open, a graph not "
            "known to be short, or stopped part way)",
            value=w.lanes.declined,
        )
        yield from _loop_metrics("shoal_worker", w.loop_latency)
        yield from _traffic_metrics("shoal_worker", w.traffic)

    def _transfers(self) -> Iterator[Metric]:
        w = self.worker
        totals = w.transfers
        if w.state is not None:
            yield GaugeMetricFamily(
                "dask_worker_transfer_incoming_bytes",
                "Total size of open data transfers from other workers",
                value=w.state.incoming_bytes,
            )
        yield CounterMetricFamily(
            "dask_worker_transfer_incoming_count",
            "Total number of data transfers from other workers since the worker was started",
            value=totals.incoming_count,
        )
        yield CounterMetricFamily(
            "shoal_worker_transfer_incoming",
            "Total size of data fetched from other workers since the worker was started",
            value=totals.incoming_bytes,
            unit="bytes",
        )
        yield CounterMetricFamily(
            "dask_worker_transfer_outgoing",
            "Total size of data sent to other workers since the worker was started",
            value=totals.outgoing_bytes,
            unit="bytes",
        )
        yield CounterMetricFamily(
            "dask_worker_transfer_outgoing_count",
            "Total number of data transfers to other workers since the worker was started",
            value=totals.outgoing_count,
        )


def _spill_metrics(spill: Any) -> Iterator[Metric]:
    count = CounterMetricFamily(
        "dask_worker_spill_count",
        "Total number of values written to (disk_write) and read back from (disk_read) disk",
        labels=["activity"],
    )
    count.add_metric(["disk_write"], spill.spill_count)
    count.add_metric(["disk_read"], spill.unspill_count)
    yield count
    yield GaugeMetricFamily(
        "shoal_worker_spilled_keys", "Results on disk now", value=spill.spilled_count
    )


def _loop_metrics(prefix: str, probe: LoopLatency) -> Iterator[Metric]:
    yield SummaryMetricFamily(
        f"{prefix}_event_loop_latency_seconds",
        "How late the event loop ran a timer (busy with something else), summed",
        count_value=probe.count,
        sum_value=probe.total,
    )
    yield GaugeMetricFamily(
        f"{prefix}_event_loop_latency_maximum_seconds",
        "Largest event loop lateness since the previous scrape",
        value=probe.reset_maximum(),
    )


def _traffic_metrics(prefix: str, traffic: Traffic) -> Iterator[Metric]:
    pairs = [
        ("sent_bytes", "Bytes written to connections", traffic.bytes_sent),
        ("received_bytes", "Bytes read from connections", traffic.bytes_received),
        ("sent_frames", "Frames written to connections", traffic.frames_sent),
        ("received_frames", "Frames read from connections", traffic.frames_received),
        ("sent_messages", "Messages written to connections", traffic.messages_sent),
        ("received_messages", "Messages read from connections", traffic.messages_received),
        ("connections_opened", "Connections made, accepted or opened", traffic.opened),
    ]
    for name, doc, value in pairs:
        yield CounterMetricFamily(f"{prefix}_{name}", doc, value=value)
    yield GaugeMetricFamily(
        f"{prefix}_open_connections", "Connections open now", value=traffic.open_connections
    )
