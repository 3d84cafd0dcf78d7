"""Framing: FrameDecoder is a pure bytes-in, frames-out parser; every violation is a
ProtocolError, raised as early as possible and without trusting declared sizes."""

from __future__ import annotations

import struct
import tracemalloc

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.protocol import messages as m
from shoal.protocol.framing import (
    HEADER_SIZE,
    MAX_BUFFERS,
    FrameDecoder,
    ProtocolError,
    decode_body,
    encode_body,
    encode_frame,
    message_buffers,
    physical_memory,
)
from shoal.protocol.serialize import BYTES, dumps_value, loads_value

# The documented layout, written out independently of the implementation.
HEADER = struct.Struct("!2sHI")  # magic, nbuffers, body length
BUFLEN = struct.Struct("!Q")

PAYLOAD = m.Payload(kind=1, data=b"pickled", nbuffers=1)
MESSAGES = [
    m.Hello(version=m.PROTOCOL_VERSION, role="client", name="c"),
    m.Ack(request_id=1, nbytes=[1, 2, 3]),
    m.FreeKeys(keys=["a", ("b", 1), 2], stimulus_id="s"),
    m.KeyInMemory(key=("x", 0), value=m.Payload(kind=0, data=b"\x01")),
    m.TaskFinished(key="t", nbytes=8, start=1.0, stop=2.0, value=PAYLOAD),
    m.Refused(reason="x" * 300),
    m.FunctionDefs(functions={"f" * 24: bytes(range(256)) * 4}),
]


def frame_bytes(messages, buffers=()) -> bytes:
    return b"".join(bytes(piece) for piece in encode_frame(messages, buffers))


def header(nbuffers: int, body_len: int, magic: bytes = b"SH") -> bytes:
    return HEADER.pack(magic, nbuffers, body_len)


def as_tuple(frame):
    return frame.messages, [bytes(b) for b in frame.buffers]


def feed_in_chunks(data: bytes, cuts, max_frame_size=1 << 30):
    decoder = FrameDecoder(max_frame_size)
    frames = []
    pos = 0
    for cut in [*sorted(cuts), len(data)]:
        frames += decoder.feed(data[pos:cut])
        pos = cut
    assert decoder.buffered == 0
    return frames


# --- strategies --------------------------------------------------------------------------

messages_st = st.lists(st.sampled_from(MESSAGES), max_size=4)
buffers_st = st.lists(st.binary(max_size=64), max_size=3)
frame_st = st.tuples(messages_st, buffers_st)


@st.composite
def frames_and_cuts(draw):
    frames = draw(st.lists(frame_st, min_size=1, max_size=4))
    data = b"".join(frame_bytes(msgs, bufs) for msgs, bufs in frames)
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=12))
    return frames, data, cuts


# --- layout ------------------------------------------------------------------------------


def test_layout_matches_documentation():
    body = encode_body([m.Ack(request_id=1)])
    data = frame_bytes([m.Ack(request_id=1)], [b"abc", b"de"])
    assert HEADER_SIZE == 8
    assert data[:HEADER_SIZE] == header(2, len(body))
    assert data[8:16] == BUFLEN.pack(3) and data[16:24] == BUFLEN.pack(2)
    assert data[24 : 24 + len(body)] == body
    assert data[24 + len(body) :] == b"abcde"


def test_encode_frame_pieces():
    big = memoryview(bytearray(b"z" * 1000))
    pieces = encode_frame([m.Ack(request_id=1)], [big, memoryview(b"xy")])
    # Buffers are passed through as separate pieces (zero-copy, for writelines).
    assert len(pieces) == 3
    assert pieces[1] is big
    assert len(encode_frame([m.Ack(request_id=1)])) == 1


def test_encode_body_decode_body():
    assert decode_body(encode_body(MESSAGES)) == MESSAGES
    assert decode_body(memoryview(encode_body(MESSAGES))) == MESSAGES


def test_buffer_lengths_use_nbytes_of_multibyte_views():
    view = memoryview(bytearray(40)).cast("d")  # 5 items, 40 bytes
    [frame] = FrameDecoder().feed(frame_bytes([m.Ack(request_id=1)], [view]))
    assert frame.buffers[0].nbytes == 40


