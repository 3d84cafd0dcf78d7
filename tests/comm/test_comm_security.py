"""The authentication preamble as pure objects, and the Security settings."""

from __future__ import annotations

import ipaddress
import os
import ssl
import stat
from pathlib import Path

import pytest

from shoal.comm.handshake import (
    ACCEPTED,
    GREETING_SIZE,
    PROOF_SIZE,
    REFUSED,
    TOKEN_REQUIRED,
    WRONG_TOKEN,
    AuthFailed,
    ConnectorHandshake,
    ListenerHandshake,
)
from shoal.comm.security import Security
from shoal.comm.tcp import format_address, split_address
from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder

FRAME_BYTES = b"SH-the-first-frame"  # stands for whatever follows the preamble


def run_preamble(
    listener: ListenerHandshake, connector: ConnectorHandshake, chunk: int = 1 << 20
) -> tuple[bytes, bytes]:
    """Shuttle bytes between the two until both are done, ``chunk`` bytes at a time.
    The connector writes FRAME_BYTES as soon as it may; the listener writes them after
    its answer. Returns what each side handed on to its frame decoder."""
    to_listener = connector.greeting() + (FRAME_BYTES if connector.may_send else b"")
    to_connector = listener.greeting()
    got_listener, got_connector = b"", b""
    for _ in range(10_000):
        if listener.done and connector.done and not to_listener and not to_connector:
            break
        if to_listener:
            piece, to_listener = to_listener[:chunk], to_listener[chunk:]
            was_done = listener.done
            out, rest = listener.feed(piece)
            got_listener += rest
            to_connector += out
            if listener.done and not was_done:
                to_connector += FRAME_BYTES
        if to_connector:
            piece, to_connector = to_connector[:chunk], to_connector[chunk:]
            could_send = connector.may_send
            out, rest = connector.feed(piece)
            got_connector += rest
            to_listener += out
            if connector.may_send and not could_send:
                to_listener += FRAME_BYTES
    assert listener.done and connector.done
    return got_listener, got_connector


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_without_a_token_frames_follow_the_greetings(chunk: int) -> None:
    listener, connector = ListenerHandshake(None), ConnectorHandshake(None)
    assert connector.may_send, "without a token the Hello goes out with the greeting"
    assert run_preamble(listener, connector, chunk) == (FRAME_BYTES, FRAME_BYTES)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_with_the_same_token_both_prove_it(chunk: int) -> None:
    listener, connector = ListenerHandshake("s3cret"), ConnectorHandshake("s3cret")
    assert not connector.may_send, "the Hello must wait for the proof"
    assert run_preamble(listener, connector, chunk) == (FRAME_BYTES, FRAME_BYTES)


def test_bytes_behind_the_proof_are_not_taken_by_the_preamble() -> None:
    listener, connector = ListenerHandshake("t"), ConnectorHandshake("t")
    assert listener.feed(connector.greeting()) == (b"", b"")
    proof, _ = connector.feed(listener.greeting())
    assert len(proof) == PROOF_SIZE
    answer, rest = listener.feed(proof + FRAME_BYTES)
    assert rest == FRAME_BYTES and answer[:1] == ACCEPTED
    assert connector.feed(answer + FRAME_BYTES) == (b"", FRAME_BYTES)
    assert listener.feed(b"more") == (b"", b"more")  # done: everything is frames


def test_a_wrong_token_is_refused_by_the_listener_and_reported_by_the_connector() -> None:
    listener, connector = ListenerHandshake("right"), ConnectorHandshake("wrong")
    listener.feed(connector.greeting())
    proof, _ = connector.feed(listener.greeting())
    with pytest.raises(AuthFailed, match=WRONG_TOKEN):
        listener.feed(proof + FRAME_BYTES)
    refusal = listener.refusal(WRONG_TOKEN)
    assert refusal[:1] == REFUSED
    [frame] = FrameDecoder().feed(refusal[1:])
    assert frame.messages == [m.Refused(WRONG_TOKEN)]
    with pytest.raises(AuthFailed, match="refused the connection: wrong cluster token"):
        connector.feed(refusal)


