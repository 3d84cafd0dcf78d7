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

Limits: the body is bounded by ``max_frame_size`` (1 GiB by default), checked from the
header before anything is allocated; the out-of-band buffers, which carry the data
(arrays, large bytes), are bounded separately (by default by the machine's physical
memory), so results and transfers of any size fit in one frame. Peers are
authenticated before their first frame is decoded.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from shoal.protocol.messages import ALL_MESSAGES, AnyMessage, Message, Payload
from shoal.protocol.serialize import BYTES, PICKLE

MAGIC = b"SH"
_HEADER = struct.Struct("!2sHI")
_BUFLEN = struct.Struct("!Q")
HEADER_SIZE = _HEADER.size
# Bounds the header, buffer lengths and msgpack body of a frame (what is allocated
# before a frame is known to be valid); out-of-band buffers have a bound of their own.
DEFAULT_MAX_FRAME = 1 << 30  # 1 GiB
SCRATCH_SIZE = 1 << 18  # bytes read at once while not inside a buffer
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


def _carries_buffers(msg: Message) -> bool:
    """Its payloads' buffers travel in the frame (not lent: see ``DataReply.lease``)."""
    return type(msg) in _OWN_BUFFERS and not getattr(msg, "lease", 0)


def _claimed_buffers(messages: list[Message]) -> int:
    n = 0
    for msg in messages:
        if _carries_buffers(msg):
            for p in msg.payloads:  # type: ignore[attr-defined]
                n += p.nbuffers
    return n


# What each out-of-band buffer becomes on receipt: the whole of a bytes payload (a
# ``bytes`` built in place), a buffer of a pickled value (recyclable memory), or other.
BYTES_BUFFER, PICKLED_BUFFER, OTHER_BUFFER = "bytes", "pickled", "other"


def buffer_roles(payloads: Sequence[Payload]) -> list[str]:
    """The role of each buffer the payloads own, in order."""
    roles: list[str] = []
    for p in payloads:
        if p.kind == BYTES and p.nbuffers == 1 and not p.data:
            roles.append(BYTES_BUFFER)
        else:
            roles.extend([PICKLED_BUFFER if p.kind == PICKLE else OTHER_BUFFER] * p.nbuffers)
    return roles


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
        n = _claimed_buffers([msg])
        out.append((msg, buffers[cursor : cursor + n]))
        cursor += n
    return out