# --- incremental decoding ------------------------------------------------------------------


@settings(max_examples=150)
@given(frames_and_cuts())
def test_random_chunk_splits_decode_the_same(case):
    frames, data, cuts = case
    got = feed_in_chunks(data, cuts)
    assert [as_tuple(f) for f in got] == [(list(msgs), list(bufs)) for msgs, bufs in frames]


@pytest.mark.parametrize("buffers", [[], [b"one", b"", b"three" * 100]], ids=["plain", "bufs"])
def test_byte_by_byte(buffers):
    data = frame_bytes(MESSAGES, buffers) * 2
    decoder = FrameDecoder()
    frames = []
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    assert decoder.buffered == 0
    assert len(frames) == 2
    for frame in frames:
        assert as_tuple(frame) == (MESSAGES, buffers)


def test_several_frames_in_one_feed():
    data = b"".join(
        [
            frame_bytes([MESSAGES[0]]),
            frame_bytes(MESSAGES[1:3], [b"x" * 10]),
            frame_bytes([]),
            frame_bytes(MESSAGES, [b"a", b"b"]),
        ]
    )
    frames = FrameDecoder().feed(data)
    assert [as_tuple(f) for f in frames] == [
        ([MESSAGES[0]], []),
        (MESSAGES[1:3], [b"x" * 10]),
        ([], []),
        (MESSAGES, [b"a", b"b"]),
    ]


def test_feed_accepts_bytes_like():
    data = frame_bytes(MESSAGES, [b"buf"])
    for chunk in (data, bytearray(data), memoryview(data)):
        [frame] = FrameDecoder().feed(chunk)
        assert as_tuple(frame) == (MESSAGES, [b"buf"])


def test_truncated_frame_waits_for_the_rest():
    data = frame_bytes(MESSAGES, [b"abc", b"defg"])
    for n in range(len(data)):
        decoder = FrameDecoder()
        assert decoder.feed(data[:n]) == []  # no frame, no error
        assert decoder.buffered == n
        [frame] = decoder.feed(data[n:])
        assert as_tuple(frame) == (MESSAGES, [b"abc", b"defg"])
        assert decoder.buffered == 0


def test_partial_next_frame_is_kept():
    first, second = frame_bytes([MESSAGES[0]]), frame_bytes([MESSAGES[1]], [b"q"])
    decoder = FrameDecoder()
    [frame] = decoder.feed(first + second[:5])
    assert frame.messages == [MESSAGES[0]]
    assert decoder.buffered == 5
    [frame] = decoder.feed(second[5:])
    assert as_tuple(frame) == ([MESSAGES[1]], [b"q"])


# --- out-of-band buffers -------------------------------------------------------------------


def test_buffers_arrive_intact_and_writable():
    bufs = [bytes(range(256)) * 300, b"", b"tail", bytearray(b"\x00" * 70_000)]
    msgs = [m.DataReply(request_id=1, keys=["a"], payloads=[PAYLOAD])]
    [frame] = FrameDecoder().feed(frame_bytes(msgs, bufs))
    assert frame.messages == msgs
    assert len(frame.buffers) == len(bufs)
    for got, want in zip(frame.buffers, bufs):
        assert isinstance(got, memoryview)
        assert not got.readonly
        assert got.tobytes() == bytes(want)
    # Writable in place, and buffers do not overlap each other.
    frame.buffers[2][:] = b"TAIL"
    assert frame.buffers[2].tobytes() == b"TAIL"
    assert frame.buffers[0].tobytes() == bufs[0]
    assert frame.buffers[3].tobytes() == bytes(bufs[3])


def test_buffers_survive_later_feeds():
    """A frame's buffers stay valid while the decoder keeps parsing later frames."""
    decoder = FrameDecoder()
    [first] = decoder.feed(frame_bytes([MESSAGES[1]], [b"A" * 1000]))
    decoder.feed(frame_bytes([MESSAGES[1]], [b"B" * 1000]) * 3)
    assert first.buffers[0].tobytes() == b"A" * 1000


