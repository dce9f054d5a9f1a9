"""Signing in to the status page with the admin token: the session cookie and the CSRF
token of its forms.

The operator posts the admin token once (the sign-in form; never in a URL); it is
compared in constant time with the master's. The session is then a cookie
`brooq_session=<expiry>.<nonce>.<mac>` (HttpOnly, SameSite=Strict, Path=/, expiring after
SESSION_SECONDS), the mac an HMAC-SHA256 of expiry and nonce under a key derived from the
admin token: changing the token ends every session, and every master with the same token
accepts it. Each form carries a CSRF token, an HMAC of the session's nonce under the same
key, checked in constant time with the session on every action. Signing out revokes the
session's nonce (the caller keeps the revoked nonces until they expire, in a map
bounded by revoke, and gives them to session_of), so a copy of the cookie is refused
from then on. The page process signs in and out; the master keeps the revoked nonces
too (brooq.supervisor.pagekeeper), for the page processes it forks later. Nothing here ever holds
the token in a page, a log line or a URL.

Wrong tokens are budgeted per source and over every source (SignInBudget, the ops port's
brooq.opsport.budget.AuthBudget): FREE_FAILURES wrong tokens in a row from a source (an
address; every loopback address is one source, an IPv6 address counts by its /64) cost
nothing, so a mistyped token never keeps anyone out; past them the source waits 1 s
before its next try, doubling with each further wrong token up to MAX_BACKOFF; past
GLOBAL_FREE_FAILURES from every source together, everyone waits so. A right token
resets its source.

Pure functions of their arguments and a clock given to them: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Container
from dataclasses import dataclass

from brooq.opsport.budget import FORGET_AFTER as FORGET_AFTER
from brooq.opsport.budget import FREE_FAILURES as FREE_FAILURES
from brooq.opsport.budget import MAX_BACKOFF as MAX_BACKOFF
from brooq.opsport.budget import AuthBudget

COOKIE = "brooq_session"
SESSION_SECONDS = 8 * 3600
NONCE_CHARS = 32
# The wrong tokens' budget is the ops port's (brooq.opsport.budget), the page process's own.
SignInBudget = AuthBudget
MAX_REVOKED = 10_000  # signed-out sessions remembered (each until it would have expired)


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
    session = Session(secrets.token_hex(NONCE_CHARS // 2), int(now) + SESSION_SECONDS)
    payload = f"{session.expires}.{session.nonce}"
    return session, f"{payload}.{_mac(token, payload)}"


def set_cookie(value: str, *, secure: bool = False) -> str:
    """The Set-Cookie header's value (Secure when the page is served over TLS)."""
    flags = f"; Max-Age={SESSION_SECONDS}; Path=/; HttpOnly; SameSite=Strict"
    return f"{COOKIE}={value}{flags}{'; Secure' if secure else ''}"


def clear_cookie() -> str:
    return f"{COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"


def session_of(
    token: bytes, cookie_header: str, now: float, revoked: Container[str] = ()
) -> Session | None:
    """The valid, unexpired, not revoked session the request's Cookie header holds, or
    None."""
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
        if int(expires) <= now or nonce in revoked:
            return None
        return Session(nonce, int(expires))
    return None


def csrf_ok(token: bytes, session: Session | None, given: str) -> bool:
    return session is not None and hmac.compare_digest(given, session.csrf(token))


def revoke(revoked: dict[str, int], nonce: str, expires: int, now: float) -> None:
    """Remember a signed-out session until it would have expired (bounded: the ones
    closest to their end are forgotten first beyond MAX_REVOKED)."""
    for old in [n for n, at in revoked.items() if at <= now]:
        del revoked[old]
    revoked[nonce] = expires
    if len(revoked) > MAX_REVOKED:
        for old in sorted(revoked, key=revoked.__getitem__)[: len(revoked) - MAX_REVOKED]:
            del revoked[old]
