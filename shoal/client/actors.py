"""Actors: ``client.submit(Cls, *args, actor=True)`` makes an instance of ``Cls`` on a
worker, where it stays; the future's ``.result()`` is an :class:`Actor` proxy. Calling
a method on the proxy sends it to that worker directly (not through the scheduler) and
returns an :class:`ActorFuture`; reading an attribute returns its value. Methods run on
the worker one at a time, in order, on a thread reserved for actors.

The worker holding an actor is pinned (it cannot be retired or scaled down) until the
actor's future is released. A task may take the proxy (not the future) as an argument
and call it. An actor's state is lost if its worker dies (its task runs again
elsewhere, from the start); a worker under memory pressure may spill it to disk and
load it back (a copy made by pickling).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import cloudpickle

from shoal.client.futures import Future
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

if TYPE_CHECKING:
    from shoal.client.client import Client


def _client(client: Client | None) -> Client:
    if client is not None:
        return client
    from shoal.client.worker_client import get_client

    return get_client()


class ActorFuture:
    """The result of an actor method call: ``.result(timeout)`` (or ``await`` it on an
    asynchronous client), ``.done()``."""

    def __init__(self, future: Any, asynchronous: bool):
        self._future = future  # concurrent.futures.Future, or an asyncio.Task
        self._asynchronous = asynchronous

    def result(self, timeout: float | None = None) -> Any:
        if self._asynchronous:
            return asyncio.wait_for(asyncio.shield(self._future), timeout)
        return self._future.result(timeout)

    def done(self) -> bool:
        return bool(self._future.done())

    def __await__(self) -> Any:
        return self._future.__await__()

    def __repr__(self) -> str:
        return f"<ActorFuture {'done' if self.done() else 'pending'}>"


class Actor:
    """A proxy of an actor living on ``address`` under ``key``. The proxy a future's
    result gives keeps that future, so the actor lives while either is held; a proxy
    unpickled in a task does not (the caller's reference keeps the actor)."""

    def __init__(
        self,
        cls: type,
        address: str,
        key: Key,
        client: Client | None = None,
        future: Future | None = None,
    ):
        self._cls = cls
        self._address = address
        self._key = key
        self._client = _client(client)
        self._future = future

    @property
    def key(self) -> Key:
        return self._key

    @property
    def worker(self) -> str:
        return self._address

    async def _request(self, op: str, name: str, args: bytes | None) -> Any:
        client = self._client
        conn = await client._worker_conns.get(self._address)
        reply, _ = await conn.request(lambda rid: m.ActorCall(rid, self._key, op, name, args))
        assert isinstance(reply, m.ActorReply)
        if reply.no_actor:
            raise ValueError(f"worker {self._address} holds no actor {self._key!r} (released?)")
        if reply.error is not None:
            raise cloudpickle.loads(reply.error)
        assert reply.value is not None
        return cloudpickle.loads(reply.value)

    def _start(self, op: str, name: str, args: bytes | None) -> ActorFuture:
        client = self._client
        coro = self._request(op, name, args)
        if client.asynchronous:
            return ActorFuture(asyncio.ensure_future(coro), True)
        loop = client._loop
        assert loop is not None
        return ActorFuture(asyncio.run_coroutine_threadsafe(coro, loop), False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._cls, name, None)
        if callable(attr):

            def call(*args: Any, **kwargs: Any) -> ActorFuture:
                return self._start("call", name, cloudpickle.dumps((args, kwargs)))

            call.__name__ = name
            return call
        future = self._start("getattr", name, None)  # the worker's value, read now
        return future._future if self._client.asynchronous else future.result()

    def __dir__(self) -> list[str]:
        return sorted({*dir(type(self)), *(n for n in dir(self._cls) if not n.startswith("_"))})

    def __reduce__(self) -> Any:
        return (Actor, (self._cls, self._address, self._key))

    def __repr__(self) -> str:
        return f"<Actor: {self._cls.__name__}, key={self._key!r}, worker={self._address}>"


class ActorCreation(Future):
    """The future of ``submit(..., actor=True)``: its result is an :class:`Actor`."""

    __slots__ = ("actor_class",)

    def __init__(self, key: Key, client: Client, actor_class: type, state: Any = None):
        super().__init__(key, client, state)
        self.actor_class = actor_class

    def result(self, timeout: float | None = None) -> Any:
        if self.client.asynchronous:
            return self._actor_async(timeout)
        return self.client._sync(self._actor_async(timeout))

    async def _actor_async(self, timeout: float | None = None) -> Actor:
        st = self._state
        await asyncio.wait_for(st.wait_async(), timeout)
        if st.status != "finished":
            await Future._result_async(self)  # raises the task's error, or CancelledError
        conn = self.client._conn
        assert conn is not None
        reply, _ = await conn.request(lambda rid: m.WhoHasRequest(rid, [self.key]))
        assert isinstance(reply, m.WhoHasReply)
        holders = dict(reply.who_has).get(self.key) or []
        if not holders:
            raise ValueError(f"actor {self.key!r} is held by no worker (lost or released)")
        return Actor(self.actor_class, holders[0], self.key, self.client, self)

    def __await__(self) -> Any:
        return self._actor_async().__await__()


def check_actor_class(cls: Any) -> None:
    if not isinstance(cls, type):
        raise TypeError(f"actor=True needs a class, not {type(cls).__name__}")


def make_actor_futures(client: Client, futures: list[Future], cls: Any) -> list[ActorCreation]:
    """Turn the futures of actor tasks just submitted into :class:`ActorCreation`s, and
    tell the scheduler to pin their workers while they live."""
    made = [ActorCreation(f.key, client, cls, f._state) for f in futures]
    client._send(m.RegisterActor([f.key for f in futures], stimulus_id=f"actor-{client.id}"))
    return made