# --- reading into place (the asyncio.BufferedProtocol pair) -----------------------------------


def read_like_a_socket(decoder, data: bytes, most: int):
    """Write ``data`` as a socket would: into whatever ``get_buffer`` returns, at most
    ``most`` bytes a time. Returns the frames and the objects the views wrote into."""
    frames, targets = [], []
    pos = 0
    while pos < len(data):
        view = decoder.get_buffer()
        assert len(view) > 0 and not view.readonly
        n = min(len(view), most, len(data) - pos)
        view[:n] = data[pos : pos + n]
        targets.append(view.obj)
        del view
        pos += n
        frames += decoder.buffer_updated(n)
    return frames, targets


BIG = bytes(range(256)) * 1200  # 307,200 bytes: large enough to be read in place


@pytest.mark.parametrize("most", [13, 4096, 65_536, 1 << 22])
def test_large_buffers_are_read_in_place(most):
    bufs = [b"small", BIG, b"", BIG[::-1]]
    msgs = [m.Ack(request_id=7)]
    data = frame_bytes(msgs, bufs) + frame_bytes([m.Ack(request_id=8)]) * 2
    decoder = FrameDecoder()
    frames, targets = read_like_a_socket(decoder, data, most)
    assert [as_tuple(f) for f in frames] == [
        (msgs, bufs),
        ([m.Ack(request_id=8)], []),
        ([m.Ack(request_id=8)], []),
    ]
    assert decoder.buffered == 0
    big = frames[0].buffers[1]
    assert not big.readonly and type(big.obj) is bytearray and len(big.obj) == len(BIG)
    # Past the first read, the socket wrote into the buffer's own allocation.
    assert sum(t is big.obj for t in targets) >= (len(BIG) - SCRATCH) // min(most, len(BIG))
    assert frames[0].buffers[3].obj is not big.obj


SCRATCH = 1 << 18


def test_a_bytes_payload_is_received_as_bytes_in_place():
    value = b"q" * 100_000 + b"end"
    payload, bufs = dumps_value(value)
    assert payload.kind == BYTES and len(bufs) == 1 and bufs[0].obj is value  # zero-copy
    msgs = [m.DataReply(request_id=1, keys=["k"], payloads=[payload])]
    data = frame_bytes(msgs, bufs)
    for most in (1000, 1 << 20):
        decoder = FrameDecoder()
        [frame], targets = read_like_a_socket(decoder, data, most)
        [(msg, got)] = message_buffers(frame)
        assert type(got[0].obj) is bytes and got[0].readonly
        result = loads_value(msg.payloads[0], got)
        assert result is got[0].obj  # no copy on receipt
        assert result == value and hash(result) == hash(value)
    # fed as bytes, the same
    [frame] = FrameDecoder().feed(data)
    assert loads_value(frame.messages[0].payloads[0], frame.buffers) == value


@pytest.mark.parametrize(
    "value",
    [
        b"x" * 70_000,
        bytearray(b"y" * 70_000),
        memoryview(b"z" * 80_000),
        memoryview(bytearray(80_000)).cast("d"),
        memoryview(bytes(range(256)) * 300).cast("B", (300, 256)),
    ],
    ids=["bytes", "bytearray", "memoryview", "memoryview-doubles", "memoryview-2d"],
)
def test_bytes_like_values_travel_as_one_buffer(value):
    payload, bufs = dumps_value(value)
    assert payload.kind == BYTES and len(bufs) == 1
    assert len(payload.data) < 100  # the data is not in the body
    msgs = [m.DataReply(request_id=1, keys=["k"], payloads=[payload])]
    [frame] = FrameDecoder().feed(frame_bytes(msgs, bufs))
    back = loads_value(frame.messages[0].payloads[0], frame.buffers)
    assert type(back) is type(value)
    if isinstance(value, memoryview):
        assert (back.format, back.shape, back.readonly) == (
            value.format,
            value.shape,
            value.readonly,
        )
        assert back.tobytes() == value.tobytes()
    else:
        assert back == value


