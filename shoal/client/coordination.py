"""Coordination primitives held by the scheduler, with Dask's API: :class:`Lock`,
:class:`Semaphore`, :class:`MultiLock`, :class:`Event`, :class:`Variable`,
:class:`Queue`, :class:`Pub` and :class:`Sub`.

Each takes ``name=`` (instances with one name share one primitive, in any client or
task) and ``client=`` (by default ``get_client()``: inside a task, the worker's
client). On an asynchronous client every method returns an awaitable. They pickle by
name, so a task may take one as an argument.

Values are pickled by the client and stay opaque bytes on the scheduler; a
:class:`~shoal.client.futures.Future` is stored as its key, and the scheduler keeps its
data alive while a primitive holds it. Leases (Lock, Semaphore) belong to the client
that took them, and go when it leaves (a task's leases: when its worker dies).

Publish/subscribe goes through the scheduler (Dask sends worker to worker directly):
one hop more, but one connection per client and the same rules as the rest. A
subscriber receives what is published after it subscribed.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle

from shoal.client.futures import Future
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.client.client import Client


def _client(client: Client | None) -> Client:
    if client is not None:
        return client
    from shoal.client.worker_client import get_client

    return get_client()


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ValueError(f"a timeout is a number of seconds >= 0 or None, not {timeout!r}")
    return float(timeout)


class _Primitive:
    kind = ""

    def __init__(self, name: str | None, client: Client | None):
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"a {self.kind}'s name is a non-empty str, not {name!r}")
        self.name = name or f"{self.kind}-{uuid.uuid4().hex}"
        self.client = _client(client)

    def _call(self, op: str, hold: Any = None, **fields: Any) -> Any:
        """``op`` on the scheduler: the reply (awaitable on an asynchronous client).
        ``hold``: a future whose key is sent, kept alive until the scheduler holds it
        (``var.set(client.submit(...))`` drops the only reference at once)."""
        return self.client._run(self._request(op, hold, **fields))

    async def _request(self, op: str, hold: Any = None, **fields: Any) -> m.CoordinateReply:
        client = self.client
        conn = client._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        sid = f"{self.kind}-{op}-{client.id}"
        # Messages queued before this one (the submission of a future being stored)
        # must reach the scheduler first.
        client._flush_outbox()
        reply, _ = await conn.request(
            lambda rid: m.Coordinate(rid, self.kind, self.name, op, stimulus_id=sid, **fields)
        )
        assert isinstance(reply, m.CoordinateReply)
        if reply.error:
            raise ValueError(reply.error)
        return reply

    def _then(self, reply: Any, then: Any) -> Any:
        """``then(reply)``, after awaiting it on an asynchronous client."""
        if not self.client.asynchronous:
            return then(reply)

        async def chained() -> Any:
            return then(await reply)

        return chained()

    def _encode(self, value: Any) -> dict[str, Any]:
        if isinstance(value, Future):
            return {"key": value.key, "hold": value}
        return {"value": cloudpickle.dumps(value)}

    def _decode(self, value: bytes | None, key: Any) -> Any:
        if key is not None:
            future = Future(key, self.client)
            # The scheduler made this client want the key already; asking again makes it
            # send the key's state now that the future exists to receive it.
            self.client._send(m.WantKeys([key], stimulus_id=f"{self.kind}-get"))
            return future
        assert value is not None
        return cloudpickle.loads(value)

    def __await__(self) -> Any:
        """``await Primitive(...)`` on an asynchronous client: the primitive, ready."""

        async def ready() -> _Primitive:
            await self._setup()
            return self

        return ready().__await__()

    async def _setup(self) -> None:
        """What a synchronous client does in ``__init__`` (create, subscribe)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name}>"


# ---------------------------------------------------------------------- locks, semaphores


class Semaphore(_Primitive):
    """At most ``max_leases`` holders at a time, across the cluster. ``acquire``
    returns True once a lease is held (False on timeout); ``release`` gives back this
    instance's oldest lease. Every instance of one name must give the same
    ``max_leases``. A lease is held until released or until its client leaves."""

    kind = "semaphore"

    def __init__(self, max_leases: int = 1, name: str | None = None, client: Client | None = None):
        if isinstance(max_leases, bool) or not isinstance(max_leases, int) or max_leases < 1:
            raise ValueError(f"max_leases is an int >= 1, not {max_leases!r}")
        self.max_leases = max_leases
        super().__init__(name, client)
        self._leases: deque[str] = deque()

    def acquire(self, timeout: float | None = None) -> Any:
        token = uuid.uuid4().hex
        reply = self._call(
            "acquire", token=token, number=self.max_leases, timeout=_check_timeout(timeout)
        )

        def acquired(reply: m.CoordinateReply) -> bool:
            if reply.ok:
                self._leases.append(token)
            return reply.ok

        return self._then(reply, acquired)

    def release(self) -> Any:
        if not self._leases:
            raise RuntimeError(f"released {self!r} too often: it holds no lease")
        token = self._leases.popleft()
        return self._then(self._call("release", token=token), lambda reply: reply.ok)

    def get_value(self) -> Any:
        """How many leases are held now, by anyone."""
        return self._then(self._call("value"), lambda reply: reply.number)

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    async def __aenter__(self) -> Semaphore:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    def __reduce__(self) -> Any:
        return (Semaphore, (self.max_leases, self.name))


