"""Calling functions outside the task graph, as Dask's Client does:
``run(func, workers=)`` on workers, ``run_on_scheduler(func)`` on the scheduler (only
for a client that proved the cluster token, as plugin registration), and
``upload_file(path)``. A mixin of :class:`~shoal.client.client.Client`."""

from __future__ import annotations

import asyncio
import os
import pickle
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from shoal.comm.connection import Connection
from shoal.comm.pool import ConnectionPool
from shoal.protocol import messages as m

T = TypeVar("T")

ON_ERROR = ("raise", "return", "ignore")


class RemoteMixin:
    asynchronous: bool
    timeout: float
    _conn: Connection | None
    _worker_conns: ConnectionPool

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        async def _info(self, start: int = 0, limit: int = -1) -> m.InfoReply: ...

        def register_plugin(
            self, plugin: Any, name: str | None = None, idempotent: bool | None = None
        ) -> Any: ...

    def run(
        self,
        function: Callable[..., Any],
        *args: Any,
        workers: Any = None,
        wait: bool = True,
        nanny: bool = False,
        on_error: str = "raise",
        **kwargs: Any,
    ) -> Any:
        """Call ``function(*args, **kwargs)`` on every worker (or on ``workers``:
        addresses or names), outside the task graph; returns ``{address: result}``.
        A function with a ``dask_worker`` parameter gets the worker object; a coroutine
        function is awaited; a plain one runs on the worker's event loop (keep it short).
        ``on_error``: "raise" the first exception, "return" it in place of the result,
        or "ignore" (leave that worker out). ``wait=False``: do not wait, return None.
        ``nanny=True`` (run in the nanny process) is not supported."""
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        if nanny:
            raise ValueError(
                "client.run(nanny=True) is not supported: shoal's nannies run no functions"
            )
        if not callable(function):
            raise TypeError(f"run needs a callable, got {type(function).__name__}")
        call = cloudpickle.dumps((function, args, kwargs))

        async def run() -> dict[str, Any] | None:
            addresses = await self._run_targets(workers)
            calls = [self._run_on_worker(a, call) for a in addresses]
            if not wait:
                for c in calls:
                    _detach(asyncio.ensure_future(c))
                return None
            replies = await asyncio.gather(*calls, return_exceptions=True)
            results: dict[str, Any] = {}
            for address, reply in zip(addresses, replies, strict=True):
                value = _outcome(reply, address)
                if isinstance(value, BaseException):
                    if on_error == "raise":
                        raise value
                    if on_error == "ignore":
                        continue
                results[address] = value
            return results

        return run() if self.asynchronous else self._sync(run())

    async def _run_targets(self, workers: Any) -> list[str]:
        infos = (await self._info()).workers
        if workers is None:
            return [w.address for w in infos]
        wanted = [workers] if isinstance(workers, str) else list(workers)
        by_name = {w.name: w.address for w in infos}
        known = {w.address for w in infos}
        addresses = []
        for w in wanted:
            address = w if w in known else by_name.get(w)
            if address is None:
                raise ValueError(f"no worker {w!r} is connected (workers: {sorted(known)})")
            addresses.append(address)
        return addresses

    async def _run_on_worker(self, address: str, call: bytes) -> m.RunReply:
        conn = await self._worker_conns.get(address)
        reply, _ = await conn.request(lambda rid: m.RunFunction(rid, call))
        assert isinstance(reply, m.RunReply)
        return reply

    def run_on_scheduler(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``function(*args, **kwargs)`` in the scheduler process and return its
        result; a ``dask_scheduler`` parameter gets the scheduler object (the server).
        Only for a client that proved the cluster token (``PermissionError`` otherwise),
        as plugin registration: the scheduler unpickles nothing else from clients."""
        if not callable(function):
            raise TypeError(f"run_on_scheduler needs a callable, got {type(function).__name__}")
        call = cloudpickle.dumps((function, args, kwargs))

        async def run() -> Any:
            conn = self._conn
            if conn is None or conn.closed:
                raise RuntimeError("the client is closed")
            reply, _ = await conn.request(lambda rid: m.RunFunction(rid, call))
            assert isinstance(reply, m.RunReply)
            if reply.error_type == "PermissionError":
                raise PermissionError(reply.error)
            value = _outcome(reply, "the scheduler")
            if isinstance(value, BaseException):
                raise value
            return value

        return run() if self.asynchronous else self._sync(run())

    def upload_file(self, filename: str | os.PathLike[str], load: bool = True) -> Any:
        """Send a file to every worker, now and joining later (a worker plugin, as in
        Dask): a ``.py`` module becomes importable (and, with ``load``, is imported or
        reloaded), an ``.egg``/``.zip``/``.whl`` goes on ``sys.path``. Returns what
        ``register_plugin`` does."""
        from shoal.plugins.upload import UploadFile

        return self.register_plugin(UploadFile(filename, load=load))


def _outcome(reply: m.RunReply | BaseException, where: str) -> Any:
    """The result, or the exception to raise or return."""
    if isinstance(reply, BaseException):
        return reply
    if reply.status == "OK":
        return pickle.loads(reply.result)
    try:
        exc = pickle.loads(reply.result)
    except Exception:
        exc = RuntimeError(reply.error)
    if not isinstance(exc, BaseException):
        exc = RuntimeError(reply.error)
    exc.add_note(f"raised by the function run on {where}")
    return exc


_detached: set[asyncio.Future[Any]] = set()


def _detach(task: asyncio.Future[Any]) -> None:
    """Keep a fire-and-forget call alive until done; its failure is nobody's to raise."""
    _detached.add(task)

    def done(t: asyncio.Future[Any]) -> None:
        _detached.discard(t)
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" at exit

    task.add_done_callback(done)
