"""TCP and TLS transport: addresses, listening, connecting, and the handshake.

Every connection first runs the authentication preamble on raw bytes (the cluster
token, :mod:`shoal.comm.handshake`), inside TLS for ``tls://`` addresses. Then the
connecting side sends its :class:`Hello` (protocol version and role); the listening
side answers :class:`Welcome` or :class:`Refused`. A version mismatch is refused with a
message naming both versions.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from shoal.comm.connection import CommClosedError, Connection
from shoal.comm.handshake import ConnectorHandshake, ListenerHandshake
from shoal.comm.security import Security
from shoal.comm.traffic import Traffic
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame

DEFAULT_CONNECT_TIMEOUT = 10.0
# A listener drops a connection that has not finished the handshake (the preamble and
# a complete Hello) by then, as Dask does after 30 s: a half-open connection is held
# no longer.
HANDSHAKE_TIMEOUT = 30.0
SCHEMES = ("tcp", "tls")


class HandshakeError(ConnectionError):
    """The peer refused us, or spoke something other than shoal."""


def parse_address(address: str) -> tuple[str, int]:
    """``"tcp://127.0.0.1:8786"`` -> ``("127.0.0.1", 8786)``."""
    _, host, port = split_address(address)
    return host, port


def split_address(address: str) -> tuple[str, str, int]:
    """``"tls://127.0.0.1:8786"`` -> ``("tls", "127.0.0.1", 8786)`` (no scheme: tcp)."""
    scheme, sep, rest = address.rpartition("://")
    if not sep:
        scheme = "tcp"
    elif scheme not in SCHEMES:
        raise ValueError(
            f"unsupported address scheme {scheme!r} in {address!r} (expected tcp:// or tls://)"
        )
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]:")
    else:
        host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return scheme, host, int(port)


def format_address(host: str, port: int, scheme: str = "tcp") -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


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
    host: str,
    port: int,
    on_connection: Callable[[Connection], None],
    security: Security | None = None,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    traffic: Traffic | None = None,
) -> tuple[asyncio.Server, str]:
    """Listen on host:port (0: the OS picks); ``on_connection`` installs the new
    connection's handler once the peer has passed the preamble (and TLS). Returns the
    server and its address (``tls://`` when ``security`` has TLS credentials). A
    connection that has not sent a complete first frame (its Hello) within
    ``handshake_timeout`` seconds of connecting is refused and closed. Connections
    add what they carry to ``traffic`` (the server's totals)."""
    security = security or Security()
    ssl_context = security.listen_context()
    loop = asyncio.get_running_loop()

    def factory() -> Connection:
        conn = Connection(
            handshake=ListenerHandshake(security.token),
            handshake_timeout=handshake_timeout,
            traffic=traffic,
        )
        loop.call_soon(on_connection, conn)
        return conn

    # A deep backlog: a thousand workers starting at once must not see refused
    # connections (asyncio's default of 100 overflowed in the cluster_state benchmark).
    server = await loop.create_server(
        factory, host, port, reuse_address=True, ssl=ssl_context, backlog=4096
    )
    sockname = server.sockets[0].getsockname()
    return server, format_address(host, sockname[1], security.scheme)


async def connect(
    address: str,
    hello: m.Hello,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    security: Security | None = None,
    traffic: Traffic | None = None,
) -> tuple[Connection, m.Welcome]:
    """Open a connection (TLS for ``tls://``), pass the preamble, say Hello, and wait
    for the Welcome. A refusal, a failed token proof or a bad certificate raise
    :class:`HandshakeError` naming the problem."""
    security = security or Security()
    scheme, host, port = split_address(address)
    ssl_context = security.connect_context(scheme, address)
    loop = asyncio.get_running_loop()

    def factory() -> Connection:
        return Connection(handshake=ConnectorHandshake(security.token), traffic=traffic)

    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(factory, host, port, ssl=ssl_context), timeout
        )
    except ssl.SSLError as e:
        raise HandshakeError(f"TLS handshake with {address} failed: {e}") from e
    except (TimeoutError, OSError) as e:
        raise OSError(f"could not connect to {address}: {e or 'timed out'}") from e
    conn.send(hello)
    try:
        frame = await conn.read_frame(timeout)
    except CommClosedError as e:
        if conn.auth_failure is not None:
            raise HandshakeError(f"{address}: {conn.auth_failure}") from None
        hint = " (is it a tls:// address?)" if ssl_context is None else ""
        raise HandshakeError(
            f"{address} closed the connection during the handshake{hint}: {e}"
        ) from e
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