def test_a_missing_token_is_refused_by_both_sides() -> None:
    listener, connector = ListenerHandshake("needed"), ConnectorHandshake(None)
    with pytest.raises(AuthFailed, match=TOKEN_REQUIRED):
        listener.feed(connector.greeting())
    # no proof was sent: the refusal is a plain frame a tokenless peer can read
    [frame] = FrameDecoder().feed(listener.refusal(TOKEN_REQUIRED))
    assert frame.messages == [m.Refused(TOKEN_REQUIRED)]
    with pytest.raises(AuthFailed, match="requires a cluster token and none was given"):
        connector.feed(listener.greeting())


def test_a_token_is_not_offered_to_a_server_without_one() -> None:
    listener, connector = ListenerHandshake(None), ConnectorHandshake("mine")
    with pytest.raises(AuthFailed, match="does not use a cluster token"):
        connector.feed(listener.greeting())
    with pytest.raises(AuthFailed, match="has a cluster token but this server does not"):
        listener.feed(connector.greeting())


def test_an_impostor_server_cannot_prove_the_token() -> None:
    connector = ConnectorHandshake("cluster")
    impostor = ListenerHandshake("guess")
    connector.feed(impostor.greeting())
    fake_answer = ACCEPTED + os.urandom(PROOF_SIZE)
    with pytest.raises(AuthFailed, match="could not prove it knows the cluster token"):
        connector.feed(fake_answer)


def test_a_connectors_proof_cannot_be_reflected_as_the_servers() -> None:
    # An impostor that reuses the connector's nonce as its own and echoes the
    # connector's proof back: the labels in the HMACs make the two proofs differ.
    connector = ConnectorHandshake("cluster")
    reflector = ListenerHandshake("anything", nonce=connector.nonce)
    proof, _ = connector.feed(reflector.greeting())
    with pytest.raises(AuthFailed, match="could not prove"):
        connector.feed(ACCEPTED + proof)


@pytest.mark.parametrize(
    "first_bytes",
    [b"S", b"GET / HTTP/1.1\r\n", b"\x16\x03\x01"],  # an old shoal's frame, HTTP, a TLS hello
)
def test_a_peer_without_the_preamble_fails_at_its_first_byte(first_bytes: bytes) -> None:
    listener = ListenerHandshake("t")
    with pytest.raises(AuthFailed, match="did not open with shoal's connection preamble"):
        listener.feed(first_bytes)
    connector = ConnectorHandshake(None)
    with pytest.raises(AuthFailed, match="did not open with shoal's connection preamble"):
        connector.feed(first_bytes)


def test_a_partial_greeting_waits_for_more() -> None:
    listener, connector = ListenerHandshake(None), ConnectorHandshake(None)
    greeting = connector.greeting()
    assert len(greeting) == GREETING_SIZE
    assert listener.feed(greeting[:-1]) == (b"", b"")
    assert not listener.done
    assert listener.feed(greeting[-1:] + b"x") == (b"", b"x")
    assert listener.done


def test_nonces_are_fresh() -> None:
    assert ListenerHandshake("t").nonce != ListenerHandshake("t").nonce


def test_an_empty_token_is_an_error() -> None:
    with pytest.raises(ValueError, match="may not be empty"):
        ListenerHandshake("")
    with pytest.raises(ValueError, match="may not be empty"):
        Security(token="")


# ------------------------------------------------------------------------ Security


def test_repr_never_shows_the_token() -> None:
    s = Security(token="hunter2-very-secret")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)
    assert "token=<set>" in repr(s)


