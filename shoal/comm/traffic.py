"""Process-wide counters of what every connection sent and received, read by the
scheduler's monitor (``shoal/server/monitor.py``) as rates. An integer add per frame
or read: nothing per message beyond what the connection does anyway."""

from __future__ import annotations


class Traffic:
    __slots__ = ("bytes_in", "bytes_out", "messages_in", "messages_out")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.messages_in = 0
        self.messages_out = 0  # frames encoded once for many peers count once per peer

    def snapshot(self) -> tuple[int, int, int, int]:
        return self.bytes_in, self.bytes_out, self.messages_in, self.messages_out


TRAFFIC = Traffic()
