"""Coordination primitives held by the scheduler (locks, semaphores, events,
variables, queues, publish/subscribe) and actors.
"""

from __future__ import annotations

from shoal.protocol.message_families.base import (
    Key,
    Message,
)


class Coordinate(Message):
    """Client -> scheduler: one operation ``op`` on the primitive ``kind`` called
    ``name`` (see ``shoal/core/scheduler/coordination.py``). ``value`` is opaque
    pickled bytes, or ``key`` names a future whose data the primitive keeps alive.
    ``number``: a semaphore's max_leases, a queue's maxsize, a get's batch size (0: one
    item, -1: all there are). ``timeout``: seconds to wait (None: no limit, 0: do not
    wait). ``token``: a lease, subscription or MultiLock request id chosen by the
    client. ``lease_timeout``: seconds a lease lives without a refresh. Answered by
    CoordinateReply, possibly much later (a blocked acquire or get)."""

    request_id: int
    kind: str
    name: str
    op: str
    value: bytes | None = None
    key: Key | None = None
    number: int = 0
    timeout: float | None = None
    token: str = ""
    stimulus_id: str = ""
    names: list[str] = []  # a MultiLock's lock names
    lease_timeout: float | None = None  # a semaphore's or lock's (None: leases never expire)


class CoordinateReply(Message):
    request_id: int
    ok: bool = True  # False: not acquired / not released / event not set / timed out
    value: bytes | None = None
    key: Key | None = None
    items: list[tuple[bytes | None, Key | None]] = []  # a batch get
    number: int = 0  # a count: leases held, queue size, subscribers reached
    timed_out: bool = False
    error: str = ""  # the request was refused: why


class RegisterActor(Message):
    """Client -> scheduler: these submitted keys are actors. While one is in memory its
    worker is pinned (owner ``actor:<key>``): it cannot be retired or scaled down."""

    keys: list[Key]
    stimulus_id: str = ""


class ActorCall(Message):
    """Client -> the worker holding actor ``key``: call its method ``name`` with the
    pickled ``(args, kwargs)`` (``op`` "call"), or read its attribute ``name`` ("getattr").
    Answered by ActorReply."""

    request_id: int
    key: Key
    op: str
    name: str
    args: bytes | None = None


class ActorReply(Message):
    request_id: int
    value: bytes | None = None  # the pickled result
    error: bytes | None = None  # the pickled exception it raised
    no_actor: bool = False  # this worker holds no actor of that key
