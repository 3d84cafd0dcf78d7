"""Interrupting a running task's thread (``client.cancel(futures, force=True)``).

:class:`TaskThreads` knows which task each task thread runs, and raises
:class:`~shoal.TaskInterrupted` in the thread running a given task with
``PyThreadState_SetAsyncExc`` (as Ray's ``cancel(force=False)`` raises
``KeyboardInterrupt``), only while that thread still runs *that* task:

- the worker's event loop marks a task queued before a thread takes it
  (:meth:`TaskThreads.queued`); an interrupt of a queued task makes the thread skip it
  (:meth:`TaskThreads.start` returns False);
- a thread registers the task it starts and unregisters it when it ends, under the same
  lock the interrupter holds while it checks and raises, so the exception can never be
  aimed at the next task of the thread; a raise not yet delivered when the task ends is
  withdrawn (``PyThreadState_SetAsyncExc(thread, NULL)``) in :meth:`TaskThreads.end`,
  and one delivered between the task's own ``try`` and there is caught by the caller.

What it cannot do: the exception is delivered only when the thread next runs Python
bytecode. A thread blocked in C (``time.sleep``, a lock, a socket, a long NumPy call)
sees it only once that call returns; C code that holds the GIL blocks the whole
process (the worker's event loop too). The worker restarts itself through its nanny
when a thread has not returned within the grace period (see ``Worker``).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from shoal.protocol.errors import TaskInterrupted

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class ThreadSlot:
    """One task thread: the task it runs now, if any."""

    __slots__ = ("ident", "key", "running", "interrupted")

    def __init__(self) -> None:
        self.ident = ctypes.c_ulong(threading.get_ident())
        self.key: Any = None
        self.running = False
        self.interrupted = False  # an exception was raised in it for the current task


class TaskThreads:
    """Which thread runs which task; interrupt one. See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[Any, list[bool]] = {}  # key -> its mark: [interrupted]
        self._running: dict[Any, ThreadSlot] = {}  # key -> the thread running it

    def queued(self, key: Any) -> list[bool]:
        """The event loop queues ``key`` for the threads: its mark, to pass along."""
        mark = [False]
        self._queued[key] = mark  # one execution of a key at a time (the core's rule)
        return mark

    def start(self, key: Any, mark: list[bool], slot: ThreadSlot) -> bool:
        """A thread takes ``key``; False if it was interrupted before it started."""
        with self._lock:
            if self._queued.get(key) is mark:
                del self._queued[key]
            if mark[0]:
                return False
            slot.key, slot.running = key, True
            self._running[key] = slot
            return True

    def end(self, key: Any, slot: ThreadSlot) -> bool:
        """The thread's task is over: no interrupt may reach it from now on. True if
        an interrupt was delivered here (the task's result is moot: it was cancelled)."""
        late = False
        while True:
            try:
                with self._lock:
                    if slot.interrupted:  # withdraw it, if not delivered yet
                        _set_async_exc(slot.ident, None)
                        slot.interrupted = False
                    if self._running.get(key) is slot:
                        del self._running[key]
                    slot.key, slot.running = None, False
                return late
            except TaskInterrupted:  # delivered just before it was withdrawn
                late = True

    def interrupt(self, key: Any) -> str:
        """Interrupt the execution of ``key``: "queued" (it will not start), "running"
        (the exception is raised in its thread), or "" (it is over already)."""
        with self._lock:
            mark = self._queued.get(key)
            if mark is not None:
                mark[0] = True
                return "queued"
            slot = self._running.get(key)
            if slot is None or not slot.running or slot.key != key:
                return ""
            if not slot.interrupted:
                slot.interrupted = True
                _set_async_exc(slot.ident, ctypes.py_object(TaskInterrupted))
            return "running"
