"""A worker's dependency transfers, in totals: bytes and transfers each way since it
started. Its heartbeats carry the byte totals to the scheduler (``WorkerInfo``: a
performance report takes the difference over its block) and ``/metrics`` shows them.
"""

from __future__ import annotations


class TransferTotals:
    __slots__ = ("incoming_bytes", "incoming_count", "outgoing_bytes", "outgoing_count")

    def __init__(self) -> None:
        self.incoming_bytes = 0  # fetched from peers (the values' sizes, as stored)
        self.incoming_count = 0  # fetches that brought data
        self.outgoing_bytes = 0  # served to peers that fetched from this worker
        self.outgoing_count = 0  # answers that carried data

    def received(self, nbytes: int) -> None:
        self.incoming_bytes += nbytes
        self.incoming_count += 1

    def sent(self, nbytes: int) -> None:
        self.outgoing_bytes += nbytes
        self.outgoing_count += 1
