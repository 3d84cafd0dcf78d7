"""A worker's task threads: run one task after another and hand results to the loop.

The thread side of :class:`~shoal.server.worker.Worker`: what runs a task (its function
loaded once, its arguments resolved, async tasks on a loop of the thread's own), what a
task may do to its thread (secede, rejoin), and how a batch handed over by the loop is
worked through. Which task runs when is :class:`~shoal.core.worker.state.WorkerState`'s
decision; the loop side (``Worker._execute``) hands the batches over.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from shoal.core.worker.state import ExecuteFailure, ExecuteSuccess, Rejoin, Secede, WorkerState
from shoal.protocol import messages as m
from shoal.protocol.errors import TaskInterrupted
from shoal.protocol.serialize import (
    MSGPACK,
    FunctionCache,
    dumps_exception,
    loads_task_args,
    sizeof,
)
from shoal.protocol.template_plan import TemplatePlan
from shoal.server.fused_chains import with_fast_chains
from shoal.server.inline_results import InlineResults
from shoal.server.interrupt import TaskThreads, ThreadSlot
from shoal.server.output import OutputCollector
from shoal.server.worker_transfer import DESERIALISE_LOCK

if TYPE_CHECKING:
    from shoal.server.worker import Worker

# The task a thread runs: ``worker`` and ``key`` while it runs one, and ``seceded`` once
# it has left the thread count (it then ends with its task; another thread took its slot).
_current = threading.local()


def current_task() -> tuple[Worker, Any] | None:
    """(worker, key) of the task this thread runs, if it runs one."""
    worker = getattr(_current, "worker", None)
    return None if worker is None else (worker, _current.key)


@contextmanager
def running_by_lane(worker: Worker, key: Any) -> Iterator[None]:
    """This thread runs ``key`` for a lane (shoal/lanes): as the worker's task
    (``get_client`` works), but holding no thread slot, so secede and rejoin do
    nothing."""
    _current.worker, _current.key, _current.seceded, _current.lane = worker, key, False, True
    try:
        yield
    finally:
        _current.worker = _current.key = None
        _current.lane = False


def _interrupted(key: Any, e: TaskInterrupted, start: float) -> ExecuteFailure:
    """The result of a task interrupted outside its own ``try`` (or before it started):
    it was cancelled, so this result is dropped."""
    stop = time.time()
    return ExecuteFailure(
        key=key,
        exception=dumps_exception(e),
        traceback="",
        start=start,
        stop=stop,
        stimulus_id=f"task-interrupted-{stop}",
    )


class TaskThreadMixin:
    state: WorkerState | None
    functions: FunctionCache
    _closed: asyncio.Event
    _queue: queue.SimpleQueue[list[tuple[Any, str, m.Payload, list[bool]]] | None]
    _stimulus: itertools.count[int]
    _threads_lock: threading.Lock
    _rejoins: dict[Any, threading.Event]
    _output: OutputCollector | None
    _task_threads: TaskThreads
    _inline_results: InlineResults
    _loaded_functions: dict[str, Any]

    if TYPE_CHECKING:

        def _push_result(self, event: Any) -> None: ...

        def _start_thread(self) -> None: ...

    def secede(self) -> None:
        """On a task thread: leave the thread count, so that another task may start
        (a new thread takes this one's place); this thread ends with its task."""
        key = _current.key
        if _current.seceded or getattr(_current, "lane", False):
            return  # (a lane's task holds no thread slot: running_by_lane)
        _current.seceded = True
        # The tasks queued behind this one in its thread's batch go on elsewhere now:
        # this thread ends with its task, which may wait for them.
        batch, index = getattr(_current, "batch", None), getattr(_current, "index", 0)
        _current.batch = None
        if batch is not None and index + 1 < len(batch):
            self._queue.put(batch[index + 1 :])
        self._push_result(Secede(key, f"secede-{next(self._stimulus)}"))
        if not self._closed.is_set():
            self._start_thread()

    def rejoin(self) -> None:
        """On a seceded task thread: wait for a free slot, then count again."""
        key = _current.key
        if not _current.seceded or self._closed.is_set() or getattr(_current, "lane", False):
            return
        event = threading.Event()
        with self._threads_lock:
            self._rejoins[key] = event
        self._push_result(Rejoin(key, f"rejoin-{next(self._stimulus)}"))
        event.wait()
        # It counts again until its task ends; the thread then ends too (``seceded``
        # stays set), the thread that took its place staying in the pool.

    # ---------------------------------------------------------------- running tasks

    def _run_tasks(self) -> None:
        """A task thread: run one task after another, hand results to the loop."""
        assert self.state is not None
        resolve = self.state.data.__getitem__
        coroutines: list[asyncio.Runner] = []  # this thread's loop for async tasks, once needed
        slot, output = ThreadSlot(), self._output
        while True:
            batch = self._queue.get()
            if batch is None:
                for runner in coroutines:
                    runner.close()
                return
            for index in range(len(batch)):
                _current.batch, _current.index = batch, index
                if not self._run_item(batch[index], resolve, coroutines, slot, output):
                    continue
                # Seceded: another thread has taken this one's place (and the rest of
                # the batch, handed on by secede()).
                _current.batch = None
                for runner in coroutines:
                    runner.close()
                return
            # Nothing of a task (arguments, result) stays referenced here while the thread
            # waits for the next one: the worker may drop or spill it meanwhile.
            batch = _current.batch = None

    def _run_item(
        self,
        item: tuple[Any, str, m.Payload, list[bool]],
        resolve: Any,
        coroutines: list[asyncio.Runner],
        slot: ThreadSlot,
        output: OutputCollector | None,
    ) -> bool:
        """Run one task of a batch; True if its thread has seceded (it then ends)."""
        threads = self._task_threads
        key, func_id, payload, mark = item
        _current.worker, _current.key, _current.seceded = self, key, False
        if output is not None:
            output.begin(key)
        start = time.time()
        try:
            # TaskInterrupted (force-cancel) is raised in this thread only between
            # start and end, and only for this task (see shoal/server/interrupt.py).
            try:
                if not threads.start(key, mark, slot):
                    raise TaskInterrupted("cancelled before it started")
                result = self._run_one(key, func_id, payload, resolve, coroutines)
            except TaskInterrupted as e:  # outside the task's own try
                result = _interrupted(key, e, start)
            if threads.end(key, slot):
                result = _interrupted(key, TaskInterrupted(), start)
        finally:
            _current.worker = _current.key = None
            if output is not None:
                output.end(key)
        self._push_result(result)
        del result
        return bool(_current.seceded)

    def _run_one(
        self,
        key: Any,
        func_id: str,
        payload: m.Payload,
        resolve: Any,
        coroutines: list[asyncio.Runner],
    ) -> ExecuteSuccess | ExecuteFailure:
        get_func = self._function
        start = time.time()
        try:
            func = get_func(func_id)
            if payload.kind == MSGPACK:  # plain values: nothing to import
                args, kwargs = loads_task_args(payload, resolve, get_func)
            else:
                with DESERIALISE_LOCK:
                    args, kwargs = loads_task_args(payload, resolve, get_func)
            value = func(*args, **kwargs)
            if inspect.iscoroutine(value):
                # An async task runs to completion on a loop of this thread's own,
                # so a coroutine that blocks cannot stall the worker's messages.
                if not coroutines:
                    coroutines.append(asyncio.Runner())
                value = coroutines[0].run(value)
            stop = time.time()
            nbytes = sizeof(value)
            return ExecuteSuccess(
                key=key,
                value=value,
                nbytes=nbytes,
                inline=self._inline_results.dumps(key, value, nbytes),
                type_name=type(value).__name__,
                start=start,
                stop=stop,
                stimulus_id=f"task-finished-{stop}",
            )
        except BaseException as e:  # a failing task errs its future, never the worker
            if type(e) is TaskInterrupted and coroutines:  # its loop may hold the coroutine
                for runner in coroutines:
                    runner.close()
                coroutines.clear()
            stop = time.time()
            return ExecuteFailure(
                key=key,
                exception=dumps_exception(e),
                traceback="".join(traceback.format_exception(e)),
                start=start,
                stop=stop,
                stimulus_id=f"task-erred-{stop}",
            )

    def _function(self, fid: str) -> Any:
        """A task function, unpickled once (under DESERIALISE_LOCK), on any thread."""
        fn = self._loaded_functions.get(fid)
        if fn is None:
            with DESERIALISE_LOCK:
                fn = with_fast_chains(self.functions.get(fid))
                if type(fn) is bytes:  # a task-argument template: decoded once, if it can be
                    fn = TemplatePlan.compile(fn, self._function) or fn
                self._loaded_functions[fid] = fn
        return fn
