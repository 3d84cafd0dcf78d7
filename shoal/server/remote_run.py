"""``client.run`` / ``client.run_on_scheduler`` on the receiving side: call a client's
function in this process, outside the task graph, and answer with its result.

As in Dask, a function with a ``dask_worker`` (``dask_scheduler``) parameter gets the
server object there; a plain function runs on the server's event loop (it may read the
server's state without locks, and must be short), a coroutine function is awaited."""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
from typing import Any

import cloudpickle

from shoal.comm.connection import Connection
from shoal.protocol import messages as m

logger = logging.getLogger("shoal.run")

_running: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)

NO_TOKEN = (
    "run_on_scheduler makes the scheduler unpickle and call a client's function, which "
    "it does only for clients that proved the cluster token, and this scheduler has "
    "none: start it with a token (shoal scheduler --token, the SHOAL_TOKEN variable, or "
    "Security(token=...); LocalCluster makes one unless token=False)"
)


def answer(
    conn: Connection,
    msg: m.RunFunction,
    server_keyword: str,
    server: Any,
    allowed: bool = True,
) -> None:
    """Start calling the function of ``msg``; the reply goes to ``conn`` when it is done.
    ``allowed`` False: refused (PermissionError) without unpickling anything."""
    if not allowed:
        conn.send(m.RunReply(msg.request_id, "error", error=NO_TOKEN, error_type="PermissionError"))
        return
    task = asyncio.ensure_future(_call(conn, msg, server_keyword, server))
    _running.add(task)
    task.add_done_callback(_running.discard)


async def _call(conn: Connection, msg: m.RunFunction, server_keyword: str, server: Any) -> None:
    try:
        func, args, kwargs = pickle.loads(msg.call)
        if _accepts(func, server_keyword):
            kwargs = {**kwargs, server_keyword: server}
        result = func(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        reply = m.RunReply(msg.request_id, "OK", cloudpickle.dumps(result))
    except Exception as e:
        reply = m.RunReply(
            msg.request_id, "error", _pickled_exception(e), f"{type(e).__name__}: {e}"
        )
    if not conn.closed:
        conn.send(reply)


def _accepts(func: Any, name: str) -> bool:
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def _pickled_exception(exc: Exception) -> bytes:
    try:
        return cloudpickle.dumps(exc)
    except Exception:
        return cloudpickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
