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

import asyncio
import math
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import cloudpickle
from dask.utils import parse_timedelta

from shoal import config
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
    if isinstance(timeout, str | timedelta):  # "200ms", as Dask's
        timeout = parse_timedelta(timeout, default="seconds")
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


def lease_timeout() -> float | None:
    """Seconds a lease lives without a refresh: config ``shoal.scheduler.locks.
    lease-timeout`` (or Dask's ``distributed.scheduler.locks.lease-timeout``); "inf"
    or None: leases never expire."""
    value = config.get("scheduler.locks.lease-timeout")
    if value is None or value is False or value == "inf" or value == math.inf:
        return None
    seconds = parse_timedelta(value, default="seconds")
    if seconds is None or not seconds > 0:
        raise ValueError(f"a lease timeout is a duration > 0 or 'inf', not {value!r}")
    return float(seconds)


class ReleasedTooOften(RuntimeError, ValueError):
    """``release()`` of a lock or semaphore this instance does not hold (Dask raises a
    RuntimeError; shoal's earlier versions a ValueError: both catch it)."""


class _Leases(_Primitive):
    """Leases of a Semaphore or Lock, as Dask's: with a lease timeout, the instance
    refreshes its leases every ``lease_timeout / 5`` seconds on its client's loop while
    ``refresh_leases`` is true; a lease not refreshed in time is released by the
    scheduler (its holder stalled or lost touch), and ``release`` then returns False."""

    def __init__(self, name: str | None, client: Client | None):
        super().__init__(name, client)
        self._leases: deque[str] = deque()
        self.refresh_leases = True
        self.lease_timeout = lease_timeout()
        self._timer: asyncio.TimerHandle | None = None

    def _acquire(self, number: int, timeout: Any) -> Any:
        token = uuid.uuid4().hex
        reply = self._call(
            "acquire",
            token=token,
            number=number,
            timeout=_check_timeout(timeout),
            lease_timeout=self.lease_timeout,
        )

        def acquired(reply: m.CoordinateReply) -> bool:
            if reply.ok:
                self._leases.append(token)
                loop = self.client._loop
                if self.lease_timeout is not None and loop is not None:
                    loop.call_soon_threadsafe(self._arm_refresh)
            return reply.ok

        return self._then(reply, acquired)

    def _release(self) -> Any:
        if not self._leases:
            raise ReleasedTooOften(f"released {self!r} too often: it holds no lease")
        token = self._leases.popleft()  # the oldest first, as Dask's
        return self._then(self._call("release", token=token), lambda reply: reply.ok)

    def _arm_refresh(self) -> None:
        """On the client's loop: refresh in ``lease_timeout / 5`` (a timer, not a
        task: nothing is left pending when the client's loop stops)."""
        if self._timer is None and self._leases and self.lease_timeout is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.lease_timeout / 5, self._refresh_due)

    def _refresh_due(self) -> None:
        self._timer = None
        conn = self.client._conn
        if not self._leases or conn is None or conn.closed:
            return
        if self.refresh_leases:
            asyncio.ensure_future(self._refresh(list(self._leases)))
        self._arm_refresh()

    async def _refresh(self, tokens: list[str]) -> None:
        for token in tokens:
            try:
                await self._request("refresh", token=token)
            except (RuntimeError, ConnectionError, OSError):
                return  # the client closed meanwhile

    def get_value(self) -> Any:
        """How many leases are held now, by anyone."""
        return self._then(self._call("value"), lambda reply: reply.number)


class Semaphore(_Leases):
    """At most ``max_leases`` holders at a time, across the cluster. ``acquire``
    returns True once a lease is held (False on timeout); ``release`` gives back this
    instance's oldest lease (False if it had expired). Every instance of one name must
    give the same ``max_leases``. A lease is held until released, until its client
    leaves, or until it goes unrefreshed for the lease timeout (see :class:`_Leases`)."""

    kind = "semaphore"

    def __init__(self, max_leases: int = 1, name: str | None = None, client: Client | None = None):
        if isinstance(max_leases, bool) or not isinstance(max_leases, int) or max_leases < 1:
            raise ValueError(f"max_leases is an int >= 1, not {max_leases!r}")
        self.max_leases = max_leases
        super().__init__(name, client)

    def acquire(self, timeout: float | str | None = None) -> Any:
        return self._acquire(self.max_leases, timeout)

    def release(self) -> Any:
        return self._release()

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


class Lock(_Leases):
    """A cluster-wide mutual exclusion lock (a semaphore of one lease, as Dask's, with
    its lease timeout). ``acquire`` returns True when held, False if ``blocking=False``
    or ``timeout`` ran out; ``release`` returns False if the lease had expired."""

    kind = "lock"

    def __init__(self, name: str | None = None, client: Client | None = None):
        super().__init__(name, client)

    def acquire(self, blocking: bool = True, timeout: float | str | None = None) -> Any:
        if not blocking:
            if timeout is not None:
                raise ValueError("a non-blocking acquire takes no timeout")
            timeout = 0
        if self._leases:
            raise ValueError(f"{self!r} is acquired by this instance already")
        return self._acquire(1, timeout)

    def release(self) -> Any:
        if not self._leases:
            raise ReleasedTooOften(f"{self!r} is not acquired by this instance")
        return self._release()

    def locked(self) -> Any:
        """Whether anyone holds the lock now."""
        return self._then(self._call("value"), lambda reply: reply.number > 0)

    __enter__ = Semaphore.__enter__
    __exit__ = Semaphore.__exit__
    __aenter__ = Semaphore.__aenter__
    __aexit__ = Semaphore.__aexit__

    def __reduce__(self) -> Any:
        return (Lock, (self.name,))


class MultiLock(_Primitive):
    """Several locks at once, as Dask's: ``acquire(num_locks=k)`` is granted once this
    instance holds ``k`` of ``names`` (default: all), waiting in each name's queue on
    the scheduler (no deadlock between MultiLocks over overlapping names: the request
    is one, held or waited for as a whole). The names live apart from :class:`Lock`'s,
    as in Dask. ``locked()``: whether this instance holds its locks."""

    kind = "multilock"

    def __init__(self, names: Iterable[str] | None = None, client: Client | None = None):
        self.names = list(names or [])
        if not self.names or not all(isinstance(n, str) and n for n in self.names):
            raise ValueError(f"a MultiLock needs non-empty lock names, not {self.names!r}")
        super().__init__("multilock", client)
        self.id = uuid.uuid4().hex
        self._locked = False

    def acquire(
        self,
        blocking: bool = True,
        timeout: float | str | None = None,
        num_locks: int | None = None,
    ) -> Any:
        if not blocking:
            if timeout is not None:
                raise ValueError("a non-blocking acquire takes no timeout")
            timeout = 0
        if self._locked:
            raise ValueError(f"{self!r} is acquired already")
        number = len(self.names) if num_locks is None else num_locks
        reply = self._call(
            "acquire",
            token=self.id,
            names=self.names,
            number=number,
            timeout=_check_timeout(timeout),
        )

        def acquired(reply: m.CoordinateReply) -> bool:
            self._locked = reply.ok
            return reply.ok

        return self._then(reply, acquired)

    def release(self) -> Any:
        if not self._locked:
            raise ValueError(f"{self!r} is not acquired")
        self._locked = False
        return self._then(self._call("release", token=self.id), lambda reply: reply.ok)

    def locked(self) -> bool:
        return self._locked

    def __enter__(self) -> MultiLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    async def __aenter__(self) -> MultiLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

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