def test_small_bytes_stay_in_the_body():
    payload, bufs = dumps_value(b"x" * 1000)
    assert payload.kind != BYTES and bufs == []
    assert loads_value(payload, bufs) == b"x" * 1000


def test_arrays_arrive_writable_and_in_place():
    np = pytest.importorskip("numpy")
    arr = np.arange(100_000, dtype="f8")
    payload, bufs = dumps_value(arr)
    assert len(bufs) == 1 and bufs[0].nbytes == arr.nbytes
    msgs = [m.DataReply(request_id=1, keys=["k"], payloads=[payload])]
    [frame], _ = read_like_a_socket(FrameDecoder(), frame_bytes(msgs, bufs), 1 << 20)
    back = loads_value(frame.messages[0].payloads[0], frame.buffers)
    assert back.flags.writeable and (back == arr).all()
    back[0] = -1.0
    assert frame.buffers[0].cast("d")[0] == -1.0  # the array is the received buffer


def test_the_decoder_keeps_no_reference_to_a_returned_frame():
    decoder = FrameDecoder()
    data = frame_bytes([m.Ack(request_id=1)], [BIG * 10, b"x"])
    tracemalloc.start()
    try:
        frames, _ = read_like_a_socket(decoder, data, 1 << 16)
        held, _ = tracemalloc.get_traced_memory()
        del frames, _
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held > len(BIG) * 10
    assert after < held - len(BIG) * 10
    assert decoder.buffered == 0


def test_split_anywhere_around_large_buffers():
    """Two feeds, cut at every byte of the header, lengths, body and the edges of each
    buffer (and every 997th byte inside them)."""
    payload, bbufs = dumps_value(b"b" * 70_001)
    msgs = [m.DataReply(request_id=1, keys=["k", "j"], payloads=[payload, PAYLOAD])]
    bufs = [*bbufs, BIG]
    data = frame_bytes(msgs, bufs)
    prefix = len(data) - sum(len(b) for b in bufs)
    edges = [prefix, prefix + 70_001, len(data)]
    cuts = set(range(prefix + 3))
    for e in edges:
        cuts.update(range(max(0, e - 3), min(len(data), e + 4)))
    cuts.update(range(0, len(data), 997))
    for cut in sorted(cuts):
        decoder = FrameDecoder()
        frames = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        [frame] = frames
        assert frame.messages == msgs
        assert [bytes(b) for b in frame.buffers] == [bytes(b) for b in bufs]
        assert type(frame.buffers[0].obj) is bytes
        assert decoder.buffered == 0


def test_many_frames_with_large_buffers_in_one_feed():
    chunks, want = [], []
    for i in range(6):
        bufs = [bytes([i]) * (70_000 + i), b"s" * i] if i % 2 else []
        msgs = [m.Ack(request_id=i)]
        chunks.append(frame_bytes(msgs, bufs))
        want.append((msgs, bufs))
    data = b"".join(chunks)
    assert [as_tuple(f) for f in FrameDecoder().feed(data)] == want
    frames, _ = read_like_a_socket(FrameDecoder(), data, 1 << 30)
    assert [as_tuple(f) for f in frames] == want


def test_encoder_refuses_too_many_buffers():
    with pytest.raises(ProtocolError, match="buffers"):
        encode_frame([], [b""] * (MAX_BUFFERS + 1))


def test_max_buffers_is_accepted():
    bufs = [bytes([i % 256]) for i in range(MAX_BUFFERS)]
    [frame] = FrameDecoder().feed(frame_bytes([], bufs))
    assert len(frame.buffers) == MAX_BUFFERS
    assert frame.buffers[-1].tobytes() == bufs[-1]


# --- limits and violations ----------------------------------------------------------------


def test_body_at_the_limit_is_accepted_and_one_byte_more_refused():
    msgs = [m.Refused(reason="r" * 100)]
    body_len = len(encode_body(msgs))
    data = frame_bytes(msgs, [b"12345"])
    [frame] = FrameDecoder(max_frame_size=body_len).feed(data)
    assert frame.messages == msgs
    with pytest.raises(ProtocolError, match=f"frame of {body_len} bytes exceeds the limit"):
        FrameDecoder(max_frame_size=body_len - 1).feed(data)