class Lock(_Primitive):
    """A cluster-wide mutual exclusion lock (a semaphore of one lease). ``acquire``
    returns True when held, False if ``blocking=False`` or ``timeout`` ran out; the
    lock is held until released by this instance or until its client leaves."""

    kind = "lock"

    def __init__(self, name: str | None = None, client: Client | None = None):
        super().__init__(name, client)
        self._token: str | None = None

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> Any:
        if not blocking:
            if timeout is not None:
                raise ValueError("a non-blocking acquire takes no timeout")
            timeout = 0
        token = uuid.uuid4().hex
        reply = self._call("acquire", token=token, number=1, timeout=_check_timeout(timeout))

        def acquired(reply: m.CoordinateReply) -> bool:
            if reply.ok:
                self._token = token
            return reply.ok

        return self._then(reply, acquired)

    def release(self) -> Any:
        if self._token is None:
            raise ValueError(f"{self!r} is not acquired by this instance")
        token, self._token = self._token, None
        return self._then(self._call("release", token=token), lambda reply: None)

    def locked(self) -> Any:
        """Whether anyone holds the lock now."""
        return self._then(self._call("value"), lambda reply: reply.number > 0)

    __enter__ = Semaphore.__enter__
    __exit__ = Semaphore.__exit__
    __aenter__ = Semaphore.__aenter__
    __aexit__ = Semaphore.__aexit__

    def __reduce__(self) -> Any:
        return (Lock, (self.name,))