class FrameDecoder:
    """Incremental frame parser. ``feed`` returns every frame completed by ``data``.

    The body is bounded by ``max_frame_size``, checked from the header alone (the
    header and buffer lengths before it are bounded by ``MAX_BUFFERS``). Out-of-band buffers are bounded by ``max_buffer_size`` (in all,
    per frame; by default this machine's physical memory), checked at the same point.
    The body is decoded as soon as it is complete, so a malformed body is refused
    before any buffer is allocated.

    Each out-of-band buffer gets its own final allocation, made when its first byte
    arrives: a ``bytearray`` (arrays rebuilt from it are writable), or a ``bytes`` for
    the buffer of a bytes payload (see :func:`shoal.protocol.serialize.dumps_value`).
    Besides ``feed`` (bytes in), the decoder offers the ``asyncio.BufferedProtocol``
    pair: :meth:`get_buffer` hands out where the next bytes go (a view into the
    buffer being read, so the kernel writes large data straight into place; a small
    scratch area otherwise) and :meth:`buffer_updated` takes note of what was written.

    ``allocator``, when given, is asked first for the buffers of pickled values (not
    bytes payloads, which own their storage): ``allocator(n)`` returns an object of
    ``n`` bytes and a writable view of them (every byte is written before the frame
    is returned), or None to let the decoder allocate as above. It may recycle memory
    (:mod:`shoal.comm.buffer_pool`) as long as nothing can still see it.
    """

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME,
        max_buffer_size: int | None = None,
        scratch_size: int = SCRATCH_SIZE,
        allocator: Callable[[int], tuple[Any, memoryview] | None] | None = None,
    ):
        self.allocator = allocator
        self.max_frame_size = max_frame_size
        self.max_buffer_size = physical_memory() if max_buffer_size is None else max_buffer_size
        self._buf = bytearray()  # received, not yet consumed
        self._scratch = bytearray(scratch_size)
        self._scratch_view = memoryview(self._scratch)
        self._layout: tuple[int, int, list[int]] | None = None  # prefix, body, buffers
        self._messages: list[Message] | None = None  # decoded body of the frame being read
        self._bytes_at: frozenset[int] = frozenset()  # buffers that become ``bytes``
        self._pickled_at: frozenset[int] = frozenset()  # buffers of pickled values
        self._buffers: list[memoryview] = []  # the completed buffers of that frame
        self._target: Any = None  # the allocation of the buffer being read
        self._target_view: memoryview | None = None  # a writable view of it
        self._filled = 0  # bytes of it written
        self._held = 0  # bytes of the unfinished frame consumed from the input
        self._direct = False  # get_buffer handed out a view into the target

    @property
    def buffered(self) -> int:
        """Bytes received and held that no returned frame holds yet."""
        return len(self._buf) + self._held

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        self._buf += data
        return self._frames()

    # ------------------------------------------------------------ BufferedProtocol pair

    def get_buffer(self) -> memoryview:
        """A writable, non-empty view for the next bytes received."""
        view = self._target_view
        if view is not None and not self._buf:
            self._direct = True
            return view[self._filled :]
        self._direct = False
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """``nbytes`` were written at the start of the view :meth:`get_buffer` returned."""
        if not self._direct:
            return self.feed(self._scratch_view[:nbytes])
        self._direct = False
        self._filled += nbytes
        self._held += nbytes
        return self._frames()

    # ------------------------------------------------------------ parsing

    def _read_layout(self) -> bool:
        buf = self._buf
        if len(buf) < HEADER_SIZE:
            return False
        magic, nbuffers, body_len = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise ProtocolError(f"not a shoal frame (bad magic {bytes(magic)!r})")
        if nbuffers > MAX_BUFFERS:
            raise ProtocolError(f"frame declares {nbuffers} buffers (limit {MAX_BUFFERS})")
        if body_len > self.max_frame_size:
            raise ProtocolError(
                f"frame of {body_len} bytes exceeds the limit of {self.max_frame_size} bytes"
            )
        lengths_end = HEADER_SIZE + nbuffers * _BUFLEN.size
        if len(buf) < lengths_end:
            return False
        lengths = list(struct.unpack_from(f"!{nbuffers}Q", buf, HEADER_SIZE))
        total = sum(lengths)
        if total > self.max_buffer_size:
            raise ProtocolError(
                f"out-of-band buffers of {total} bytes exceed the limit of "
                f"{self.max_buffer_size} bytes for buffers"
            )
        self._layout = (lengths_end + body_len, body_len, lengths)
        return True

    def _frames(self) -> list[Frame]:
        frames: list[Frame] = []
        while True:
            frame = self._next_frame()
            if frame is None:
                return frames
            frames.append(frame)

    def _next_frame(self) -> Frame | None:
        if self._messages is None:
            if self._layout is None and not self._read_layout():
                return None
            assert self._layout is not None
            prefix, body_len, lengths = self._layout
            buf = self._buf
            if len(buf) < prefix:
                return None
            view = memoryview(buf)
            body = view[prefix - body_len : prefix]
            try:
                messages = decode_body(body)
            finally:
                body.release()
                view.release()
            del buf[:prefix]
            if not lengths:
                self._layout = None
                return Frame(messages, [])
            self._messages = messages
            self._bytes_at = _bytes_buffers(messages)
            self._pickled_at = _pickled_buffers(messages) if self.allocator else frozenset()
            self._held = prefix
        return self._read_buffers()

    def _read_buffers(self) -> Frame | None:
        assert self._layout is not None and self._messages is not None
        lengths = self._layout[2]
        buffers = self._buffers
        buf = self._buf
        while len(buffers) < len(lengths):
            i = len(buffers)
            n = lengths[i]
            if self._target_view is None:
                if not buf and n:  # allocate once its first byte is here
                    return None
                lent = self.allocator(n) if i in self._pickled_at else None  # type: ignore[misc]
                if lent is None:
                    lent = allocate(n, i in self._bytes_at)
                self._target, self._target_view = lent
                self._filled = 0
            target = self._target_view
            if buf and self._filled < n:
                take = min(len(buf), n - self._filled)
                target[self._filled : self._filled + take] = memoryview(buf)[:take]
                del buf[:take]
                self._filled += take
                self._held += take
            if self._filled < n:
                return None
            target.release()
            obj = self._target
            buffers.append(memoryview(obj))
            self._target = self._target_view = None
        frame = Frame(self._messages, buffers)
        self._messages = None
        self._layout = None
        self._buffers = []
        self._bytes_at = self._pickled_at = frozenset()
        self._held = 0
        return frame


