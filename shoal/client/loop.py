"""A background event loop for the synchronous API."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed, asyncio's loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the fastest available loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


async def in_thread(fn: Callable[[], T]) -> T:
    """``await asyncio.to_thread(fn)``, also at interpreter exit (``atexit`` closes
    clients and clusters), when the default executor takes no new work: then in a
    thread of its own, polled."""
    try:
        return await asyncio.to_thread(fn)
    except RuntimeError as e:
        if "after interpreter shutdown" not in str(e) and "after shutdown" not in str(e):
            raise
    call = ThreadCall(fn, "shoal-exit-call")
    while not call.done():
        await asyncio.sleep(0.005)
    return call.result()


class ThreadCall(Generic[T]):
    """``fn()`` started at once in a daemon thread of its own; :meth:`result` waits for
    it and returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], T], name: str):
        self._fn = fn
        self._result: list[T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result.append(self._fn())
        except BaseException as e:
            self._error.append(e)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> T:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._result[0]


class LoopRunner:
    """Runs an event loop in a daemon thread; ``run_sync`` calls into it."""

    def __init__(self, name: str = "shoal-client-loop"):
        self.loop = new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("a synchronous shoal call from inside the client's event loop")
        if self.loop.is_closed() or not self.thread.is_alive():
            coro.close()  # never to run: say so now, rather than wait for it forever
            raise RuntimeError("the client's event loop has stopped: the client is closed")
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop closed just now
            coro.close()
            raise
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop_thread():
            self.thread.join(10)
