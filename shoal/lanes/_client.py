"""The client's side of lanes: which gets go by lane, and the caller's own connection
to the lane's worker. A small graph (``shoal/client/graph/lane_graph.py``) goes whole,
in one ``LaneRunGraph``.

The caller's thread writes the task and reads the answer on a plain blocking socket
(TLS and the token preamble included, as the loop's connections): no hand-off to the
client's loop thread on the way out or back. Every way a lane run can fail to give an
answer (declined, connection refused or broken, worker gone) returns ``NOT_RUN``, and
the caller submits through the scheduler; only the task's own outcome (its value or
its exception) comes back from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from shoal import config
from shoal.comm.handshake import AuthFailed, ConnectorHandshake
from shoal.comm.tcp import split_address
from shoal.core.scheduler.model import prefix_name
from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder, ProtocolError, encode_frame, message_buffers
from shoal.protocol.messages import Key
from shoal.protocol.serialize import loads_values

if TYPE_CHECKING:
    from shoal.client.client import Client
    from shoal.client.graph.lane_graph import LaneGraph
    from shoal.comm.security import Security

logger = logging.getLogger("shoal.lanes")

NOT_RUN: Any = object()  # the lane did not run it: submit through the scheduler
MAX_TASK_BYTES = 64 * 1024  # a larger task's encoding goes through the scheduler
ASK_AGAIN_AFTER = 1.0  # seconds after an empty grant or a failed lane before asking again
# Seconds a graph of the same prefixes is not offered again after its run stopped part
# way (it ran too long, or held too much, for all its prefixes' durations said).
TOO_LONG_FOR = 10.0
WAIT_POLL = 0.5  # seconds between checks, while a run waits, that its worker still exists
STALE_DECLINES = 3  # "not open" declines in a row: the lane is dropped and asked for again


class LaneChannel:
    """A blocking connection from the caller's thread to one worker."""

    def __init__(self, address: str, security: Security, name: str, timeout: float):
        self.address = address
        self.sent_functions: set[str] = set()
        self._decoder = FrameDecoder()
        scheme, host, port = split_address(address)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = security.connect_context(scheme, address)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
            self._sock = sock
            self._handshake(security.token, name)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(WAIT_POLL)

    def _handshake(self, token: str | None, name: str) -> None:
        sock = self._sock
        hs = ConnectorHandshake(token)
        sock.sendall(hs.greeting())
        hello = encode_frame([m.Hello(m.PROTOCOL_VERSION, "client", name=name)])
        if hs.may_send:
            sock.sendall(b"".join(hello))
        rest = b""
        while not hs.done:
            data = sock.recv(4096)
            if not data:
                raise ConnectionError(f"{self.address} closed the connection during the handshake")
            was_allowed = hs.may_send
            out, rest = hs.feed(data)
            if out:
                sock.sendall(out)
            if hs.may_send and not was_allowed:
                sock.sendall(b"".join(hello))
        frames = self._decoder.feed(rest) if rest else []
        while not frames:
            frames = self._read()
        reply = frames[0].messages[0] if frames[0].messages else None
        if not isinstance(reply, m.Welcome):
            why = reply.reason if isinstance(reply, m.Refused) else f"got {reply!r}"
            raise ConnectionError(f"{self.address} did not welcome a lane connection: {why}")

    def _read(self) -> list[Any]:
        # Into the decoder's own buffer: a large value is received in place, as on the
        # loop's connections (FrameDecoder's BufferedProtocol pair), not copied after.
        decoder = self._decoder
        n = self._sock.recv_into(decoder.get_buffer())
        if not n:
            raise ConnectionError(f"{self.address} closed the lane connection")
        return decoder.buffer_updated(n)

    def exchange(
        self, msg: m.LaneRun | m.LaneRunGraph, gone: Callable[[], bool]
    ) -> tuple[m.LaneResult, list[memoryview]] | None:
        """Send ``msg`` and read its answer; None if ``gone()`` turned true meanwhile
        (the worker left the cluster: the answer will never come)."""
        self._sock.sendall(b"".join(encode_frame([msg])))
        while True:
            try:
                frames = self._read()
            except TimeoutError:
                if gone():
                    return None
                continue
            for frame in frames:
                for reply, buffers in message_buffers(frame):
                    if type(reply) is m.Refused:
                        raise ProtocolError(f"{self.address} refused: {reply.reason}")
                    if type(reply) is not m.LaneResult or reply.request_id != msg.request_id:
                        raise ProtocolError(f"{self.address} answered a lane run with {reply!r}")
                    return reply, buffers

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a broken socket
            self._sock.close()


