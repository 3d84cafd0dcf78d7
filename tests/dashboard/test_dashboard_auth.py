"""One-time login links and session cookies (shoal/dashboard/auth.py)."""

from __future__ import annotations

import pytest

from shoal.dashboard.auth import (
    AuthError,
    NonceRegistry,
    check_login,
    check_session,
    login_query,
    session_cookie,
)

TOKEN = "cluster-token"
NOW = 1_700_000_000.0


def test_a_signed_link_is_accepted_once() -> None:
    nonces = NonceRegistry()
    query = login_query(TOKEN, NOW, ttl=60)
    check_login(TOKEN, query, NOW + 30, nonces)
    with pytest.raises(AuthError, match="used already"):
        check_login(TOKEN, query, NOW + 31, nonces)


def test_another_token_or_a_changed_field_is_refused() -> None:
    query = login_query(TOKEN, NOW, ttl=60)
    with pytest.raises(AuthError, match="signature"):
        check_login("another-token", query, NOW, NonceRegistry())
    for field, value in (("nonce", "forged"), ("expires", str(int(NOW + 50)))):
        with pytest.raises(AuthError, match="signature"):
            check_login(TOKEN, {**query, field: value}, NOW, NonceRegistry())


def test_an_expired_or_everlasting_link_is_refused() -> None:
    query = login_query(TOKEN, NOW, ttl=60)
    with pytest.raises(AuthError, match="expired"):
        check_login(TOKEN, query, NOW + 61, NonceRegistry())
    forever = login_query(TOKEN, NOW, ttl=10**9)  # signed with the token, but no expiry
    with pytest.raises(AuthError, match="valid for more than"):
        check_login(TOKEN, forever, NOW, NonceRegistry(), max_ttl=900)


def test_missing_fields_are_named() -> None:
    with pytest.raises(AuthError, match="lacks nonce, sig"):
        check_login(TOKEN, {"expires": "1"}, NOW, NonceRegistry())


def test_used_nonces_are_forgotten_once_their_link_expired_and_bounded() -> None:
    nonces = NonceRegistry(capacity=2)
    nonces.use("a", NOW + 10, NOW)
    nonces.use("b", NOW + 20, NOW)
    with pytest.raises(AuthError, match="too many logins"):
        nonces.use("c", NOW + 30, NOW)
    nonces.use("c", NOW + 30, NOW + 15)  # "a" expired: forgotten (its link is refused anyway)
    assert len(nonces) == 2


def test_session_cookie_checks_signature_and_expiry() -> None:
    cookie = session_cookie(TOKEN, NOW, ttl=100)
    check_session(TOKEN, cookie, NOW + 50)
    with pytest.raises(AuthError, match="expired"):
        check_session(TOKEN, cookie, NOW + 101)
    with pytest.raises(AuthError, match="invalid session cookie"):
        check_session("another-token", cookie, NOW)
    session, expires, sig = cookie.split(".")
    with pytest.raises(AuthError, match="invalid session cookie"):  # a longer life, unsigned
        check_session(TOKEN, f"{session}.{int(expires) + 10**6}.{sig}", NOW)
    with pytest.raises(AuthError, match="needs the cluster token"):
        check_session(TOKEN, None, NOW)
    with pytest.raises(AuthError, match="malformed"):
        check_session(TOKEN, "garbage", NOW)
