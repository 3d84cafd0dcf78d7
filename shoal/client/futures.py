"""Futures: handles on remote results, plus ``wait`` and ``as_completed``.

A :class:`FutureState` per key is shared by every :class:`Future` of that key. It is
changed only on the client's event loop; other threads wait on a lazily created
``threading.Event`` (no lock on the hot path: the loop writes the status before it
reads the event, a waiter writes the event before it re-reads the status).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from shoal.protocol.messages import Key, Payload
from shoal.protocol.serialize import loads_value

if TYPE_CHECKING:
    from shoal.client.client import Client


class CancelledError(Exception):
    """The future was cancelled, or its client closed, before it finished."""


class FutureState:
    __slots__ = (
        "key",
        "status",
        "inline",
        "who_has",
        "exception",
        "traceback",
        "type_name",
        "_event",
        "_async_waiters",
        "_callbacks",
        "born",
    )

    def __init__(self, key: Key, born: int = 0):
        self.key = key
        self.born = born  # the client's count of cancel calls when this state was made
        self.status = "pending"  # pending | finished | error | cancelled
        # The serialised value, when it came inline with the completion: loaded anew at
        # every result()/gather, so each caller gets an object of its own (as fetched).
        self.inline: Payload | None = None
        self.who_has: list[str] = []  # its holders, as the completion notice said
        self.exception: BaseException | None = None
        self.traceback = ""
        self.type_name = ""
        self._event: threading.Event | None = None
        self._async_waiters: list[asyncio.Future[None]] = []
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self.status != "pending"

    # --- called on the loop ---------------------------------------------------------

    def _wake(self) -> None:
        ev = self._event
        if ev is not None:
            ev.set()
        waiters, self._async_waiters = self._async_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def finish(
        self, inline: Payload | None = None, type_name: str = "", who_has: list[str] | None = None
    ) -> None:
        self.inline, self.type_name, self.who_has = inline, type_name, who_has or []
        self.status = "finished"
        self._wake()

    def set_error(self, exception: BaseException, traceback: str) -> None:
        # (an inline value stays, unused, until the key is released or finishes again:
        # the client counts what it holds, see Client._inline_held)
        self.exception, self.traceback = exception, traceback
        self.who_has = []
        self.status = "error"
        self._wake()

    def cancel(self, reason: str) -> None:
        if self.status in ("pending", "finished"):
            self.exception = CancelledError(f"{self.key!r}: {reason}")
            self.who_has = []
            self.status = "cancelled"
            self._wake()

    def reset(self) -> None:
        """The result was lost and is being recomputed."""
        self.status = "pending"
        self.who_has = []
        if self._event is not None:
            self._event.clear()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop once done (at once if done already)."""
        if self.done():
            callback()
        else:
            self._callbacks.append(callback)

    async def wait_async(self) -> None:
        while not self.done():
            w = asyncio.get_running_loop().create_future()
            self._async_waiters.append(w)
            await w

    # --- called from any thread -----------------------------------------------------

    def inline_value(self) -> tuple[bool, Any]:
        """``(True, value)`` from a fresh load of the inline value of a finished state,
        else ``(False, None)`` (not finished, not inline, or it does not load here: the
        loop's gather then fetches or reports it). Safe from any thread without a lock:
        ``inline`` is read before ``status``, so a payload used here was this key's at
        some moment its state said "finished" (any such payload is its value)."""
        inline = self.inline
        if inline is None or self.status != "finished":
            return False, None
        try:
            return True, loads_value(inline)
        except Exception:
            return False, None

    def wait_sync(self, timeout: float | None) -> bool:
        if self.done():
            return True
        if self._event is None:
            self._event = threading.Event()
        if self.done():
            return True
        return self._event.wait(timeout)