class MultiLock:
    """Several locks held together: ``acquire`` takes all of them or none. The locks
    are taken in sorted order (two MultiLocks over overlapping names cannot deadlock)
    and, if one is not had within the time left, the ones taken are given back.
    The names live in their own namespace, apart from :class:`Lock`'s, as in Dask.
    Synchronous clients only."""

    def __init__(self, names: Iterable[str] = (), client: Client | None = None):
        self.names = sorted(set(names))
        if not self.names:
            raise ValueError("a MultiLock needs at least one lock name")
        self._locks = [Lock(f"multilock:{name}", client) for name in self.names]
        if self._locks[0].client.asynchronous:
            raise ValueError("MultiLock needs a synchronous client")
        self._held: list[Lock] = []

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        if self._held:
            raise ValueError(f"{self!r} is acquired already")
        timeout = _check_timeout(0 if not blocking else timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        for lock in self._locks:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not lock.acquire(timeout=left):
                self.release()
                return False
            self._held.append(lock)
        return True

    def release(self) -> None:
        held, self._held = self._held, []
        for lock in reversed(held):
            lock.release()

    def __enter__(self) -> MultiLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __reduce__(self) -> Any:
        return (MultiLock, (self.names,))

    def __repr__(self) -> str:
        return f"<MultiLock: {self.names}>"


# ---------------------------------------------------------------------- events, variables


class Event(_Primitive):
    """A cluster-wide flag: ``set``, ``clear``, ``is_set`` and ``wait(timeout)``
    (True once set, False if the timeout ran out first)."""

    kind = "event"

    def __init__(self, name: str | None = None, client: Client | None = None):
        super().__init__(name, client)

    def set(self) -> Any:
        return self._then(self._call("set"), lambda reply: None)

    def clear(self) -> Any:
        return self._then(self._call("clear"), lambda reply: None)

    def is_set(self) -> Any:
        return self._then(self._call("is_set"), lambda reply: reply.ok)

    def wait(self, timeout: float | None = None) -> Any:
        reply = self._call("wait", timeout=_check_timeout(timeout))
        return self._then(reply, lambda reply: reply.ok)

    def __reduce__(self) -> Any:
        return (Event, (self.name,))


def _timed_out(what: str, timeout: float | None) -> TimeoutError:
    return TimeoutError(f"{what} timed out after {timeout}s")


class Variable(_Primitive):
    """A cluster-wide value: ``set(value)``, ``get(timeout)`` (waits until set;
    TimeoutError when the timeout runs out first), ``delete()``. A future stored here
    keeps its data alive until replaced or deleted."""

    kind = "variable"

    def __init__(self, name: str | None = None, client: Client | None = None):
        super().__init__(name, client)

    def set(self, value: Any) -> Any:
        return self._then(self._call("set", **self._encode(value)), lambda reply: None)

    def get(self, timeout: float | None = None) -> Any:
        timeout = _check_timeout(timeout)

        def value(reply: m.CoordinateReply) -> Any:
            if not reply.ok:
                raise _timed_out(f"getting variable {self.name!r}", timeout)
            return self._decode(reply.value, reply.key)

        return self._then(self._call("get", timeout=timeout), value)

    def delete(self) -> Any:
        return self._then(self._call("delete"), lambda reply: None)

    def __reduce__(self) -> Any:
        return (Variable, (self.name,))


# ---------------------------------------------------------------------- queues, pub/sub


class Queue(_Primitive):
    """A cluster-wide FIFO queue (``maxsize`` 0: unbounded; the first instance of a
    name sets it). ``put(value, timeout)`` waits while full, ``get(timeout,
    batch=False)``: one item; ``batch=True``: every item there is now (a list, maybe
    empty); ``batch=n``: a list of n items, waiting for them. TimeoutError when the
    timeout runs out. Futures put in keep their data alive while queued."""

    kind = "queue"

    def __init__(self, name: str | None = None, client: Client | None = None, maxsize: int = 0):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"a queue's maxsize is an int >= 0, not {maxsize!r}")
        super().__init__(name, client)
        self.maxsize = maxsize
        if not self.client.asynchronous:
            self._call("create", number=maxsize)
        # An asynchronous client creates it on ``await Queue(...)`` (__init__ cannot
        # await); without that, the first put or get creates it unbounded.

    async def _setup(self) -> None:
        await self._request("create", number=self.maxsize)

    def put(self, value: Any, timeout: float | None = None) -> Any:
        timeout = _check_timeout(timeout)

        def put(reply: m.CoordinateReply) -> None:
            if not reply.ok:
                raise _timed_out(f"putting into queue {self.name!r}", timeout)

        return self._then(self._call("put", timeout=timeout, **self._encode(value)), put)

    def get(self, timeout: float | None = None, batch: bool | int = False) -> Any:
        timeout = _check_timeout(timeout)
        if batch is True:
            number = -1
        elif batch is False:
            number = 0
        elif isinstance(batch, int) and batch >= 1:
            number = batch
        else:
            raise ValueError(f"batch is True, False or an int >= 1, not {batch!r}")

        def got(reply: m.CoordinateReply) -> Any:
            if not reply.ok:
                raise _timed_out(f"getting from queue {self.name!r}", timeout)
            if number == 0:
                return self._decode(reply.value, reply.key)
            return [self._decode(value, key) for value, key in reply.items]

        return self._then(self._call("get", timeout=timeout, number=number), got)

    def qsize(self) -> Any:
        return self._then(self._call("qsize"), lambda reply: reply.number)

    def __reduce__(self) -> Any:
        return (_rebuild_queue, (self.name, self.maxsize))


def _rebuild_queue(name: str, maxsize: int) -> Queue:
    return Queue(name, maxsize=maxsize)


class Pub(_Primitive):
    """Publish to topic ``name``: ``put(msg)`` reaches every current :class:`Sub`."""

    kind = "pubsub"

    def __init__(self, name: str, client: Client | None = None):
        super().__init__(name, client)

    def put(self, msg: Any) -> Any:
        """Publish ``msg``; returns how many subscribers it reached."""
        return self._then(self._call("publish", **self._encode(msg)), lambda r: r.number)

    def __reduce__(self) -> Any:
        return (Pub, (self.name,))


class Sub(_Primitive):
    """Subscribe to topic ``name`` (from now on): ``get(timeout)`` (TimeoutError when it
    runs out), iteration, ``close()``. The subscription ends with ``close`` or when its
    client leaves. Synchronous clients subscribe on creation; asynchronous ones on
    ``await Sub(...)``."""

    kind = "pubsub"

    def __init__(self, name: str, client: Client | None = None):
        super().__init__(name, client)
        self.token = f"sub-{uuid.uuid4().hex}"
        self.closed = False
        if not self.client.asynchronous:
            self.subscribe()

    def subscribe(self) -> Any:
        return self._then(self._call("subscribe", token=self.token), lambda reply: None)

    async def _setup(self) -> None:
        await self._request("subscribe", token=self.token)

    def get(self, timeout: float | None = None) -> Any:
        timeout = _check_timeout(timeout)

        def got(reply: m.CoordinateReply) -> Any:
            if not reply.ok:
                raise _timed_out(f"getting from topic {self.name!r}", timeout)
            return self._decode(reply.value, reply.key)

        return self._then(self._call("get", token=self.token, timeout=timeout), got)

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield self.get()

    def close(self) -> Any:
        self.closed = True
        return self._then(self._call("unsubscribe", token=self.token), lambda reply: None)
