"""Pins from the client's side: ``client.pin(workers, reason, lease=None)`` -> :class:`Pin`,
and the scheduler's structured events (``client.get_events``). A mixin of
:class:`~shoal.client.client.Client`, whose connection and loop it uses."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.comm.connection import Connection
from shoal.protocol import messages as m

T = TypeVar("T")


class Pin:
    """Workers held for a reason: while the pin lives, ``retire_workers`` refuses them
    (unless ``ignore_pins=True``) and no scale-down closes them.

    The pin goes when released (``.release()``, or leaving a ``with`` block), when its
    lease runs out without ``.renew()``, when its client closes or is lost, and, for
    each worker, when that worker dies. Releasing twice is a no-op. On an asynchronous
    client, ``release`` and ``renew`` return awaitables and ``async with`` is used."""

    def __init__(
        self,
        client: PinsMixin,
        pin_id: int,
        workers: tuple[str, ...],
        reason: str,
        lease: float | None,
        expires: float | None,
    ):
        self._client = client
        self.id = pin_id
        self.workers = workers  # addresses, as the scheduler resolved them
        self.reason = reason
        self.lease = lease
        self.expires = expires  # the scheduler's wall-clock time; None: never
        self.released = False

    def release(self) -> Any:
        """Release the pin; True if this released it, False if it was gone already
        (released before, expired, or its workers are gone)."""
        if self._client._closed and not self._client.asynchronous:
            self.released = True  # its pins went with the client's connection
            return False
        return self._client._run(self._release())

    async def _release(self) -> bool:
        if self.released:
            return False
        self.released = True
        conn = self._client._conn
        if conn is None or conn.closed:
            return False  # the scheduler dropped every pin of this client with it
        reply = await self._client._pin_request(
            lambda rid: m.ReleasePin(rid, self.id, f"unpin-{self.id}")
        )
        return reply.done

    def renew(self) -> Any:
        """Restart the lease from now; True if the pin is still held, else False
        (it expired or its workers are gone: make a new one)."""
        return self._client._run(self._renew())

    async def _renew(self) -> bool:
        if self.released:
            return False
        reply = await self._client._pin_request(
            lambda rid: m.RenewPin(rid, self.id, f"renew-{self.id}")
        )
        if reply.done:
            self.expires = reply.expires
        return reply.done

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    async def __aenter__(self) -> Pin:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Pin {self.id} {list(self.workers)} {self.reason!r} {state}>"


class PinsMixin:
    asynchronous: bool
    timeout: float
    _closed: bool
    _conn: Connection | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def _run(self, coro: Coroutine[Any, Any, T]) -> Any:
        return coro if self.asynchronous else self._sync(coro)

    async def _pin_request(self, make: Any) -> m.PinReply:
        conn = self._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        reply, _ = await conn.request(make, timeout=self.timeout)
        assert isinstance(reply, m.PinReply)
        if reply.error:
            raise ValueError(reply.error)
        return reply

    def pin(self, workers: str | Iterable[str], reason: str, lease: float | None = None) -> Any:
        """Pin ``workers`` (addresses or names) for ``reason``: a :class:`Pin`, held by
        this client until released, or, with ``lease`` seconds, until it runs out
        without a renewal. ValueError for an unknown worker or a lease that is not a
        positive number of seconds."""
        names = [workers] if isinstance(workers, str) else list(workers)
        if not isinstance(reason, str):
            raise TypeError(f"a pin's reason is a str, not {type(reason).__name__}")
        if lease is not None and (isinstance(lease, bool) or not isinstance(lease, int | float)):
            raise TypeError(f"a pin's lease is a number of seconds, not {lease!r}")
        lease = None if lease is None else float(lease)

        async def pin() -> Pin:
            reply = await self._pin_request(
                lambda rid: m.PinWorkers(rid, names, reason, lease, f"pin-{rid}")
            )
            return Pin(self, reply.pin_id, tuple(reply.workers), reason, lease, reply.expires)

        return self._run(pin())

    def get_events(self, topic: str | None = None) -> Any:
        """The scheduler's structured events: ``[(timestamp, dict), ...]`` for
        ``topic`` (e.g. "pins", "adaptive", "p2p"), or ``{topic: [...]}`` for every
        topic when none is given. Timestamps are the scheduler's wall-clock time;
        each topic keeps its newest 1,000 events."""

        async def events() -> Any:
            conn = self._conn
            if conn is None or conn.closed:
                raise RuntimeError("the client is closed")
            reply, _ = await conn.request(
                lambda rid: m.EventsRequest(rid, topic), timeout=self.timeout
            )
            assert isinstance(reply, m.EventsReply)
            found = {t: [(ts, data) for ts, data in evs] for t, evs in reply.events.items()}
            return found.get(topic, []) if topic is not None else found

        return self._run(events())
