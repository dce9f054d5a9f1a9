"""The wrong-token budget of the ops port: how many wrong admin tokens a client may try
before it has to wait. The master applies it to the bearer endpoints
(brooq.supervisor.ops), the page process to the sign-in form (brooq.page.actions), each
its own.

Wrong tokens are counted per source and over every source together:

- a source is a client address, except that every loopback address (127.0.0.0/8 and
  ::1) is one source, and an IPv6 address counts by its /64 (one host usually holds a
  whole /64): rotating 127.0.0.x or the low bits of an IPv6 address gains nothing;
- per source, FREE_FAILURES wrong tokens in a row cost nothing (a mistyped token never
  keeps anyone out); past them the source waits 1 s before its next try, doubling with
  each further wrong token up to MAX_BACKOFF;
- over every source together, GLOBAL_FREE_FAILURES wrong tokens in a row, then the same
  doubling for everyone: addresses from many networks cannot try more than about one
  token per MAX_BACKOFF once past it. The price: during such a flood the right token is
  refused too until the wait is over (the CLI, which needs no token, still acts).

A right token starts its source and the global count afresh; so does a source (or the
whole) without a wrong token for FORGET_AFTER; a new admin token (``for_token``) starts
every count afresh. While a source waits, its tries are refused (429 with Retry-After)
without being compared; ``refused`` names the source once per wait, for one log line
per refusal window, never the token.

Owns: the counts and the waits. Pure: no I/O, no clock but the one given.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from dataclasses import dataclass, field

FREE_FAILURES = 5  # wrong tokens in a row from one source before it has to wait
GLOBAL_FREE_FAILURES = 50  # from every source together
MAX_BACKOFF = 30.0  # seconds
FORGET_AFTER = 600.0  # a source without a wrong token this long starts afresh
MAX_SOURCES = 10_000  # bounded: the oldest half is forgotten beyond this
EVERYONE = "every source"  # the name of the global count in a log line
LOOPBACK = "loopback"


def source_of(address: str) -> str:
    """The source an address counts as: ``loopback`` for every loopback address, an
    IPv6 address's /64, an IPv4 address (or an IPv4-mapped IPv6 one) itself; a text
    that is no address counts as itself."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address[:100]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Failures:
    count: int = 0
    last: float = float("-inf")
    wait_until: float = float("-inf")
    told: float = float("-inf")  # the wait_until whose refusal was named

    def fail(self, now: float, free: int) -> None:
        if now - self.last > FORGET_AFTER:
            self.count, self.wait_until = 0, float("-inf")
        self.count += 1
        self.last = now
        if self.count > free:
            self.wait_until = now + min(2.0 ** (self.count - free - 1), MAX_BACKOFF)


@dataclass
class AuthBudget:
    """Wrong tokens per source and over every source (see the module docstring)."""

    sources: dict[str, _Failures] = field(default_factory=dict)
    everyone: _Failures = field(default_factory=_Failures)
    token_digest: bytes = b""

    def for_token(self, token: bytes | None) -> None:
        """The admin token in force: a new one starts every count afresh."""
        digest = hashlib.sha256(token or b"").digest()
        if digest != self.token_digest:
            self.token_digest = digest
            self.sources.clear()
            self.everyone = _Failures()

    def wait(self, address: str, now: float) -> float:
        """Seconds a client at ``address`` must still wait before its token is
        compared; 0: now."""
        failures = self.sources.get(source_of(address))
        mine = 0.0 if failures is None else failures.wait_until - now
        return max(0.0, mine, self.everyone.wait_until - now)

    def retry_after(self, address: str, now: float) -> int:
        """The Retry-After of a refusal: the wait in whole seconds, at least 1."""
        return max(1, math.ceil(self.wait(address, now)))

    def failed(self, address: str, now: float) -> int:
        """Count a wrong token; its source's wrong tokens in a row."""
        source = source_of(address)
        failures = self.sources.get(source)
        if failures is None:
            failures = self.sources[source] = _Failures()
        failures.fail(now, FREE_FAILURES)
        self.everyone.fail(now, GLOBAL_FREE_FAILURES)
        if len(self.sources) > MAX_SOURCES:
            by_age = sorted(self.sources, key=lambda s: self.sources[s].last)
            for old in by_age[: MAX_SOURCES // 2]:
                del self.sources[old]
        return failures.count

    def succeeded(self, address: str) -> None:
        """The right token: its source and the global count start afresh."""
        self.sources.pop(source_of(address), None)
        self.everyone = _Failures()

    def refused(self, address: str, now: float) -> str | None:
        """A try refused while ``address`` waits: the source to name in a log line (its
        own, or EVERYONE when the global wait is the longer), once per wait; None when
        that wait was named already."""
        own = self.sources.get(source_of(address))
        if own is not None and own.wait_until >= self.everyone.wait_until and own.wait_until > now:
            counted, name = own, source_of(address)
        else:
            counted, name = self.everyone, EVERYONE
        if counted.told == counted.wait_until:
            return None
        counted.told = counted.wait_until
        return name
