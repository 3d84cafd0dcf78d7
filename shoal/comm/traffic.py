"""What a server's connections carried: bytes, frames and messages each way, and
connections opened and closed.

One :class:`Traffic` per server, shared by all its connections, which add to it as
they read and write (an attribute increment per frame): the totals cost nothing to
read, however many connections there are or were (Prometheus ``/metrics``).
"""

from __future__ import annotations


class Traffic:
    __slots__ = (
        "bytes_sent",
        "bytes_received",
        "frames_sent",
        "frames_received",
        "messages_sent",
        "messages_received",
        "opened",
        "closed",
    )

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.bytes_received = 0
        self.frames_sent = 0
        self.frames_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.opened = 0  # connections made (before their handshake)
        self.closed = 0

    @property
    def open_connections(self) -> int:
        return self.opened - self.closed
