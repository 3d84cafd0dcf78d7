"""Frames: a fixed header, a msgpack body holding a batch of messages, then buffers.

Layout (network byte order)::

    magic  b"SH"         2 bytes
    nbuffers             u16
    body length          u32
    buffer lengths       nbuffers x u64
    body                 msgpack array of tagged messages
    buffers              raw bytes, in order

Like h11, :class:`FrameDecoder` is a pure object: bytes in, batches out. The caller
owns the socket. Every protocol violation raises :class:`ProtocolError`, which the
caller answers by closing that one connection.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgspec

from shoal.protocol.messages import ALL_MESSAGES, AnyMessage, Message

MAGIC = b"SH"
_HEADER = struct.Struct("!2sHI")
_BUFLEN = struct.Struct("!Q")
HEADER_SIZE = _HEADER.size
DEFAULT_MAX_FRAME = 1 << 30  # 1 GiB
MAX_BUFFERS = 1 << 15


class ProtocolError(Exception):
    """The peer sent something that is not a valid shoal frame or message."""


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(list[AnyMessage])


def encode_body(messages: Sequence[Message]) -> bytes:
    return _encoder.encode(messages)


def encode_frame(
    messages: Sequence[Message], buffers: Sequence[bytes | memoryview] = ()
) -> list[bytes | memoryview]:
    """Return the pieces of one frame, ready for ``transport.writelines``."""
    if len(buffers) > MAX_BUFFERS:
        raise ProtocolError(
            f"cannot send {len(buffers)} buffers in one frame (limit {MAX_BUFFERS})"
        )
    body = _encoder.encode(messages)
    header = _HEADER.pack(MAGIC, len(buffers), len(body))
    if not buffers:
        return [header + body]
    lengths = b"".join([_BUFLEN.pack(memoryview(b).nbytes) for b in buffers])
    return [header + lengths + body, *buffers]


def decode_body(body: bytes | memoryview) -> list[Message]:
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as e:
        raise ProtocolError(f"invalid message: {e}") from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"malformed message body: {e}") from None
    except UnicodeDecodeError as e:  # msgspec lets this one through as it is
        raise ProtocolError(f"malformed message body: a string is not UTF-8 ({e})") from None


# The messages whose ``payloads`` own the frame's out-of-band buffers, in message order.
_OWN_BUFFERS = frozenset(t for t in ALL_MESSAGES if "payloads" in t.__struct_fields__)


def _claimed_buffers(messages: list[Message]) -> int:
    n = 0
    for msg in messages:
        if type(msg) in _OWN_BUFFERS:
            for p in msg.payloads:  # type: ignore[attr-defined]
                n += p.nbuffers
    return n


class Frame:
    __slots__ = ("messages", "buffers")

    def __init__(self, messages: list[Message], buffers: list[memoryview]):
        self.messages = messages
        self.buffers = buffers


def message_buffers(frame: Frame) -> list[tuple[Message, list[memoryview]]]:
    """Each message of a frame with the out-of-band buffers its payloads own (the
    frame carries them in message order). ProtocolError, before any message is
    handed out, if the payloads claim other than the buffers the frame carries."""
    buffers = frame.buffers
    claimed = _claimed_buffers(frame.messages)
    if claimed != len(buffers):
        raise ProtocolError(
            f"the payloads of a frame claim {claimed} out-of-band buffers "
            f"but it carries {len(buffers)}"
        )
    out = []
    cursor = 0
    for msg in frame.messages:
        n = _claimed_buffers([msg]) if type(msg) in _OWN_BUFFERS else 0
        out.append((msg, buffers[cursor : cursor + n]))
        cursor += n
    return out


class FrameDecoder:
    """Incremental frame parser. ``feed`` returns every frame completed by ``data``."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME):
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._need: int | None = None  # total size of the frame being read, once known
        self._layout: tuple[int, list[int]] | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        while True:
            frame = self._next_frame()
            if frame is None:
                return frames
            frames.append(frame)

    def _read_layout(self) -> bool:
        buf = self._buf
        if len(buf) < HEADER_SIZE:
            return False
        magic, nbuffers, body_len = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise ProtocolError(f"not a shoal frame (bad magic {bytes(magic)!r})")
        if nbuffers > MAX_BUFFERS:
            raise ProtocolError(f"frame declares {nbuffers} buffers (limit {MAX_BUFFERS})")
        lengths_end = HEADER_SIZE + nbuffers * _BUFLEN.size
        if len(buf) < lengths_end:
            return False
        lengths = [
            _BUFLEN.unpack_from(buf, HEADER_SIZE + i * _BUFLEN.size)[0] for i in range(nbuffers)
        ]
        total = body_len + sum(lengths)
        if total > self.max_frame_size:
            raise ProtocolError(
                f"frame of {total} bytes exceeds the limit of {self.max_frame_size} bytes"
            )
        self._layout = (body_len, lengths)
        self._need = lengths_end + total
        return True

    def _next_frame(self) -> Frame | None:
        if self._need is None and not self._read_layout():
            return None
        assert self._need is not None and self._layout is not None
        if len(self._buf) < self._need:
            return None
        body_len, lengths = self._layout
        start = HEADER_SIZE + len(lengths) * _BUFLEN.size
        if lengths:
            # Buffers are slices of one private bytearray: zero-copy and writable.
            whole = self._buf[: self._need]
            del self._buf[: self._need]
            view = memoryview(whole)
            body = view[start : start + body_len]
            buffers = []
            pos = start + body_len
            for n in lengths:
                buffers.append(view[pos : pos + n])
                pos += n
        else:
            body = bytes(self._buf[start : self._need])  # type: ignore[assignment]
            del self._buf[: self._need]
            buffers = []
        self._need = None
        self._layout = None
        return Frame(decode_body(body), buffers)
