"""Dashboard security with a cluster token: a one-time login link, then a cookie.

The client holds the token and signs ``nonce|expires`` with it; the server checks the
signature and the expiry, refuses a nonce it saw before, and answers with a session
cookie that is itself an HMAC the server can check (no session table). Without a
token the dashboard is open, as Dask's is.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

LOGIN_LINK_TTL = 900.0  # seconds a login link stays valid (once)
SESSION_TTL = 12 * 3600.0  # seconds a session cookie stays valid
MAX_NONCES = 100_000  # nonces remembered at most: a flood cannot grow memory


class AuthError(Exception):
    """A login link or a session cookie was refused (the message says why)."""


def _sign(token: str, purpose: str, *parts: str) -> str:
    message = "|".join((purpose, *parts)).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def login_query(token: str, now: float, ttl: float = LOGIN_LINK_TTL) -> dict[str, str]:
    """The query of a one-time login link, valid ``ttl`` seconds from ``now``."""
    nonce = secrets.token_urlsafe(16)
    expires = str(int(now + ttl))
    return {"nonce": nonce, "expires": expires, "sig": _sign(token, "login", nonce, expires)}


class NonceRegistry:
    """The nonces of login links used, until their links expire."""

    def __init__(self, capacity: int = MAX_NONCES):
        self.capacity = capacity
        self._used: dict[str, float] = {}  # nonce -> its link's expiry, oldest first

    def __len__(self) -> int:
        return len(self._used)

    def use(self, nonce: str, expires: float, now: float) -> None:
        """Record ``nonce`` as used; raise AuthError if it was used before."""
        self._forget_expired(now)
        if nonce in self._used:
            raise AuthError("this login link was used already: ask the client for a new one")
        if len(self._used) >= self.capacity:
            # Full of unexpired nonces: refuse rather than forget one (forgetting would
            # let its link be used again).
            raise AuthError("too many logins recently: try again in a few minutes")
        self._used[nonce] = expires

    def _forget_expired(self, now: float) -> None:
        # Links expire in about the order they were used (one TTL): stop at the first
        # one still valid.
        while self._used:
            nonce, expires = next(iter(self._used.items()))
            if expires >= now:
                break
            del self._used[nonce]


def check_login(
    token: str,
    query: dict[str, str],
    now: float,
    nonces: NonceRegistry,
    max_ttl: float = LOGIN_LINK_TTL,
) -> None:
    """Accept a login link's query (and use its nonce up), or raise AuthError."""
    missing = [name for name in ("nonce", "expires", "sig") if not query.get(name)]
    if missing:
        raise AuthError(f"the login link lacks {', '.join(missing)}")
    nonce, expires_text, sig = query["nonce"], query["expires"], query["sig"]
    if not hmac.compare_digest(sig, _sign(token, "login", nonce, expires_text)):
        raise AuthError("the login link's signature is wrong (made with another token?)")
    try:
        expires = float(expires_text)
    except ValueError:
        raise AuthError(f"the login link's expiry {expires_text!r} is no number") from None
    if expires < now:
        raise AuthError("the login link has expired: ask the client for a new one")
    if expires > now + max_ttl + 60:  # a link signed to last for ever (60 s: clock skew)
        raise AuthError(f"the login link is valid for more than {max_ttl:.0f}s")
    nonces.use(nonce, expires, now)


def session_cookie(token: str, now: float, ttl: float = SESSION_TTL) -> str:
    """A session cookie's value: a random id and expiry, signed with the token."""
    session = secrets.token_urlsafe(12)
    expires = str(int(now + ttl))
    return f"{session}.{expires}.{_sign(token, 'session', session, expires)}"


def check_session(token: str, cookie: str | None, now: float) -> None:
    """Accept a session cookie, or raise AuthError saying why not."""
    if not cookie:
        raise AuthError(
            "this dashboard needs the cluster token: open the link that "
            "client.dashboard_link gives (a one-time login link)"
        )
    parts = cookie.split(".")
    if len(parts) != 3:
        raise AuthError("malformed session cookie: log in again with a new link")
    session, expires_text, sig = parts
    if not hmac.compare_digest(sig, _sign(token, "session", session, expires_text)):
        raise AuthError("invalid session cookie (another cluster's?): log in again")
    try:
        expires = float(expires_text)
    except ValueError:
        raise AuthError("malformed session cookie: log in again with a new link") from None
    if expires < now:
        raise AuthError("the session has expired: log in again with a new link")