def physical_memory() -> int:
    """This machine's physical memory in bytes (1 TiB if it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 40


def _frame_roles(messages: list[Message]) -> list[str]:
    roles: list[str] = []
    for msg in messages:
        if _carries_buffers(msg):
            roles.extend(buffer_roles(msg.payloads))  # type: ignore[attr-defined]
    return roles


def _bytes_buffers(messages: list[Message]) -> frozenset[int]:
    """The indices of the frame's buffers that are the whole of a bytes payload."""
    return frozenset(i for i, r in enumerate(_frame_roles(messages)) if r == BYTES_BUFFER)


def _pickled_buffers(messages: list[Message]) -> frozenset[int]:
    """The indices of the frame's out-of-band buffers of pickled values."""
    return frozenset(i for i, r in enumerate(_frame_roles(messages)) if r == PICKLED_BUFFER)


# Uninitialised allocations: every byte is written from the socket before anyone sees
# the object (the C idiom ``PyBytes_FromStringAndSize(NULL, n)``), so neither a memset
# nor a copy into a ``bytes`` afterwards is paid. Large ones come from mmap: their
# pages are only committed as data arrives, and go back to the system when freed.
_DIRECT_MIN = 1 << 16
_new_bytes: Any = None
_new_bytearray: Any = None
if sys.implementation.name == "cpython":  # pragma: no branch
    try:
        _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
        _new_bytes.restype = ctypes.py_object
        _new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
        _new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
        _new_bytearray.restype = ctypes.py_object
        _new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    except (AttributeError, OSError):  # pragma: no cover
        _new_bytes = _new_bytearray = None
_BYTES_DATA_OFFSET = bytes.__basicsize__ - 1  # offsetof(PyBytesObject, ob_sval)


def allocate(n: int, as_bytes: bool) -> tuple[Any, memoryview]:
    """A new object of ``n`` bytes and a writable view of its storage."""
    try:
        if n < _DIRECT_MIN or _new_bytearray is None:
            obj: Any = bytearray(n)
            return obj, memoryview(obj)
        if as_bytes and _new_bytes is not None:
            obj = _new_bytes(None, n)
            address = id(obj) + _BYTES_DATA_OFFSET
            raw = (ctypes.c_char * n).from_address(address)
            advise_huge_pages(address, n)
            return obj, memoryview(raw).cast("B")
        obj = _new_bytearray(None, n)
        if n >= HUGE_PAGE_MIN:
            advise_huge_pages(ctypes.addressof(ctypes.c_char.from_buffer(obj)), n)
        return obj, memoryview(obj)
    except (MemoryError, SystemError) as e:
        raise ProtocolError(
            f"cannot allocate a buffer of {n} bytes: {e or 'out of memory'}"
        ) from None


# Huge pages for large receive buffers. The kernel writes received data into pages it
# must first fault in and zero; a fresh 4 KiB page per fault costs more than the copy
# itself (a loopback socket moves about half as much per second into fresh memory as
# into memory already touched). Where transparent huge pages are on for regions that
# ask (``madvise`` mode), the 2 MiB-aligned interior of a large buffer is advised
# ``MADV_HUGEPAGE``: it faults 2 MiB at a time, 512 times fewer faults. The advice only
# changes how pages are faulted in: the allocation is still the object's own (malloc,
# an mmap of its own for sizes this large), and goes back to the system when freed.
# Without ``madvise`` or THP (another OS, a kernel without it), nothing is advised.
HUGE_PAGE = 1 << 21
HUGE_PAGE_MIN = 2 * HUGE_PAGE  # smaller buffers may hold no aligned 2 MiB at all
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)
_madvise: Any = None
if _MADV_HUGEPAGE is not None and sys.platform.startswith("linux"):  # pragma: no branch
    try:
        _madvise = ctypes.CDLL(None, use_errno=True).madvise
        _madvise.restype = ctypes.c_int
        _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    except (AttributeError, OSError):  # pragma: no cover - no libc madvise
        _madvise = None


def advise_huge_pages(address: int, n: int) -> int:
    """Advise ``MADV_HUGEPAGE`` for the 2 MiB-aligned interior of ``n`` bytes at
    ``address``; the bytes advised (0 if none: too small, or no madvise here). The
    advice is a hint: an error (THP not built in, say) leaves the memory as it was."""
    if _madvise is None or n < HUGE_PAGE_MIN:
        return 0
    start = (address + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (address + n) & ~(HUGE_PAGE - 1)
    if end <= start:
        return 0
    if _madvise(start, end - start, _MADV_HUGEPAGE) != 0:
        return 0
    return end - start
