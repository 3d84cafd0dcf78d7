"""Cluster membership and heartbeats: liveness, a worker's status, workers leaving,
exiting, retired, closed or restarted.
"""

from __future__ import annotations

from shoal.protocol.message_families.base import (
    Message,
)


class Heartbeat(Message):
    """Worker or client -> scheduler, every ``interval`` seconds: I am alive. A worker
    adds its process memory, its spilled bytes and how many tasks it is running."""

    request_id: int
    memory: int = 0
    spilled: int = 0
    executing: int = 0
    # A worker's totals of dependency bytes fetched from / sent to peers since it started.
    transferred_in: int = 0
    transferred_out: int = 0
    # For the dashboard: process CPU (percent of one core), the host's network bytes/s
    # in and out since the previous beat, and the memory fractions at which it pauses
    # and its nanny restarts it (None: off).
    cpu: float = 0.0
    net_in: float = 0.0
    net_out: float = 0.0
    memory_pause: float | None = None
    memory_terminate: float | None = None


class HeartbeatReply(Message):
    """Scheduler -> sender: the scheduler is alive too, and when to beat next (the
    interval grows with the size of the cluster)."""

    request_id: int
    interval: float


class WorkerStatus(Message):
    """Worker -> scheduler: "paused" (memory over the pause fraction: start nothing new,
    assign it nothing new) or "running" again."""

    status: str
    stimulus_id: str = ""


class WorkerExited(Message):
    """Nanny -> scheduler: the worker it supervises exited (or was killed)."""

    address: str
    name: str
    reason: str
    restarting: bool = False
    stimulus_id: str = ""


class WorkerLeaving(Message):
    """Worker -> scheduler: this worker is going away on its own (SIGTERM, a restart it
    wants). ``retire``: copy the results only it holds to other workers first; else
    remove it at once. Either way its running tasks go elsewhere, nothing counts as a
    failure, and the scheduler answers ``CloseWorker`` once it is done with it."""

    reason: str
    retire: bool = True
    stimulus_id: str = ""
    # Its lifetime or task budget is over: while no other worker can take its results,
    # it waits (given no task, still a home for others' results) instead of losing them.
    walltime: bool = False


class RetireWorkers(Message):
    """Client -> scheduler: retire these workers (addresses or names) gracefully.
    A pinned worker is refused unless ``ignore_pins`` (then it leaves its pins)."""

    request_id: int
    workers: list[str]
    close: bool = True
    ignore_pins: bool = False


class RetireReply(Message):
    request_id: int
    retired: list[str]
    refused: dict[str, str] = {}  # worker -> why it was kept


class CloseWorker(Message):
    """Scheduler -> worker: close now (after retirement); the nanny does not restart it."""

    reason: str
    stimulus_id: str = ""


class RestartRequest(Message):
    """Client -> scheduler (``client.restart``): cancel every client's futures and drop
    datasets and fire-and-forget keys; answered with :class:`Ack` (the client then has
    the workers restart through their nannies)."""

    request_id: int
    stimulus_id: str = ""
