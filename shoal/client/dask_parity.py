"""Which of Dask's public ``distributed.Client`` methods shoal's Client does not have,
and why (``tests/integration/test_dask_parity.py`` keeps this list exact: a method
implemented, or one Dask adds, fails it until the list is updated)."""

from __future__ import annotations

UNIMPLEMENTED: dict[str, str] = {
    # observability: the dashboard/observability issue
    "profile": "no statistical profiler in workers yet (dashboard issue)",
    "call_stack": "no call-stack capture of running tasks yet (dashboard issue)",
    "get_scheduler_logs": "servers log to their own stderr; no log ring buffer is kept",
    "get_worker_logs": "servers log to their own stderr; no log ring buffer is kept",
    "story": "the core keeps stories per key; no client query for them yet",
    "dump_cluster_state": "no state-dump format defined yet",
    "benchmark_hardware": "not planned: Dask's disk/memory/network micro-benchmarks",
    "get_versions": "every process runs one shoal and the handshake checks the protocol "
    "version; no package-version inventory yet",
    # task output: forwarded by default, every record of every logger
    "forward_logging": "tasks' print, warnings and logging records already reach the client "
    "(Client(forward_output=False) turns it off); no per-logger choice",
    "unforward_logging": "see forward_logging: Client(forward_output=False) for all of it",
    # events and metadata
    "log_event": "clients cannot write to the scheduler's event log yet (plugins can)",
    "subscribe_topic": "no push of event-log topics to clients yet (get_events polls)",
    "unsubscribe_topic": "no push of event-log topics to clients yet (get_events polls)",
    "set_metadata": "no scheduler-side metadata store (use publish_dataset)",
    "get_metadata": "no scheduler-side metadata store (use publish_dataset)",
    # memory management
    "amm": "no Active Memory Manager: spilling, pausing and retirement copies instead",
    "nbytes": "bytes per prefix/group are in task_prefixes()/task_groups(); no per-key query",
    "processing": "no per-worker list of processing keys query (scheduler_info counts them)",
    # lifecycle
    "restart_workers": "restart() restarts every worker; restarting chosen ones is not exposed",
    "register_worker_callbacks": "removed upstream in favour of register_plugin (implemented)",
    "shutdown": "a client does not stop a scheduler it did not start; close() closes its own "
    "LocalCluster",
    "normalize_collection": "persisted collections already carry their futures",
    "start": "a client starts in its constructor (await it when asynchronous)",
    "loop": "the event loop is internal (Client.sync runs coroutines on it)",
}
