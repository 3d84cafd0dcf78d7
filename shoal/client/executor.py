"""``client.get_executor(**kwargs)``: the cluster as a ``concurrent.futures.Executor``
(as Dask's ``ClientExecutor``), for code written against the standard library."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.client.client import Client
    from shoal.client.futures import Future


class ClientExecutor(cf.Executor):
    """``submit`` and ``map`` run on the cluster (each call its own task: ``pure=False``,
    plus the keywords given to ``get_executor``, e.g. ``workers``, ``retries``) and
    return ``concurrent.futures.Future`` objects; ``shutdown(wait=True)`` waits for
    them, ``shutdown(cancel_futures=True)`` cancels those not done."""

    def __init__(self, client: Client, **submit_kwargs: Any):
        self._client = client
        self._submit_kwargs = {"pure": False, **submit_kwargs}
        self._futures: set[Future] = set()
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to an executor that was shut down")
            future = self._client.submit(fn, *args, **self._submit_kwargs, **kwargs)
            self._futures.add(future)
        bridge: cf.Future[Any] = cf.Future()
        bridge.set_running_or_notify_cancel()
        future.add_done_callback(lambda f: self._settle(f, bridge))
        return bridge

    def _settle(self, future: Future, bridge: cf.Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)
        if future.status == "finished":
            try:
                bridge.set_result(future.result())
            except BaseException as e:  # the value could not be fetched
                bridge.set_exception(e)
        elif future.status == "cancelled":
            bridge.set_exception(cf.CancelledError(f"{future.key!r} was cancelled"))
        else:
            bridge.set_exception(future.exception() or RuntimeError(future.status))

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        return super().map(fn, *iterables, timeout=timeout, chunksize=chunksize)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            pending = list(self._futures)
        if cancel_futures and pending:
            self._client.cancel(pending)
        elif wait and pending:
            cf.wait([_waitable(f) for f in pending])


def _waitable(future: Future) -> cf.Future[Any]:
    done: cf.Future[Any] = cf.Future()
    future.add_done_callback(lambda _: done.set_result(None))
    return done
