"""Handshake: the first messages on every connection (DESIGN.md, "Protocol").

The side that connected says :class:`Hello`; the other answers :class:`Welcome`,
or :class:`Refused` before closing a connection that broke the protocol.
"""

from __future__ import annotations

from shoal.protocol.message_families.base import (
    Amount,
    Message,
)


class Hello(Message):
    """First message on every connection, from the side that connected."""

    version: int
    role: str  # "client" | "worker" | "peer"
    name: str = ""
    address: str = ""  # a worker's listening address
    nthreads: int = 0
    memory_limit: int = 0
    pid: int = 0
    subscribe: bool = True
    resources: dict[str, Amount] = {}  # a worker's totals, e.g. {"GPU": 2}
    # A worker's remaining lifetime in seconds (--lifetime, staggered) and task budget
    # (--max-tasks) when it says hello; None: unlimited. Relative, as clocks differ
    # between hosts: the scheduler turns the lifetime into a deadline on its own clock.
    lifetime: float | None = None
    max_tasks: int | None = None
    http_address: str = ""  # a worker's HTTP port (/metrics, /health), if it opened one


class Welcome(Message):
    version: int
    id: str  # the scheduler's (or worker's) identity
    assigned: str = ""  # client id or worker name as the server records it
    dashboard_port: int = 0  # the scheduler's dashboard (HTTP) port; 0: none


class Refused(Message):
    """Sent before closing a connection that broke the protocol."""

    reason: str