def test_buffers_are_not_bounded_by_the_frame_limit():
    """The frame limit protects what is allocated before a frame is known to be valid
    (the body); out-of-band data of any size passes, bounded on its own."""
    msgs = [m.Ack(request_id=1)]
    body_len = len(encode_body(msgs))
    bufs = [b"a" * 5000, b"b" * 70_000, b""]
    data = frame_bytes(msgs, bufs)
    [frame] = FrameDecoder(max_frame_size=body_len, max_buffer_size=75_000).feed(data)
    assert as_tuple(frame) == (msgs, bufs)
    with pytest.raises(ProtocolError, match="buffers of 75000 bytes exceed the limit of 74999"):
        FrameDecoder(max_frame_size=body_len, max_buffer_size=74_999).feed(data)


def test_buffers_over_one_gib_declared_are_accepted():
    """A header declaring 1.5 GiB of buffers (over the old 1 GiB frame limit) is
    accepted, and nothing is allocated until the buffer's data arrives."""
    body = encode_body([m.Ack(request_id=1)])
    n = 3 * 2**29
    decoder = FrameDecoder(max_buffer_size=2**31)
    tracemalloc.start()
    try:
        assert decoder.feed(header(1, len(body)) + BUFLEN.pack(n) + body) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert decoder.buffered == HEADER_SIZE + 8 + len(body)


def test_default_buffer_limit_is_physical_memory():
    assert FrameDecoder().max_buffer_size == physical_memory()
    assert 2**20 < physical_memory() < 2**50


def test_oversized_body_raises_after_the_header_alone():
    decoder = FrameDecoder(max_frame_size=1024)
    assert decoder.feed(header(0, 2**32 - 1)[:-1]) == []
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decoder.feed(header(0, 2**32 - 1)[-1:])


def test_oversized_body_raises_before_the_buffer_lengths():
    """A body over the limit is refused from the 8-byte header, even when the frame
    declares many buffers whose lengths have not arrived."""
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(ProtocolError, match=f"frame of {2**20} bytes exceeds the limit of 1024"):
        decoder.feed(header(MAX_BUFFERS, 2**20))


@pytest.mark.parametrize("max_buffer_size", [None, 1 << 30])
def test_oversized_buffer_raises_without_allocating(max_buffer_size):
    """Declare a 2**40-byte buffer: refused as soon as the lengths are known, and the
    declared size is never allocated (it could not be: 1 TiB)."""
    data = header(1, 10) + BUFLEN.pack(2**40)
    decoder = FrameDecoder(max_frame_size=1 << 20, max_buffer_size=max_buffer_size)
    limit = physical_memory() if max_buffer_size is None else max_buffer_size
    tracemalloc.start()
    try:
        assert decoder.feed(data[:-1]) == []
        with pytest.raises(
            ProtocolError, match=f"buffers of {2**40} bytes exceed the limit of {limit} bytes"
        ):
            decoder.feed(data[-1:])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_oversized_sum_of_buffers_is_refused():
    data = header(3, 10) + BUFLEN.pack(400) * 3
    with pytest.raises(ProtocolError, match="buffers of 1200 bytes exceed the limit of 1000"):
        FrameDecoder(max_buffer_size=1000).feed(data)


def test_buffer_lengths_summing_past_2_64_are_refused():
    data = header(3, 0) + BUFLEN.pack(2**64 - 1) * 3
    with pytest.raises(ProtocolError, match=f"buffers of {3 * (2**64 - 1)} bytes"):
        FrameDecoder().feed(data)


