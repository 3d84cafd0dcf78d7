"""Fuzzing the frame decoder and the message decoder.

Whatever bytes arrive, in whatever chunks, :class:`FrameDecoder` either returns
frames of valid messages or raises :class:`ProtocolError`; it never raises anything
else and never holds more than one frame's worth of bytes. Valid frames decode the
same however they are split.

``SHOAL_FUZZ_EXAMPLES`` sets the number of examples per test (a few hundred by
default, to keep CI fast; e.g. ``SHOAL_FUZZ_EXAMPLES=20000`` for a long run).
"""

from __future__ import annotations

import contextlib
import os
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_messages import SAMPLES

from shoal.protocol import messages as m
from shoal.protocol.framing import (
    HEADER_SIZE,
    Frame,
    FrameDecoder,
    ProtocolError,
    decode_body,
    encode_frame,
    message_buffers,
)

EXAMPLES = int(os.environ.get("SHOAL_FUZZ_EXAMPLES", "200"))
fuzz = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEADER = struct.Struct("!2sHI")
BUFLEN = struct.Struct("!Q")
MAX_FRAME = 1 << 16  # small, so that random headers often fall within the limit


def frame_bytes(messages: list[m.Message], buffers: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    return b"".join(bytes(p) for p in encode_frame(messages, buffers))


def with_buffers(messages: list[m.Message]) -> tuple[list[m.Message], list[bytes]]:
    """``messages`` with as many buffers as their payloads claim (a valid frame; a
    DataReply with a lease claims none: they stay in the lender's memory)."""
    n = sum(
        p.nbuffers
        for msg in messages
        if not getattr(msg, "lease", 0)
        for p in getattr(msg, "payloads", ())  # DataReply, UpdateData
    )
    return messages, [bytes([i % 256]) * (i % 7) for i in range(n)]


def decode_all(data: bytes, cuts: list[int], max_frame: int = MAX_FRAME) -> list[Frame]:
    """Feed ``data`` split at ``cuts``; check every outcome is a frame or a
    ProtocolError, and that the decoder never holds more than it may."""
    decoder = FrameDecoder(max_frame)
    frames: list[Frame] = []
    pos = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        chunk = data[pos:cut]
        pos = cut
        frames += decoder.feed(chunk)  # ProtocolError propagates to the caller
        # At most one incomplete frame: its header, buffer lengths and body.
        bound = HEADER_SIZE + 8 * 0xFFFF + max_frame
        assert decoder.buffered <= bound
    for frame in frames:
        assert all(isinstance(msg, m.Message) for msg in frame.messages)
        assert all(isinstance(b, memoryview) for b in frame.buffers)
    return frames


def frame_or_protocol_error(data: bytes, cuts: list[int], max_frame: int = MAX_FRAME) -> None:
    try:
        frames = decode_all(data, cuts, max_frame)
    except ProtocolError as e:
        assert str(e)  # a reason, always
        return
    for frame in frames:  # what handlers do next: split the buffers per message
        try:
            pairs = message_buffers(frame)
        except ProtocolError:
            continue
        assert sum(len(bufs) for _, bufs in pairs) == len(frame.buffers)


samples = st.sampled_from(list(SAMPLES.values()))
batches = st.lists(samples, max_size=5)


@st.composite
def valid_stream(draw: st.DrawFn) -> tuple[list[tuple[list[m.Message], list[bytes]]], bytes]:
    frames = [with_buffers(draw(batches)) for _ in range(draw(st.integers(1, 4)))]
    return frames, b"".join(frame_bytes(msgs, bufs) for msgs, bufs in frames)


def cuts_for(data: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, len(data)), max_size=20)


# --- arbitrary bytes --------------------------------------------------------------------


@fuzz
@given(st.binary(max_size=2000), st.data())
def test_arbitrary_bytes_in_arbitrary_chunks(data: bytes, draw: st.DataObject):
    frame_or_protocol_error(data, draw.draw(cuts_for(data)))


