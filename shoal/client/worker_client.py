"""Tasks that submit tasks: ``get_client``, ``worker_client``, ``secede`` and ``rejoin``.

Inside a task, :func:`get_client` returns the worker's own Client (one per worker, made
on first use, shared by its tasks, closed with the worker; it does not subscribe to
cluster-state pushes). A task that waits on the tasks it submitted should not hold a
thread meanwhile: :func:`secede` lets another task start in its place, and
:func:`rejoin` waits for a free slot to count again. ``with worker_client() as client``
does both around its block, as in Dask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shoal.client.client import Client
from shoal.client.graph import collections
from shoal.server.worker import current_task


def get_client() -> Client:
    """The worker's Client inside a task; outside one, the default Client (the newest
    that was made the default and is still open), as Dask."""
    task = current_task()
    if task is not None:
        client: Client = task[0].get_client()
        return client
    with collections._default_lock:
        if collections._defaults:
            return collections._defaults[-1]
    raise ValueError("get_client() outside a task needs a default client: create a Client first")


def get_worker() -> Any:
    """The :class:`~shoal.server.worker.Worker` running the current task (``address``,
    ``name``, ``nthreads``, ``local_directory``, ...); ValueError outside a task."""
    return _worker_of("get_worker")


def secede() -> None:
    """Leave the worker's thread count while this task waits on others; another task
    may start meanwhile. Only inside a task; a second call does nothing."""
    _worker_of("secede").secede()


def rejoin() -> None:
    """Wait until the worker has a free thread slot, then count again (after
    :func:`secede`; otherwise it does nothing)."""
    _worker_of("rejoin").rejoin()


@contextmanager
def worker_client(separate_thread: bool = True) -> Iterator[Client]:
    """``get_client()`` for the block; with ``separate_thread`` (the default) the task
    secedes on entry and rejoins on exit, so waiting on futures holds no thread."""
    client = _worker_of("worker_client").get_client()
    if separate_thread:
        secede()
    try:
        yield client
    finally:
        if separate_thread:
            rejoin()


def _worker_of(what: str) -> Any:
    task = current_task()
    if task is None:
        raise ValueError(f"{what}() must be called inside a task running on a worker")
    return task[0]