class Future:
    """A remote result that is, or will be, held by a worker."""

    __slots__ = ("key", "client", "_state", "__weakref__")
    __dask_future__ = True  # Dask graphs refer to it by key (as to Dask's own futures)

    def __init__(self, key: Key, client: Client, state: FutureState | None = None):
        self.key = key
        self.client = client
        self._state = client._hold(key, state)

    @property
    def status(self) -> str:
        return self._state.status

    def done(self) -> bool:
        return self._state.done()

    def cancelled(self) -> bool:
        return self._state.status == "cancelled"

    def result(self, timeout: float | None = None) -> Any:
        """The value; re-raises the task's exception with its remote traceback."""
        if self.client.asynchronous:
            return self._result_async(timeout)
        st = self._state
        if not st.wait_sync(timeout):
            raise TimeoutError(f"{self.key!r} not done within {timeout}s")
        found, value = st.inline_value()  # no trip through the client's loop
        if not found:
            value = self.client._sync(self._result_async(timeout))
        self.client._output.reraise([self.key], self.client._states)  # the task's warnings
        return value

    async def _result_async(self, timeout: float | None = None) -> Any:
        (value,) = await self.client._gather_async([self], timeout=timeout)
        if self.client.asynchronous:
            self.client._output.reraise([self.key], self.client._states)
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._state.wait_sync(timeout):
            raise TimeoutError(f"{self.key!r} not done within {timeout}s")
        return self._state.exception if self._state.status == "error" else None

    def traceback(self, timeout: float | None = None) -> str:
        self.exception(timeout)
        return self._state.traceback

    def cancel(self, force: bool = False) -> None:
        """Cancel this future (see :meth:`Client.cancel`; ``force`` interrupts the task
        if it is running)."""
        self.client.cancel([self], force=force)

    def retry(self) -> Any:
        """Run this future's task again if it erred (and the erred tasks it failed
        through); see :meth:`Client.retry`."""
        return self.client.retry([self])

    def add_done_callback(self, fn: Callable[[Future], Any]) -> None:
        """Call ``fn(future)`` in a separate thread once this future is done."""
        client, st = self.client, self._state
        client._call_in_loop(lambda: st.on_done(lambda: client._run_callback(fn, self)))

    def __await__(self) -> Any:
        return self._result_async().__await__()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - cheaper than contextlib.suppress, and runs per future
            self.client._release(self.key)
        except Exception:  # interpreter shutdown, closed loop: nothing left to release
            pass

    def __dask_tokenize__(self) -> Any:
        return ("shoal.Future", self.key)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a shoal Future can be passed as a task argument, but not pickled on its own"
        )

    def __repr__(self) -> str:
        st = self._state
        extra = f", type: {st.type_name}" if st.type_name else ""
        return f"<Future: {st.status}{extra}, key: {self.key!r}>"


class DoneAndNotDoneFutures(NamedTuple):
    done: set[Future]
    not_done: set[Future]


def _futures_of(fs: Any) -> list[Future]:
    if isinstance(fs, Future):
        return [fs]
    if isinstance(fs, dict):
        fs = fs.values()
    return [f for f in fs if isinstance(f, Future)]


def wait(
    fs: Future | Iterable[Future], timeout: float | None = None, return_when: str = "ALL_COMPLETED"
) -> Any:
    """Wait until all (or the first of) ``fs`` are done; returns ``(done, not_done)``.
    With an asynchronous client this returns an awaitable."""
    futures = _futures_of(fs)
    if not futures:
        return DoneAndNotDoneFutures(set(), set())
    client = futures[0].client
    coro = _wait_async(futures, timeout, return_when)
    if client.asynchronous:
        return coro
    return client._sync(coro)


async def wait_states(states: Iterable[FutureState], return_when: str = "ALL_COMPLETED") -> None:
    """Wait on the loop until all (or the first, or the first failed) of ``states`` are
    done: one countdown future fed by done-callbacks, not a task per state."""
    pending = [st for st in set(states) if not st.done()]
    if not pending:
        return
    if return_when == "FIRST_EXCEPTION" and any(st.status == "error" for st in states):
        return
    done = asyncio.get_running_loop().create_future()
    remaining = len(pending)

    def one_done(st: FutureState) -> None:
        nonlocal remaining
        remaining -= 1
        if done.done():
            return
        if (
            remaining == 0
            or return_when == "FIRST_COMPLETED"
            or (return_when == "FIRST_EXCEPTION" and st.status == "error")
        ):
            done.set_result(None)

    for st in pending:
        st.on_done(functools.partial(one_done, st))
    await done