def test_malformed_body_is_refused_before_any_buffer_is_allocated():
    """The body comes before the buffers and is decoded first: a bad body with a
    large declared buffer behind it allocates nothing of the buffer."""
    body = b"\xc1"
    decoder = FrameDecoder(max_buffer_size=2**31)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="malformed"):
            decoder.feed(header(1, len(body)) + BUFLEN.pack(2**30) + body + b"x" * 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_truncated_buffer_lengths_wait():
    decoder = FrameDecoder()
    data = frame_bytes([m.Ack(request_id=1)], [b"a", b"bb", b"ccc"])
    for n in range(HEADER_SIZE, HEADER_SIZE + 24):
        assert FrameDecoder().feed(data[:n]) == []
    [frame] = decoder.feed(data)
    assert as_tuple(frame) == ([m.Ack(request_id=1)], [b"a", b"bb", b"ccc"])


@pytest.mark.parametrize("magic", [b"XX", b"sh", b"HS", b"\x00\x00", b"GE"])
def test_bad_magic(magic):
    data = header(0, 1, magic=magic)
    decoder = FrameDecoder()
    assert decoder.feed(data[:-1]) == []  # not enough to judge yet
    with pytest.raises(ProtocolError, match="bad magic"):
        decoder.feed(data[-1:])


def test_http_request_is_refused():
    with pytest.raises(ProtocolError, match="bad magic"):
        FrameDecoder().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_bad_frame_after_good_frames_is_refused():
    data = frame_bytes([MESSAGES[0]]) + b"XX" + b"\x00" * 10
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(data)


def test_too_many_buffers_declared_raises_after_the_header():
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="buffers"):
        decoder.feed(header(MAX_BUFFERS + 1, 0))
    with pytest.raises(ProtocolError, match="buffers"):
        FrameDecoder().feed(header(0xFFFF, 0))


def test_invalid_body_in_frame_with_buffers():
    body = b"\xc1"
    data = header(1, len(body)) + BUFLEN.pack(3) + body + b"abc"
    with pytest.raises(ProtocolError, match="malformed"):
        FrameDecoder().feed(data)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_raises_protocol_error_or_waits(data):
    decoder = FrameDecoder(max_frame_size=1 << 16)
    try:
        frames = decoder.feed(data)
    except ProtocolError:
        return
    assert isinstance(frames, list)


@settings(max_examples=300)
@given(st.integers(0, 4), st.binary(max_size=300), st.lists(st.integers(0, 64), max_size=4))
def test_garbage_body_behind_valid_header(nbuffers, body, lengths):
    """Random bodies (with a valid header, so that the body is actually parsed)."""
    lengths = (lengths + [0] * nbuffers)[:nbuffers]
    data = header(nbuffers, len(body)) + b"".join(BUFLEN.pack(n) for n in lengths) + body
    data += b"\x00" * sum(lengths)
    try:
        frames = FrameDecoder().feed(data)
    except ProtocolError:
        return
    [frame] = frames
    assert all(isinstance(msg, m.Message) for msg in frame.messages)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from([t.__name__ for t in m.ALL_MESSAGES])
    | st.binary(max_size=10),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150)
@given(st.lists(st.lists(msgpack_values, max_size=6), max_size=3))
def test_structured_garbage_raises_protocol_error_or_decodes(batch):
    """Well-formed msgpack that is (usually) not a valid batch: tags are real message
    names, so decoding goes deep into validation."""
    body = msgspec.msgpack.encode(batch)
    try:
        frames = FrameDecoder().feed(header(0, len(body)) + body)
    except ProtocolError:
        return
    [frame] = frames
    assert all(isinstance(msg, m.Message) for msg in frame.messages)


def test_deeply_nested_body_is_a_protocol_error():
    body = b"\x91\x92\xa8FreeKeys\x91" + b"\x91" * 100_000 + b"\x01"
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(header(0, len(body)) + body)


# --- version ---------------------------------------------------------------------------------


def test_hello_carries_the_protocol_version():
    """A version mismatch is the handshake's concern (comm/); here only that Hello
    carries a version and that the version is a positive int."""
    assert type(m.PROTOCOL_VERSION) is int
    assert m.PROTOCOL_VERSION >= 1
    hello = m.Hello(version=m.PROTOCOL_VERSION, role="client")
    [frame] = FrameDecoder().feed(frame_bytes([hello]))
    [back] = frame.messages
    assert isinstance(back, m.Hello) and back.version == m.PROTOCOL_VERSION
    # version is required: a Hello without one does not decode
    body = msgspec.msgpack.encode([["Hello"]])
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(header(0, len(body)) + body)
