"""TCP transport: addresses, listening, connecting, and the handshake.

Every connection starts with the connecting side's :class:`Hello` (protocol version
and role); the listening side answers :class:`Welcome` or :class:`Refused`. A version
mismatch is refused with a message naming both versions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shoal.comm.connection import CommClosedError, Connection
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame

DEFAULT_CONNECT_TIMEOUT = 10.0


class HandshakeError(ConnectionError):
    """The peer refused us, or spoke something other than shoal."""


def parse_address(address: str) -> tuple[str, int]:
    """``"tcp://127.0.0.1:8786"`` -> ``("127.0.0.1", 8786)``."""
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme != "tcp":
        raise ValueError(f"unsupported address scheme {scheme!r} in {address!r} (expected tcp://)")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]:")
    else:
        host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


def format_address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def check_hello(frame: Frame) -> m.Hello:
    """Validate the first frame of an accepted connection."""
    if len(frame.messages) != 1 or not isinstance(frame.messages[0], m.Hello):
        names = [type(x).__name__ for x in frame.messages]
        raise HandshakeError(f"expected a Hello message first, got {names}")
    hello = frame.messages[0]
    if hello.version != m.PROTOCOL_VERSION:
        raise HandshakeError(
            f"protocol version mismatch: this side speaks version {m.PROTOCOL_VERSION}, "
            f"the peer speaks version {hello.version}"
        )
    return hello


async def listen(
    host: str, port: int, on_connection: Callable[[Connection], None]
) -> tuple[asyncio.Server, str]:
    """Listen on host:port (0: the OS picks); ``on_connection`` installs the new
    connection's handler. Returns the server and its address."""
    loop = asyncio.get_running_loop()

    def factory() -> Connection:
        conn = Connection()
        loop.call_soon(on_connection, conn)
        return conn

    server = await loop.create_server(factory, host, port, reuse_address=True)
    sockname = server.sockets[0].getsockname()
    return server, format_address(host, sockname[1])


async def connect(
    address: str, hello: m.Hello, timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> tuple[Connection, m.Welcome]:
    """Open a connection, say Hello, and wait for the Welcome."""
    host, port = parse_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(loop.create_connection(Connection, host, port), timeout)
    except (TimeoutError, OSError) as e:
        raise OSError(f"could not connect to {address}: {e or 'timed out'}") from e
    conn.send(hello)
    try:
        frame = await conn.read_frame(timeout)
    except CommClosedError as e:
        raise HandshakeError(f"{address} closed the connection during the handshake: {e}") from e
    except TimeoutError as e:
        conn.close()
        raise HandshakeError(f"no handshake reply from {address} within {timeout}s") from e
    reply = frame.messages[0] if frame.messages else None
    if isinstance(reply, m.Refused):
        conn.close()
        raise HandshakeError(f"{address} refused the connection: {reply.reason}")
    if not isinstance(reply, m.Welcome):
        conn.close()
        raise HandshakeError(f"{address} did not answer the handshake (got {reply!r})")
    if reply.version != m.PROTOCOL_VERSION:
        conn.close()
        raise HandshakeError(
            f"protocol version mismatch: this side speaks version {m.PROTOCOL_VERSION}, "
            f"{address} speaks version {reply.version}"
        )
    if len(frame.messages) > 1:  # the server batched its first messages with the Welcome
        conn.unread(Frame(frame.messages[1:], frame.buffers))
    return conn, reply
