"""The public surface of ``shoal`` is curated: changing it is a decision, not an accident."""

import shoal

EXPECTED = [
    "Actor",
    "ActorFuture",
    "Adaptive",
    "CancelledError",
    "Client",
    "DiskShuffleRefused",
    "Event",
    "Future",
    "KilledWorker",
    "LocalCluster",
    "Lock",
    "MultiLock",
    "NannyPlugin",
    "Pin",
    "PluginError",
    "Pub",
    "Queue",
    "SchedulerPlugin",
    "Security",
    "Semaphore",
    "SerializationError",
    "Sub",
    "TaskInterrupted",
    "Variable",
    "WorkerPlugin",
    "__version__",
    "as_completed",
    "fire_and_forget",
    "get_client",
    "get_task_stream",
    "get_worker",
    "performance_report",
    "progress",
    "rejoin",
    "secede",
    "wait",
    "worker_client",
]


def test_all_is_pinned():
    assert sorted(shoal.__all__) == EXPECTED


def test_every_public_name_resolves():
    for name in shoal.__all__:
        assert getattr(shoal, name) is not None, name


def test_no_accidental_public_modules():
    # Subpackages are importable, but nothing else leaks into the top-level namespace
    # except modules Python itself binds while importing them.
    public = {n for n in vars(shoal) if not n.startswith("_")}
    modules = {"client", "comm", "core", "deploy", "protocol", "server", "cli", "shuffle"}
    modules |= {"lanes"}  # shoal.lanes: one-task gets straight to a worker
    modules |= {"plugins", "jobqueue"}
    modules |= {"config"}  # shoal.config: dask.config keys under shoal.*
    modules |= {"dashboard"}  # shoal.dashboard: the dashboard, /metrics, performance reports
    assert public - set(shoal.__all__) <= modules