class ClientLanes:
    """A client's lane (at most one), and the runs it sends down it."""

    def __init__(self, client: Client):
        self.client = client
        value = config.get("client.lanes")
        if type(value) is not bool:
            raise ValueError(f"shoal.client.lanes must be true or false, not {value!r}")
        self.enabled = value
        self.grant: tuple[str, str] | None = None  # (lane, worker address)
        self.runs = 0  # answered by a lane (finished or erred)
        self.graph_runs = 0  # of ``runs``, graphs
        self.declined = 0
        self.failed = 0  # connection failures: the run went through the scheduler
        self._channel: LaneChannel | None = None
        self._lock = threading.Lock()  # one run at a time per client (others: the scheduler)
        self._asking = False
        self._next_ask = 0.0
        self._gone: set[str] = set()  # closed lanes whose worker left
        self._stale = 0
        self._request_ids = itertools.count(1)
        self._too_long: dict[frozenset[str], float] = {}  # graph prefixes -> until when

    # ------------------------------------------------------------------ granting

    def _ask(self) -> None:
        """Ask the scheduler for a lane, from the client's loop (once at a time)."""
        if self._asking or time.monotonic() < self._next_ask or self.client._loop is None:
            return
        self._asking = True
        self.client._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._request()))

    async def _request(self) -> None:
        conn = self.client._conn
        try:
            if conn is None or conn.closed:
                return
            reply, _ = await conn.request(lambda rid: m.LaneRequest(rid))
            assert isinstance(reply, m.LaneGrant)
            if reply.lane:
                self.grant = (reply.lane, reply.worker)
                self._stale = 0
            else:
                logger.debug("no lane granted: %s", reply.reason)
                self._next_ask = time.monotonic() + ASK_AGAIN_AFTER
        except Exception as e:  # the scheduler was lost: the client says so elsewhere
            logger.debug("asking for a lane failed: %s", e)
            self._next_ask = time.monotonic() + ASK_AGAIN_AFTER
        finally:
            self._asking = False

    def closed(self, msg: m.LaneClosed) -> None:
        """The scheduler closed ``msg.lane`` (on the client's loop)."""
        if msg.gone:
            if len(self._gone) > 64:
                self._gone.clear()
            self._gone.add(msg.lane)
        grant = self.grant
        if grant is not None and grant[0] == msg.lane:
            self.grant = None

    def _drop(self, lane: str) -> None:
        grant = self.grant
        if grant is not None and grant[0] == lane:
            self.grant = None
        self._next_ask = time.monotonic() + ASK_AGAIN_AFTER
        self._close_channel()

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def close(self) -> None:
        self.grant = None
        self._close_channel()

    # ------------------------------------------------------------------ running

    def run(self, key: m.Key, make_spec: Callable[[], m.TaskSpec | None]) -> Any:
        """The value of the one task ``key`` (or its exception, raised), run by lane;
        NOT_RUN if it did not go (submit it through the scheduler then). ``make_spec``
        encodes the task, None if it may not go by lane."""
        client = self.client
        if key in client._states:
            return NOT_RUN
        grant = self._hold()
        if grant is None:
            return NOT_RUN
        try:
            spec = make_spec()
            if spec is None or not spec.func or len(spec.payload.data) > MAX_TASK_BYTES:
                return NOT_RUN
            answer = self._exchange(
                grant, [spec], lambda rid, fns: m.LaneRun(rid, grant[0], spec, fns)
            )
            if answer is None:
                return NOT_RUN
            reply, buffers = answer
            return _outcome(client, [spec.key], grant[1], reply, buffers)[spec.key]
        finally:
            self._lock.release()

    def run_graph(
        self, prefixes: frozenset[str], make_graph: Callable[[], LaneGraph | None]
    ) -> tuple[dict[Key, Any] | Any, LaneGraph | None]:
        """The values of a small graph's keys asked for (by key asked for, through
        aliases), run whole by lane, or its first error raised; NOT_RUN if it did not
        go. ``prefixes``: its tasks' (a worker found graphs of them too long lately: not
        offered); ``make_graph`` encodes it, None if it may not go by lane. Also the
        graph as encoded, if it was (to go through the scheduler as it is)."""
        client = self.client
        until = self._too_long.get(prefixes)
        if until is not None:
            if time.monotonic() < until:
                return NOT_RUN, None
            del self._too_long[prefixes]
        grant = self._hold()
        if grant is None:
            return NOT_RUN, None
        try:
            graph = make_graph()
            if graph is None or any(k in client._states for k in graph.keys):
                return NOT_RUN, graph
            answer = self._exchange(
                grant,
                graph.tasks,
                lambda rid, fns: m.LaneRunGraph(rid, grant[0], graph.tasks, graph.keys, fns),
                prefixes,
            )
            if answer is None:
                return NOT_RUN, graph
            reply, buffers = answer
            self.graph_runs += 1
            values = _outcome(client, graph.keys, grant[1], reply, buffers)
            return {k: values[t] for k, t in graph.targets.items()} | values, graph
        finally:
            self._lock.release()

    def _hold(self) -> tuple[str, str] | None:
        """The lane to run on, its lock taken (the caller releases it); None if lanes
        are off, there is no lane yet (asked for), or another thread's run holds it."""
        if not self.enabled or self.client.status != "running":
            return None
        grant = self.grant
        if grant is None:
            self._ask()
            return None
        return grant if self._lock.acquire(blocking=False) else None

    def _exchange(
        self,
        grant: tuple[str, str],
        specs: list[m.TaskSpec],
        make_msg: Callable[[int, dict[str, bytes]], m.LaneRun | m.LaneRunGraph],
        kind: frozenset[str] | None = None,
    ) -> tuple[m.LaneResult, list[memoryview]] | None:
        """Send a run down the lane and read its answer; None if it was not answered
        (declined, or the connection or the worker failed: counted here). ``kind``: a
        graph's prefixes, not offered again for a while if declined as too long."""
        lane, address = grant
        client = self.client
        channel = self._channel
        try:
            if channel is None or channel.address != address:
                self._close_channel()
                assert client.security is not None  # (set on connecting)
                channel = self._channel = LaneChannel(
                    address, client.security, client.id, client.timeout
                )
            table = client._functions.bytes
            sent = channel.sent_functions
            functions = {
                fid: table[fid]
                for spec in specs
                for fid in (spec.func, *spec.funcs)
                if fid not in sent
            }
            msg = make_msg(next(self._request_ids), functions)
            answer = channel.exchange(msg, lambda: lane in self._gone)
        except (OSError, ProtocolError, AuthFailed) as e:
            logger.info("lane run on %s failed, going through the scheduler: %s", address, e)
            self.failed += 1
            self._drop(lane)
            return None
        except BaseException:  # e.g. KeyboardInterrupt: the socket's state is unknown
            self._close_channel()
            raise
        if answer is None:  # its worker left the cluster
            self.failed += 1
            self._drop(lane)
            return None
        reply, buffers = answer
        if reply.status == "declined":
            self.declined += 1
            if reply.output and client.forward_output:  # (a graph stopped part way)
                client._output.received(m.TaskOutput(specs[0].key, address, reply.output))
            if reply.too_long and kind is not None:
                if len(self._too_long) >= 256:
                    self._too_long.clear()
                self._too_long[kind] = time.monotonic() + TOO_LONG_FOR
            if reply.reason.startswith(f"lane {lane} is not open"):
                self._stale += 1
                if self._stale >= STALE_DECLINES:
                    self._drop(lane)
            return None
        self._stale = 0
        sent.update(functions)
        self.runs += 1
        return reply, buffers


def graph_prefixes(keys: Iterable[Key]) -> frozenset[str]:
    """The prefixes of a graph's keys: a graph found too long is not offered again for
    a while by this, its kind."""
    return frozenset(map(prefix_name, keys))


def _outcome(
    client: Client, keys: list[Key], worker: str, reply: m.LaneResult, buffers: list[memoryview]
) -> dict[Key, Any]:
    """The values of ``keys`` (one task's, or a graph's asked for), or the first error
    raised, as a gather of their futures would."""
    from shoal.client.client import remote_exception

    if reply.output and client.forward_output:
        client._output.received(m.TaskOutput(keys[0], worker, reply.output))
    try:
        if reply.status == "finished":
            if len(reply.payloads) != len(keys):
                raise ProtocolError(
                    f"{worker} answered {len(keys)} keys with {len(reply.payloads)} values"
                )
            values, errors = loads_values(keys, reply.payloads, buffers)
            for key, e in errors.items():
                e.add_note(f"raised loading the result of {key!r} from {worker}")
                raise e
            return values
        assert reply.exception is not None
        exc = remote_exception(reply.exception, reply.traceback)
        raise exc.with_traceback(None)
    finally:
        client._output.reraise(keys[:1], client._states)