@fuzz
@given(
    st.integers(0, 0xFFFF),
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 2**64 - 1), max_size=8),
    st.binary(max_size=200),
)
def test_random_headers_and_lengths(nbuffers: int, body_len: int, lengths: list[int], rest: bytes):
    """Headers with the right magic and any counts and lengths (the declared sizes are
    never trusted: too large is refused from the header alone)."""
    data = HEADER.pack(b"SH", nbuffers, body_len) + b"".join(BUFLEN.pack(n) for n in lengths)
    frame_or_protocol_error(data + rest, [])


# --- valid frames -------------------------------------------------------------------------


@fuzz
@given(valid_stream(), st.data())
def test_valid_frames_split_anywhere_decode_the_same(case, draw: st.DataObject):
    frames, data = case
    got = decode_all(data, draw.draw(cuts_for(data)), max_frame=1 << 30)
    assert [(f.messages, [bytes(b) for b in f.buffers]) for f in got] == frames
    for frame in got:
        message_buffers(frame)  # the buffers are exactly those the payloads claim


@fuzz
@given(valid_stream(), st.data())
def test_mutated_valid_frames(case, draw: st.DataObject):
    """Bit flips, overwritten, inserted and deleted bytes, and truncation of valid
    frames of every message type."""
    _, data = case
    buf = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 8))):
        op = draw.draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        i = draw.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[i] ^= 1 << draw.draw(st.integers(0, 7))
        elif op == "set" and buf:
            buf[i] = draw.draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0xC0, 0xC1, 0xDC, 0xDD]))
        elif op == "insert":
            buf[i:i] = draw.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and buf:
            del buf[i : i + draw.draw(st.integers(1, 8))]
    if draw.draw(st.booleans()):
        buf = buf[: draw.draw(st.integers(0, len(buf)))]
    frame_or_protocol_error(bytes(buf), draw.draw(cuts_for(bytes(buf))), max_frame=1 << 20)


# --- the message decoder -------------------------------------------------------------------

tags = st.sampled_from([t.__name__ for t in m.ALL_MESSAGES] + ["Payload", "TaskSpec", "Nope"])
atoms = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | tags
)
values = st.recursive(
    atoms,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=4) | st.integers(-5, 5), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def message_shaped(draw: st.DrawFn) -> list[object]:
    """A real tag followed by fields, often of plausible types, so that decoding goes
    deep into each message's validation."""
    sample = draw(samples)
    fields = list(msgspec.structs.astuple(sample))
    as_plain = msgspec.msgpack.decode(msgspec.msgpack.encode(fields))
    for i in range(len(as_plain)):
        if draw(st.integers(0, 3)) == 0:
            as_plain[i] = draw(values)
    cut = draw(st.integers(0, len(as_plain)))
    return [type(sample).__name__, *as_plain[: cut if draw(st.booleans()) else len(as_plain)]]


@fuzz
@given(st.lists(message_shaped() | st.lists(values, max_size=4), max_size=3))
def test_message_decoder_on_msgpack_shaped_values(batch: list[object]):
    body = msgspec.msgpack.encode(batch)
    try:
        messages = decode_body(body)
    except ProtocolError as e:
        assert "message" in str(e)
        return
    assert len(messages) == len(batch)
    for msg in messages:
        assert isinstance(msg, m.Message)
        for key in _keys_of(msg):
            hash(key)  # every decoded key can index the scheduler's dicts


def _keys_of(msg: m.Message) -> list[object]:
    keys: list[object] = []
    for name in ("key", "blamed"):
        if getattr(msg, name, None) is not None:
            keys.append(getattr(msg, name))
    for name in ("keys", "missing", "wanted"):
        keys += getattr(msg, name, [])
    return keys


def test_a_string_that_is_not_utf8_is_a_protocol_error():
    """Found by the mutation fuzzer: msgspec raises UnicodeDecodeError, not a
    DecodeError, for such a string, which escaped the connection's handling."""
    body = msgspec.msgpack.encode([["Refused", "ab"]]).replace(b"ab", b"\xff\xfe")
    with pytest.raises(ProtocolError, match="not UTF-8"):
        FrameDecoder().feed(HEADER.pack(b"SH", 0, len(body)) + body)


@fuzz
@given(st.binary(max_size=500))
def test_message_decoder_on_arbitrary_bytes(body: bytes):
    with contextlib.suppress(ProtocolError):
        decode_body(body)
