"""The authentication preamble: raw bytes exchanged before any frame is decoded.

Every connection opens with both sides writing a fixed-size greeting::

    magic   b"\\xf0SHL"    4 bytes (differs from a frame's b"SH" at the first byte, so
                           a peer that sends a frame straight away fails at once)
    flags                  1 byte  (bit 0: "I have a cluster token")
    nonce                  32 random bytes

Without a token on either side that is all: frames follow at once (the connector
writes its Hello right behind its greeting, so no round trip is added). With a token
on both sides, each proves it knows the token over the other's nonce::

    connector -> listener   HMAC-SHA256(token, b"connector" + listener nonce + connector nonce)
    listener  -> connector  b"\\x01" + HMAC-SHA256(token, b"listener" + connector nonce +
                            listener nonce)   (or b"\\x00" and a Refused frame: wrong token)

The connector writes its Hello right behind its proof, so a token costs one extra
round trip (waiting for the listener's nonce). The label in each HMAC keeps one side's
proof from being replayed as the other's. The listener proves itself too, so a client
never sends work to an impostor.

If only one side has a token, both refuse: a listener cannot admit a peer without
proof, and a connector with a token will not talk to a server that cannot prove it
belongs to the cluster (so a mistyped address never leaks work to a stranger).

Like the frame decoder these are pure objects: bytes in, bytes out, and
:class:`AuthFailed` naming the problem. Nothing the peer sends is deserialised here.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

from shoal.protocol import messages as m
from shoal.protocol.framing import encode_frame

MAGIC = b"\xf0SHL"
NONCE_SIZE = 32
PROOF_SIZE = hashlib.sha256().digest_size
FLAG_TOKEN = 0x01
ACCEPTED = b"\x01"
REFUSED = b"\x00"
_GREETING = struct.Struct(f"!{len(MAGIC)}sB{NONCE_SIZE}s")
GREETING_SIZE = _GREETING.size

WRONG_TOKEN = "wrong cluster token"
TOKEN_REQUIRED = "this cluster requires a token and none was given"


class AuthFailed(Exception):
    """The peer failed the authentication preamble; the message says how."""


def _proof(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, label + first + second, hashlib.sha256).digest()


def refusal_frame(reason: str) -> bytes:
    return b"".join(bytes(piece) for piece in encode_frame([m.Refused(reason[:2000])]))


class _Side:
    def __init__(self, token: str | None, nonce: bytes | None = None):
        if token is not None and not token:
            raise ValueError("a cluster token may not be empty")
        self.key = token.encode() if token else None
        self.nonce = secrets.token_bytes(NONCE_SIZE) if nonce is None else nonce
        self.done = False
        self.may_send = False  # frames may be written (our part of the preamble is out)
        self._buf = bytearray()
        self._peer_nonce: bytes | None = None

    def greeting(self) -> bytes:
        return _GREETING.pack(MAGIC, FLAG_TOKEN if self.key else 0, self.nonce)

    def _take(self, n: int) -> bytes | None:
        if len(self._buf) < n:
            return None
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _read_greeting(self, who: str) -> tuple[int, bytes] | None:
        head = bytes(self._buf[: len(MAGIC)])
        if head != MAGIC[: len(head)]:
            raise AuthFailed(
                f"{who} did not open with shoal's connection preamble "
                "(not shoal, or a shoal of another version)"
            )
        greeting = self._take(GREETING_SIZE)
        if greeting is None:
            return None
        _, flags, nonce = _GREETING.unpack(greeting)
        return flags, nonce

    def _finish(self) -> bytes:
        self.done = self.may_send = True
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


class ListenerHandshake(_Side):
    """The accepting side. ``feed`` returns (bytes to write, bytes for the frame decoder
    once ``done``)."""

    _expects_proof = False  # both sides have a token: the peer waits for a status byte

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        if self.done:
            return b"", data
        self._buf += data
        if self._peer_nonce is None:
            greeting = self._read_greeting("the peer")
            if greeting is None:
                return b"", b""
            flags, self._peer_nonce = greeting
            has_token = bool(flags & FLAG_TOKEN)
            if self.key is None and has_token:
                raise AuthFailed("the peer has a cluster token but this server does not use one")
            if self.key is not None and not has_token:
                raise AuthFailed(TOKEN_REQUIRED)
            if self.key is None:
                return b"", self._finish()
            self._expects_proof = True
        assert self.key is not None
        proof = self._take(PROOF_SIZE)
        if proof is None:
            return b"", b""
        expected = _proof(self.key, b"connector", self.nonce, self._peer_nonce)
        if not hmac.compare_digest(proof, expected):
            raise AuthFailed(WRONG_TOKEN)
        answer = ACCEPTED + _proof(self.key, b"listener", self._peer_nonce, self.nonce)
        return answer, self._finish()

    def refusal(self, reason: str) -> bytes:
        """What to write before closing: a connector that sent its proof reads a status
        byte first; every other peer reads frames."""
        return (REFUSED if self._expects_proof else b"") + refusal_frame(reason)


class ConnectorHandshake(_Side):
    """The connecting side. Frames may be written once ``may_send``; what the listener
    sends is handed to the frame decoder once ``done``."""

    def __init__(self, token: str | None, nonce: bytes | None = None):
        super().__init__(token, nonce)
        self.may_send = self.key is None  # no proof to write: the Hello follows the greeting

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        if self.done:
            return b"", data
        self._buf += data
        out = b""
        if self._peer_nonce is None:
            greeting = self._read_greeting("the server")
            if greeting is None:
                return b"", b""
            flags, self._peer_nonce = greeting
            has_token = bool(flags & FLAG_TOKEN)
            if self.key is None and has_token:
                raise AuthFailed(
                    "the server requires a cluster token and none was given "
                    "(set one with Security(token=...) or the SHOAL_TOKEN variable)"
                )
            if self.key is not None and not has_token:
                raise AuthFailed(
                    "the server does not use a cluster token, so it cannot prove it "
                    "belongs to the cluster this side's token is for"
                )
            if self.key is None:
                return b"", self._finish()
            out = _proof(self.key, b"connector", self._peer_nonce, self.nonce)
            self.may_send = True
        assert self.key is not None
        status = bytes(self._buf[:1])
        if status == REFUSED:
            raise AuthFailed(f"the server refused the connection: {WRONG_TOKEN}")
        if status and status != ACCEPTED:
            raise AuthFailed("the server answered the token proof with garbage")
        answer = self._take(1 + PROOF_SIZE)
        if answer is None:
            return out, b""
        expected = _proof(self.key, b"listener", self.nonce, self._peer_nonce)
        if not hmac.compare_digest(answer[1:], expected):
            raise AuthFailed(
                "the server could not prove it knows the cluster token "
                "(an impostor, or the server of another cluster)"
            )
        return out, self._finish()