async def _wait_async(futures: list[Future], timeout: float | None, return_when: str) -> Any:
    if return_when not in ("ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION"):
        raise ValueError(f"unknown return_when {return_when!r}")
    states = [f._state for f in futures]
    if not (return_when == "FIRST_COMPLETED" and any(st.done() for st in states)):
        try:
            await asyncio.wait_for(wait_states(states, return_when), timeout)
        except TimeoutError:
            if return_when == "ALL_COMPLETED":
                n = sum(not st.done() for st in states)
                raise TimeoutError(f"{n} futures not done within {timeout}s") from None
    done = {f for f in futures if f.done()}
    return DoneAndNotDoneFutures(done, {f for f in futures if not f.done()})


class as_completed:
    """Iterate over futures in the order they finish; ``add`` more while iterating.

    ``with_results=True`` yields ``(future, result)`` pairs (errors raise unless
    ``raise_errors=False``, which yields the exception as the result)."""

    def __init__(
        self,
        futures: Iterable[Future] = (),
        with_results: bool = False,
        raise_errors: bool = True,
    ):
        self.with_results = with_results
        self.raise_errors = raise_errors
        self._queue: queue.SimpleQueue[Future] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._count = 0
        self._arrived: asyncio.Event | None = None  # wakes ``async for`` (on the loop)
        for f in futures:
            self.add(f)

    def add(self, future: Future) -> None:
        with self._lock:
            self._count += 1
        client, st = future.client, future._state
        client._call_in_loop(lambda: st.on_done(lambda: self._arrive(future)))

    def _arrive(self, future: Future) -> None:  # on the client's loop
        self._queue.put(future)
        if self._arrived is not None:
            self._arrived.set()

    def update(self, futures: Iterable[Future]) -> None:
        for f in futures:
            self.add(f)

    def count(self) -> int:
        with self._lock:
            return self._count

    def is_empty(self) -> bool:
        return self.count() == 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._count == 0:
                raise StopIteration
            self._count -= 1
        future = self._queue.get()
        return self._item(future)

    def _item(self, future: Future) -> Any:
        if not self.with_results:
            return future
        if future.status == "error" and not self.raise_errors:
            return future, future._state.exception
        return future, future.result()

    def next_batch(self, block: bool = True) -> list[Any]:
        """Every future (or pair) that has finished and not been yielded yet; with
        ``block``, wait for at least one (an empty list when none are left)."""
        batch: list[Future] = []
        if block:
            with self._lock:
                if self._count == 0:
                    return []
                self._count -= 1
            batch.append(self._queue.get())
        while True:
            with self._lock:
                if self._count == 0 or self._queue.empty():
                    break
                self._count -= 1
                batch.append(self._queue.get_nowait())
        return [self._item(f) for f in batch]

    def batches(self) -> Iterator[list[Any]]:
        """Iterate over lists of futures (or pairs) as they finish: each list holds
        all that finished since the last one, at least one."""
        while True:
            batch = self.next_batch(block=True)
            if not batch:
                return
            yield batch

    def __aiter__(self) -> as_completed:
        return self

    async def __anext__(self) -> Any:
        with self._lock:
            if self._count == 0:
                raise StopAsyncIteration
            self._count -= 1
        while True:
            try:
                future = self._queue.get_nowait()
                break
            except queue.Empty:
                if self._arrived is None:
                    self._arrived = asyncio.Event()
                self._arrived.clear()
                if self._queue.empty():
                    await self._arrived.wait()
        if self.with_results:
            if future.status == "error" and not self.raise_errors:
                return future, future._state.exception
            return future, await future._result_async()
        return future
