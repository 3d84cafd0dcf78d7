"""Serving actors on a worker: a client's :class:`~shoal.protocol.messages.ActorCall`
runs a method of (or reads an attribute of) the object an actor task left in this
worker's memory, and the result goes back on the same connection.

Calls run one at a time, in arrival order, on one thread per worker reserved for
actors (Dask's default too): an actor's state needs no lock, and a long call does not
block the worker's event loop nor take a task thread."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import cloudpickle

from shoal.comm.connection import Connection
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.server.worker import Worker


class ActorServer:
    def __init__(self, worker: Worker):
        self.worker = worker
        self._executor: ThreadPoolExecutor | None = None

    def handle(self, conn: Connection, msg: m.ActorCall) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="shoal-actor")
        loop = asyncio.get_running_loop()

        def run() -> None:
            reply = self._call(msg)
            if not loop.is_closed():
                loop.call_soon_threadsafe(conn.send, reply)

        self._executor.submit(run)

    def _call(self, msg: m.ActorCall) -> m.ActorReply:
        state = self.worker.state
        data = state.data if state is not None else {}
        try:
            instance = data[msg.key]
        except KeyError:
            return m.ActorReply(msg.request_id, no_actor=True)
        try:
            if msg.op == "getattr":
                value: Any = getattr(instance, msg.name)
            elif msg.op == "call":
                args, kwargs = cloudpickle.loads(msg.args) if msg.args else ((), {})
                value = getattr(instance, msg.name)(*args, **kwargs)
            else:
                raise ValueError(f"an actor call's op is 'call' or 'getattr', not {msg.op!r}")
            return m.ActorReply(msg.request_id, value=cloudpickle.dumps(value))
        except Exception as e:
            try:
                error = cloudpickle.dumps(e)
            except Exception:  # an exception that cannot be pickled: its text
                error = cloudpickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
            return m.ActorReply(msg.request_id, error=error)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
