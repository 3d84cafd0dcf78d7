"""A blocking socket that has passed the authentication preamble, for tests that
speak the wire protocol by hand (garbage, forged messages) after it."""

from __future__ import annotations

import socket

from shoal.comm.handshake import ConnectorHandshake
from shoal.comm.security import Security
from shoal.comm.tcp import parse_address


def authenticated_socket(address: str, security: Security) -> tuple[socket.socket, bytes]:
    """Connect and pass the preamble with ``security``'s token; returns the socket and
    whatever the server sent after the preamble (the start of its first frame)."""
    sock = socket.create_connection(parse_address(address), timeout=10)
    handshake = ConnectorHandshake(security.token)
    sock.sendall(handshake.greeting())
    rest = b""
    while not handshake.done:
        data = sock.recv(65536)
        if not data:
            sock.close()
            raise ConnectionError(f"{address} closed the connection during the preamble")
        out, rest = handshake.feed(data)
        if out:
            sock.sendall(out)
    return sock, rest
