"""Signing in to the status page with the admin token: the session cookie and the CSRF
token of its forms.

The operator posts the admin token once (the sign-in form; never in a URL); it is
compared in constant time with the master's. The session is then a cookie
`brooq_session=<expiry>.<nonce>.<mac>` (HttpOnly, SameSite=Strict, Path=/, expiring after
SESSION_SECONDS), the mac an HMAC-SHA256 of expiry and nonce under a key derived from the
admin token: changing the token ends every session, and every master with the same token
accepts it. Each form carries a CSRF token, an HMAC of the session's nonce under the same
key, checked in constant time with the session on every action. Nothing here ever holds
the token in a page, a log line or a URL.

Pure functions of their arguments and a clock given to them: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

COOKIE = "brooq_session"
SESSION_SECONDS = 8 * 3600


def _key(token: bytes) -> bytes:
    return hmac.new(token, b"brooq status page session v1", hashlib.sha256).digest()


def _mac(token: bytes, text: str) -> str:
    return hmac.new(_key(token), text.encode(), hashlib.sha256).hexdigest()


def token_matches(token: bytes, given: str) -> bool:
    """The token the operator typed, against the master's, in constant time."""
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), token)


@dataclass(frozen=True)
class Session:
    nonce: str
    expires: int  # Unix seconds

    def csrf(self, token: bytes) -> str:
        """The token every form of this session carries."""
        return _mac(token, f"csrf.{self.nonce}")


def new_session(token: bytes, now: float) -> tuple[Session, str]:
    """A session and its cookie value."""
    session = Session(secrets.token_hex(16), int(now) + SESSION_SECONDS)
    payload = f"{session.expires}.{session.nonce}"
    return session, f"{payload}.{_mac(token, payload)}"


def set_cookie(value: str, *, secure: bool = False) -> str:
    """The Set-Cookie header's value (Secure when the page is served over TLS)."""
    flags = f"; Max-Age={SESSION_SECONDS}; Path=/; HttpOnly; SameSite=Strict"
    return f"{COOKIE}={value}{flags}{'; Secure' if secure else ''}"


def clear_cookie() -> str:
    return f"{COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"


def session_of(token: bytes, cookie_header: str, now: float) -> Session | None:
    """The valid, unexpired session the request's Cookie header holds, or None."""
    for part in cookie_header.split(";"):
        name, _, value = part.strip().partition("=")
        if name != COOKIE:
            continue
        expires, _, rest = value.partition(".")
        nonce, _, mac = rest.partition(".")
        if not (expires.isdigit() and len(expires) <= 12 and nonce and mac):
            return None
        if not hmac.compare_digest(mac, _mac(token, f"{expires}.{nonce}")):
            return None
        if int(expires) <= now:
            return None
        return Session(nonce, int(expires))
    return None


def csrf_ok(token: bytes, session: Session | None, given: str) -> bool:
    return session is not None and hmac.compare_digest(given, session.csrf(token))
