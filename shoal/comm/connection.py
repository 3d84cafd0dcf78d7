"""A framed connection over an asyncio transport.

Outgoing messages are queued and written as one frame at the end of the current
loop iteration: a lone message goes out at once (no timer), while everything
produced by handling one batch shares a frame. Incoming frames are decoded by the
pure :class:`~shoal.protocol.framing.FrameDecoder`; a protocol violation closes this
connection only, after telling the peer why.

The data plane: out-of-band buffers (arrays, large bytes) are written from where they
lie, in chunks of at most ``CHUNK`` bytes, each only once the transport has written
everything before it (its write buffer limits are 1 and 0 bytes, so ``pause_writing`` comes
as soon as anything stays buffered, ``resume_writing`` once it is all out). Nothing is
joined or copied wholesale and at most one chunk waits in the transport; frames sent
meanwhile queue behind. Receiving is an ``asyncio.BufferedProtocol``: the kernel
writes a buffer straight into its final allocation (``FrameDecoder.get_buffer``).

Before the first frame, a connection runs the authentication preamble
(:mod:`shoal.comm.handshake`) on raw bytes: nothing reaches the decoder until the
peer has proven it knows the cluster token.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from shoal.comm.buffer_pool import process_pool
from shoal.comm.handshake import AuthFailed, ConnectorHandshake, ListenerHandshake
from shoal.comm.traffic import Traffic
from shoal.core.story import InvalidState, InvalidTransition
from shoal.protocol import messages as m
from shoal.protocol.framing import (
    DEFAULT_MAX_FRAME,
    Frame,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    message_buffers,
)

logger = logging.getLogger("shoal.comm")

FrameHandler = Callable[["Connection", Frame], None]
_REPLIES = (
    m.DataReply,
    m.LeaseReturned,
    m.Ack,
    m.WhoHasReply,
    m.InfoReply,
    m.HeartbeatReply,
    m.RetireReply,
    m.GroupsReply,
    m.PinReply,
    m.EventsReply,
    m.TaskStreamReply,
    m.RebalanceReply,
    m.HasWhatReply,
    m.ScaleReply,
    m.PluginReply,
    m.RunReply,
    m.DatasetReply,
    m.CoordinateReply,
    m.ActorReply,
    m.LaneGrant,
)


# Pieces of a frame up to this size are joined and written at once; larger ones are
# written in chunks of CHUNK bytes as the transport drains.
SMALL_PIECE = 1 << 16
CHUNK = 1 << 20


def _nbytes(piece: bytes | memoryview) -> int:
    return piece.nbytes if type(piece) is memoryview else len(piece)


class CommClosedError(ConnectionError):
    """The connection closed before the operation could finish."""


class PeerProtocolError(CommClosedError):
    """The connection was closed because what the peer sent broke the protocol (an
    undecodable reply, for instance): asking again would fail the same way."""


class Connection(asyncio.BufferedProtocol):
    _ids = itertools.count(1)
    # Set (per process) when running with validate=True: a broken invariant is a bug
    # that must fail loudly, not close one connection.
    fatal_on_invalid_state = False

    def __init__(
        self,
        on_frame: FrameHandler | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME,
        handshake: ListenerHandshake | ConnectorHandshake | None = None,
        handshake_timeout: float | None = None,
        traffic: Traffic | None = None,
    ):
        self.on_frame = on_frame
        # The owning server's totals (bytes, frames, messages; shoal/comm/traffic.py).
        self.traffic = Traffic() if traffic is None else traffic
        self.handshake = handshake  # None once the preamble is over
        self.auth_failure: str | None = None  # why the preamble failed, if it did
        self._handshake_timeout = handshake_timeout
        self._handshake_timer: asyncio.TimerHandle | None = None
        self.on_close: Callable[[Connection, BaseException | None], None] | None = None
        pool = process_pool()  # large pickled buffers land in recycled memory
        self.decoder = FrameDecoder(
            max_frame_size, allocator=None if pool is None else pool.allocate
        )
        self._wqueue: collections.deque[memoryview] = collections.deque()  # behind a chunk
        self._wqueued = 0  # bytes in _wqueue
        self._write_paused = False
        self._close_when_drained = False  # close() with data still queued
        self._protocol_error = False  # closed for what the peer sent
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.local_host: str | None = None  # our address on this connection (its interface)
        self.closed = False
        self.close_reason: str | None = None
        self._loop = asyncio.get_running_loop()
        self._out: list[m.Message] = []
        self._out_buffers: list[Any] = []
        self._flush_scheduled = False
        self._pending: dict[int, asyncio.Future[tuple[m.Message, list[memoryview]]]] = {}
        self._request_ids = itertools.count(1)
        self._paused: asyncio.Future[None] | None = None
        self._inbox: asyncio.Queue[Frame] | None = None  # used until a handler is set
        self.info: dict[str, Any] = {}
        # Direct writes (enable_direct_writes): every write to the socket, the loop's
        # and other threads', is made under this lock, on a duplicate of its descriptor.
        self._write_lock: threading.Lock | None = None
        self._direct_fd = -1
        self.direct_partial_writes = 0  # direct writes the kernel took only in part

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.traffic.opened += 1
        # pause_writing as soon as anything stays buffered, resume once all is out: a
        # chunk of a large buffer is written only into an empty transport buffer, so
        # the kernel takes it from where it lies (the transport copies only what it
        # could not take at once). Not (0, 0): asyncio's SSL transport pauses at
        # ``size >= high``, so a high-water mark of 0 would pause it for good.
        transport.set_write_buffer_limits(1, 0)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        local = transport.get_extra_info("sockname")  # our side: which interface it came in on
        self.local_host = str(local[0]) if isinstance(local, tuple) else None
        if self.handshake is not None:
            greeting = self.handshake.greeting()
            self.traffic.bytes_sent += len(greeting)
            transport.write(greeting)  # type: ignore[attr-defined]
            if self._handshake_timeout is not None:  # until the first frame (the Hello)
                self._handshake_timer = self._loop.call_later(
                    self._handshake_timeout, self._handshake_expired
                )

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        self.traffic.bytes_received += nbytes
        try:
            if self.handshake is not None:
                data = bytes(self.decoder.get_buffer()[:nbytes])  # the scratch area
                data = self._preamble_received(data)
                if not data:
                    return
                frames = self.decoder.feed(data)
            else:
                frames = self.decoder.buffer_updated(nbytes)
        except ProtocolError as e:
            self._protocol_abort(f"protocol error from {self.peer}: {e}")
            return
        for frame in frames:
            if self.closed:
                return
            self._dispatch(frame)

    def data_received(self, data: bytes) -> None:
        """For transports that do not use the buffer protocol (and for tests)."""
        while data and not self.closed:
            view = self.get_buffer(len(data))
            n = min(len(view), len(data))
            view[:n] = data[:n]
            del view
            data = data[n:]
            self.buffer_updated(n)

    def _protocol_abort(self, reason: str) -> None:
        self._protocol_error = True
        self.abort(reason)

    def _preamble_received(self, data: bytes) -> bytes:
        """Feed the preamble; return what is left for the frame decoder once it is over."""
        handshake = self.handshake
        assert handshake is not None and self.transport is not None
        try:
            out, rest = handshake.feed(data)
        except AuthFailed as e:
            self._preamble_failed(str(e))
            return b""
        if out:
            self.traffic.bytes_sent += len(out)
            self.transport.write(out)
        if handshake.may_send and self._out:
            self.flush()  # frames queued behind our proof (the connector's Hello)
        if not handshake.done:
            return b""
        self.handshake = None
        return rest

    def _handshake_expired(self) -> None:
        """The peer has not finished the preamble and sent its first frame (Hello) in time."""
        timeout = self._handshake_timeout
        if self.handshake is not None:
            self._preamble_failed(f"no connection preamble within {timeout}s")
        else:
            self.abort(f"handshake not finished within {timeout}s (no complete Hello)")

    def _preamble_failed(self, reason: str) -> None:
        if self.closed:
            return
        self.auth_failure = self.close_reason = reason
        self._out.clear()
        self._out_buffers.clear()
        if isinstance(self.handshake, ListenerHandshake) and self.transport is not None:
            logger.warning("refused a connection from %s: %s", self.peer, reason)
            refusal = self.handshake.refusal(reason)
            self.traffic.bytes_sent += len(refusal)
            self.transport.write(refusal)
        self.close()

    def _dispatch(self, frame: Frame) -> None:
        if self._handshake_timer is not None:  # the first frame: the handshake's end
            self._handshake_timer.cancel()
            self._handshake_timer = None
        msgs = frame.messages
        traffic = self.traffic
        traffic.frames_received += 1
        traffic.messages_received += len(msgs)
        if self._pending and any(type(msg) in _REPLIES for msg in msgs):
            try:
                frame = self._resolve_replies(frame)
            except ProtocolError as e:
                self._protocol_abort(f"protocol error from {self.peer}: {e}")
                return
            if not frame.messages:
                return
        if self.on_frame is None:
            if self._inbox is None:
                self._inbox = asyncio.Queue()
            self._inbox.put_nowait(frame)
            return
        try:
            self.on_frame(self, frame)
        except ProtocolError as e:
            self._protocol_abort(f"protocol error from {self.peer}: {e}")
        except (InvalidState, InvalidTransition) as e:
            if self.fatal_on_invalid_state:  # validate mode: a broken invariant stops all
                logger.critical("state machine failure, exiting:\n%s", e)
                os._exit(70)
            logger.exception("state machine failure handling a message from %s", self.peer)
            self.abort(f"error handling a message: {type(e).__name__}: {e}")
        except Exception as e:
            logger.exception("error handling a message from %s", self.peer)
            self.abort(f"error handling a message: {type(e).__name__}: {e}")

    def _resolve_replies(self, frame: Frame) -> Frame:
        rest: list[m.Message] = []
        rest_buffers: list[memoryview] = []
        for msg, bufs in message_buffers(frame):
            fut = self._pending.pop(msg.request_id, None) if type(msg) in _REPLIES else None  # type: ignore[attr-defined]
            if fut is not None:
                if not fut.done():
                    fut.set_result((msg, bufs))
            else:
                rest.append(msg)
                rest_buffers.extend(bufs)
        return Frame(rest, rest_buffers)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.traffic.closed += 1
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self.close_reason is None:
            self.close_reason = f"connection to {self.peer} closed" + (f": {exc}" if exc else "")
        self._drop_writes()
        self._close_direct_fd()
        cls = PeerProtocolError if self._protocol_error else CommClosedError
        err = cls(self.close_reason)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        if self._paused is not None and not self._paused.done():
            # Woken, not failed: drain() raises for whoever waits; an exception set on a
            # future nobody awaits is logged "Future exception was never retrieved".
            self._paused.set_result(None)
        if self._inbox is not None:
            self._inbox.put_nowait(Frame([], []))  # wake a reader
        if self.on_close is not None:
            try:
                self.on_close(self, exc)
            except Exception:
                logger.exception("error in close handler for %s", self.peer)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._wqueue:
            self._pump_locked()
        if not self._wqueue and self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    @property
    def bytes_in_flight(self) -> int:
        """Bytes held for this connection: received for a frame not yet complete, and
        queued to send (here and in the transport)."""
        out = self._wqueued
        if self.transport is not None and not self.closed:
            out += self.transport.get_write_buffer_size()
        return self.decoder.buffered + out

    # ---------------------------------------------------------------- sending

    def send(self, msg: m.Message, buffers: list[Any] | None = None) -> None:
        if self.closed:
            return
        self._out.append(msg)
        if buffers:
            self._out_buffers.extend(buffers)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def send_frame(self, pieces: list[bytes | memoryview], messages: int = 1) -> None:
        """Write a frame encoded beforehand (the same bytes for many peers; it holds
        ``messages`` messages), after the messages queued before it."""
        if self.closed or self.transport is None:
            return
        self.flush()
        self.traffic.messages_sent += messages
        self._write(pieces)

    def last_queued(self) -> m.Message | None:
        """The newest message not yet written, if any (for coalescing)."""
        return self._out[-1] if self._out else None

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.closed or self.transport is None:
            return
        if self.handshake is not None and not self.handshake.may_send:
            return  # sent once our part of the preamble is out
        out, bufs = self._out, self._out_buffers
        self._out, self._out_buffers = [], []
        self.traffic.messages_sent += len(out)
        self._write(encode_frame(out, bufs))

    def _write(self, pieces: list[bytes | memoryview]) -> None:
        lock = self._write_lock
        if lock is None:
            self._write_unlocked(pieces)
        else:
            with lock:
                self._write_unlocked(pieces)

    def _write_unlocked(self, pieces: list[bytes | memoryview]) -> None:
        """Write the pieces of a frame: small ones joined, large ones in chunks as the
        transport drains, behind whatever is still queued."""
        assert self.transport is not None
        traffic = self.traffic
        traffic.frames_sent += 1
        traffic.bytes_sent += sum(map(_nbytes, pieces))
        if not self._wqueue and all(_nbytes(p) <= SMALL_PIECE for p in pieces):
            self.transport.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            return
        views: list[memoryview] = []
        small: list[bytes | memoryview] = []
        for piece in pieces:
            view = memoryview(piece)
            if view.nbytes <= SMALL_PIECE:
                small.append(view)
                continue
            if small:
                views.append(memoryview(b"".join(small)))
                small = []
            views.append(view if view.ndim == 1 and view.itemsize == 1 else view.cast("B"))
        if small:
            views.append(memoryview(b"".join(small)))
        self._wqueue.extend(views)
        self._wqueued += sum(v.nbytes for v in views)
        self._pump()

    def _pump(self) -> None:
        """Write queued pieces, a chunk at a time, until the transport holds some."""
        queue, transport = self._wqueue, self.transport
        assert transport is not None
        while queue and not self._write_paused and not transport.is_closing():
            head = queue[0]
            if head.nbytes <= CHUNK:
                queue.popleft()
                chunk = head
            else:
                chunk, queue[0] = head[:CHUNK], head[CHUNK:]
            self._wqueued -= chunk.nbytes
            transport.write(chunk)
        if not queue and self._close_when_drained and not transport.is_closing():
            transport.close()

    def _pump_locked(self) -> None:
        lock = self._write_lock
        if lock is None:
            self._pump()
        else:
            with lock:
                if self.transport is not None:
                    self._pump()

    # ------------------------------------------------- direct writes from other threads

    def enable_direct_writes(self) -> bool:
        """Let :meth:`write_direct` write frames from other threads (a client's calling
        thread: its submission goes out without waking the loop). Not for TLS (the
        transport encrypts) nor a transport without a socket. Whether it is enabled."""
        transport = self.transport
        if transport is None or self.closed or self.handshake is not None:
            return False
        if transport.get_extra_info("sslcontext") is not None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        # A duplicate: the descriptor stays ours (never another socket's number reused)
        # whenever the transport closes its own; closed with the connection.
        self._direct_fd = os.dup(sock.fileno())
        os.set_blocking(self._direct_fd, False)
        self._write_lock = threading.Lock()
        return True

    def write_direct(self, msgs: list[m.Message]) -> bool:
        """Write ``msgs`` as one frame now, from any thread, if the connection is idle:
        nothing queued here nor in the transport (whatever is, goes first, so this
        waits for the loop: False, and nothing is written). A small frame only (no
        buffers); what the kernel does not take at once is left for the loop to write
        before anything else. Frames never interleave: every write holds the lock."""
        lock = self._write_lock
        if lock is None or self.closed or self._out or self._flush_scheduled:
            return False
        (data,) = encode_frame(msgs)
        if len(data) > SMALL_PIECE:
            return False
        with lock:
            transport = self.transport
            if (
                self.closed
                or self._direct_fd < 0
                or transport is None
                or self._out
                or self._flush_scheduled
                or self._wqueue
                or self._write_paused
                or transport.is_closing()
                or transport.get_write_buffer_size()
            ):
                return False
            try:
                written = os.write(self._direct_fd, data)
            except BlockingIOError:
                written = 0
            except OSError:
                return False  # a broken connection: the loop finds out and closes it
            traffic = self.traffic
            traffic.frames_sent += 1
            traffic.bytes_sent += len(data)
            traffic.messages_sent += len(msgs)
            if written < len(data):
                self.direct_partial_writes += 1
                # The rest goes before anything written after it (_write queues behind
                # it, and later direct writes wait for the queue to empty).
                rest = memoryview(data)[written:]
                self._wqueue.append(rest)
                self._wqueued += rest.nbytes
                self._loop.call_soon_threadsafe(self._pump_locked)
        return True

    def _close_direct_fd(self) -> None:
        lock = self._write_lock
        if lock is None:
            return
        with lock:
            if self._direct_fd >= 0:
                os.close(self._direct_fd)
                self._direct_fd = -1

    def _drop_writes(self) -> None:
        self._wqueue.clear()  # no reference to a sent value outlives the connection
        self._wqueued = 0

    async def drain(self) -> None:
        """Wait until what was sent has been handed to the kernel."""
        while not self.closed and (self._write_paused or self._wqueue):
            if self._paused is None or self._paused.done():
                self._paused = self._loop.create_future()
            await self._paused
        if self.closed:
            raise CommClosedError(self.close_reason or "connection closed")

    async def request(
        self,
        make: Callable[[int], m.Message],
        buffers: list[Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[m.Message, list[memoryview]]:
        """Send the message ``make(request_id)`` and wait for the reply carrying that id."""
        if self.closed:
            raise CommClosedError(self.close_reason or "connection closed")
        rid = next(self._request_ids)
        msg = make(rid)  # first: a message refused here leaves no reply awaited
        fut: asyncio.Future[tuple[m.Message, list[memoryview]]] = self._loop.create_future()
        self._pending[rid] = fut
        self.send(msg, buffers)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(rid, None)

    async def read_frame(self, timeout: float | None = None) -> Frame:
        """Read one frame directly (only while no ``on_frame`` handler is set)."""
        if self._inbox is None:
            self._inbox = asyncio.Queue()
        if self._inbox.empty() and self.closed:
            raise CommClosedError(self.close_reason or "connection closed")
        frame = await asyncio.wait_for(self._inbox.get(), timeout)
        if not frame.messages and self.closed:
            raise CommClosedError(self.close_reason or "connection closed")
        return frame

    def unread(self, frame: Frame) -> None:
        """Put ``frame`` before the frames not yet handled (the messages that came in
        one frame with a reply taken by ``read_frame``)."""
        queued, self._inbox = self._inbox, asyncio.Queue()
        self._inbox.put_nowait(frame)
        while queued is not None and not queued.empty():
            self._inbox.put_nowait(queued.get_nowait())

    def set_handler(self, on_frame: FrameHandler) -> None:
        """Install the frame handler; frames that arrived meanwhile are handled first."""
        self.on_frame = on_frame
        inbox, self._inbox = self._inbox, None
        while inbox is not None and not inbox.empty():
            frame = inbox.get_nowait()
            if frame.messages:
                self._dispatch(frame)

    def abort(self, reason: str) -> None:
        """Tell the peer why, then close."""
        if self.closed:
            return
        if self.handshake is not None:
            self._preamble_failed(reason)
            return
        logger.warning("closing connection to %s: %s", self.peer, reason)
        self.close_reason = reason
        self._out.clear()
        self._out_buffers.clear()
        self._drop_writes()
        self._out.append(m.Refused(reason[:2000]))
        self.flush()
        self.close()

    def close(self) -> None:
        """Close once everything sent so far is written."""
        if self.transport is not None and not self.transport.is_closing():
            self.flush()
            lock = self._write_lock
            if lock is None:
                self._close_transport()
            else:
                with lock:
                    self._close_transport()
        self.closed = True

    def _close_transport(self) -> None:
        assert self.transport is not None
        if self._wqueue:
            self._close_when_drained = True
        else:
            self.transport.close()
        # No direct write after close; the transport writes what it holds on its own
        # descriptor (the duplicate must not keep the socket open once it is done).
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1
