"""What the scheduler core writes to: a small interface, and a test double.

The server implements :class:`Comm` over real connections, batching every message
for one destination into one frame per loop iteration. :class:`RecordingComm`
round-trips every message through the real encoder, so a core test also proves
that what the core emits is valid on the wire.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from shoal.protocol.framing import decode_body, encode_body
from shoal.protocol.messages import Message


class Comm(Protocol):
    def send_worker(self, address: str, msg: Message) -> None: ...

    def send_client(self, client_id: str, msg: Message) -> None: ...


class RecordingComm:
    """Collects messages per destination after a trip through encode and decode."""

    def __init__(self) -> None:
        self.workers: defaultdict[str, list[Message]] = defaultdict(list)
        self.clients: defaultdict[str, list[Message]] = defaultdict(list)

    @staticmethod
    def _round_trip(msg: Message) -> Message:
        (decoded,) = decode_body(encode_body([msg]))
        assert decoded == msg, (decoded, msg)
        return decoded

    def send_worker(self, address: str, msg: Message) -> None:
        self.workers[address].append(self._round_trip(msg))

    def send_client(self, client_id: str, msg: Message) -> None:
        self.clients[client_id].append(self._round_trip(msg))

    def take_worker(self, address: str) -> list[Message]:
        return self.workers.pop(address, [])

    def take_client(self, client_id: str) -> list[Message]:
        return self.clients.pop(client_id, [])

    def clear(self) -> None:
        self.workers.clear()
        self.clients.clear()
