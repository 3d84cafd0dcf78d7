"""shoal: a distributed task scheduler for Python.

A scheduler keeps the task graph, workers run tasks and hold results, and a
:class:`Client` submits work and gets :class:`Future` objects back.
"""

from shoal.client.actors import Actor, ActorFuture
from shoal.client.client import Client
from shoal.client.coordination import Event, Lock, MultiLock, Pub, Queue, Semaphore, Sub, Variable
from shoal.client.datasets import fire_and_forget
from shoal.client.futures import CancelledError, Future, as_completed, wait
from shoal.client.performance_report import performance_report
from shoal.client.pins import Pin
from shoal.client.plugins import PluginError
from shoal.client.progress import progress
from shoal.client.task_stream import get_task_stream
from shoal.client.worker_client import get_client, get_worker, rejoin, secede, worker_client
from shoal.comm.security import Security
from shoal.deploy.adaptive import Adaptive
from shoal.deploy.local import LocalCluster
from shoal.plugins import NannyPlugin, SchedulerPlugin, WorkerPlugin
from shoal.protocol.errors import KilledWorker, TaskInterrupted
from shoal.protocol.serialize import SerializationError
from shoal.shuffle import DiskShuffleRefused

__version__ = "0.1.0"

__all__ = [
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