def test_environment_round_trip() -> None:
    s = Security(token="abc")
    assert Security.from_env(s.to_env()) == s
    assert Security.from_env({}) == Security()
    with pytest.raises(ValueError, match="SHOAL_REQUIRE_ENCRYPTION='maybe'"):
        Security.from_env({"SHOAL_REQUIRE_ENCRYPTION": "maybe"})


def test_environment_round_trip_with_tls(tmp_path) -> None:
    s = Security.temporary(token="abc", directory=str(tmp_path))
    assert Security.from_env(s.to_env()) == s
    assert s.require_encryption and s.tls


def test_incomplete_tls_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="TLS needs tls_ca_file as well"):
        Security(tls_cert="cert.pem", tls_key="key.pem")
    with pytest.raises(ValueError, match="TLS needs tls_cert as well"):
        Security(tls_ca_file="ca.pem")
    with pytest.raises(ValueError, match="require_encryption needs TLS credentials"):
        Security(token="t", require_encryption=True)


def test_require_encryption_refuses_plain_tcp(tmp_path) -> None:
    s = Security.temporary(directory=str(tmp_path))
    with pytest.raises(ValueError, match="encryption is required and tcp:// is plain text"):
        s.connect_context("tcp", "tcp://127.0.0.1:1")
    assert s.connect_context("tls", "tls://127.0.0.1:1") is s.client_context


def test_a_tls_address_needs_credentials() -> None:
    with pytest.raises(ValueError, match="tls:// needs TLS credentials"):
        Security(token="t").connect_context("tls", "tls://127.0.0.1:1")


def test_contexts_verify_both_sides(tmp_path) -> None:
    s = Security.temporary(directory=str(tmp_path))
    server, client = s.server_context, s.client_context
    assert server.verify_mode == ssl.CERT_REQUIRED  # a client must show a certificate
    assert client.verify_mode == ssl.CERT_REQUIRED  # and the server too
    assert not client.check_hostname  # the CA's signature is membership (see security.py)
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert s.listen_context() is server


def test_unloadable_credentials_name_the_file(tmp_path) -> None:
    good = Security.temporary(directory=str(tmp_path))
    bad = Security(tls_ca_file=good.tls_ca_file, tls_cert=good.tls_ca_file)  # no key in it
    with pytest.raises(ValueError, match=f"cannot load TLS certificate {good.tls_ca_file}"):
        _ = bad.client_context
    missing = Security(tls_ca_file=str(tmp_path / "nope.pem"), tls_cert=good.tls_cert)
    with pytest.raises(ValueError, match="nope.pem does not exist"):
        _ = missing.server_context


def test_temporary_credentials(tmp_path) -> None:
    from cryptography import x509

    s = Security.temporary(directory=str(tmp_path))
    assert s.tls_ca_file and s.tls_cert and s.tls_key
    ca = x509.load_pem_x509_certificate(Path(s.tls_ca_file).read_bytes())
    cert = x509.load_pem_x509_certificate(Path(s.tls_cert).read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert stat.S_IMODE(os.stat(s.tls_key).st_mode) == 0o600
    # each call is a new CA: another cluster's certificate is not trusted
    other = Security.temporary(directory=str(tmp_path / "other"))
    other_ca = x509.load_pem_x509_certificate(Path(str(other.tls_ca_file)).read_bytes())
    assert other_ca.subject != ca.subject


def test_addresses_carry_their_scheme() -> None:
    assert split_address("tls://127.0.0.1:8786") == ("tls", "127.0.0.1", 8786)
    assert split_address("tcp://[::1]:1") == ("tcp", "::1", 1)
    assert split_address("10.0.0.1:5") == ("tcp", "10.0.0.1", 5)
    assert format_address("127.0.0.1", 9, "tls") == "tls://127.0.0.1:9"
    assert format_address("::1", 9, "tls") == "tls://[::1]:9"
    with pytest.raises(ValueError, match="unsupported address scheme 'udp'"):
        split_address("udp://127.0.0.1:1")
