"""Which Host names the ops port answers: a defence against DNS rebinding.

A page on another site can make its own name resolve to 127.0.0.1 and then read what the
ops port answers, loopback binding or not: the browser believes it talks to that site.
What it cannot change is the Host header, which names that site. So every answer that
holds data (the metrics, the status page, the admin endpoints) is given only to a request
whose Host is a name of this port:

- the loopback names: ``localhost``, ``127.0.0.1``, ``[::1]``;
- the address the client connected to, as a literal (the bound address, or, on a
  wildcard binding such as ``0.0.0.0:8090``, whichever of the machine's addresses was
  dialled: ``http://10.0.0.5:8090/`` and a probe's ``Host: <pod ip>`` work);
- the machine's host name (``socket.gethostname()``, no DNS involved);
- the names of QUEUE_OPS_ALLOWED_HOSTS (a proxy's public name, say).

The port, when the Host carries one, is not compared: rebinding keeps the port and
changes the address behind a name, and a proxy's port is its own. A request without a
Host (an HTTP/1.0 tool) is answered: a browser always sends one. /healthz and /readyz
answer any Host: they say one word about the master (probes send the pod's address, or
whatever their configuration says), never a job.

Owns: the rule and the refusal's text, applied by the master and again by the page
process. Pure: no I/O beyond the host name read once.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

EXEMPT = frozenset({"/healthz", "/readyz"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_NAME = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?)*$")
_PORT = re.compile(r"^[0-9]{1,5}$")
REFUSAL_STATUS = 421  # Misdirected Request: this server does not answer for that name


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an allowed Host name (None when it can): a DNS name or an
    IP literal (IPv6 in brackets), without a port."""
    text = name.strip().lower()
    if text.startswith("["):
        if not text.endswith("]"):
            return f"{name!r}: an IPv6 address is written in brackets, without a port"
        try:
            ipaddress.IPv6Address(text[1:-1])
        except ValueError:
            return f"{name!r} is not an IPv6 address"
        return None
    if ":" in text:
        return f"{name!r}: give the name without a port (the port is not compared)"
    if len(text) > 253 or not _NAME.match(text.rstrip(".")):
        return f"{name!r} is not a host name"
    return None


def normalize(name: str) -> str | None:
    """The comparable form of a Host name without its port: lower case, no trailing dot,
    an IP address in its canonical form (IPv6 in brackets). None when it is malformed."""
    text = name.strip().lower().rstrip(".")
    if text.startswith("[") and text.endswith("]"):
        try:
            return f"[{ipaddress.IPv6Address(text[1:-1]).compressed}]"
        except ValueError:
            return None
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        pass
    return text if _NAME.match(text) else None


def host_name(header: str) -> str | None:
    """The name a Host header gives, without its port, normalized; None when malformed."""
    value = header.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
    else:
        name, sep, port = value.partition(":")
        rest = f":{port}" if sep else ""
    if rest and not (rest.startswith(":") and _PORT.match(rest[1:])):
        return None
    return normalize(name)


def _literal(address: str) -> set[str]:
    """The Host forms of a socket address (an IPv4-mapped IPv6 one in both forms)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return set()
    if isinstance(ip, ipaddress.IPv6Address):
        forms = {f"[{ip.compressed}]"}
        if ip.ipv4_mapped is not None:
            forms.add(str(ip.ipv4_mapped))
        return forms
    return {str(ip)}


@dataclass(frozen=True)
class HostRule:
    """The names one ops port answers (see the module docstring)."""

    extra: frozenset[str] = frozenset()  # QUEUE_OPS_ALLOWED_HOSTS, normalized
    hostname: str | None = field(default=None)

    @classmethod
    def of(cls, allowed: Iterable[str] = ()) -> HostRule:
        names = {n for n in (normalize(a) for a in allowed) if n is not None}
        return cls(frozenset(names), normalize(socket.gethostname()))

    def allows(self, host: str | None, local_address: str) -> bool:
        """Whether a request with this Host header (None: none sent), arriving on a
        connection whose local address is ``local_address``, is answered."""
        if host is None:
            return True
        name = host_name(host)
        if name is None:
            return False
        return (
            name in LOOPBACK_NAMES
            or name in self.extra
            or name == self.hostname
            or name in _literal(local_address)
        )

    def refusal(self, path: str, host: str | None, local_address: str) -> bytes | None:
        """The plain-text body of the refusal, or None when the request is answered."""
        if path.split("?", 1)[0] in EXEMPT or self.allows(host, local_address):
            return None
        shown = (host or "")[:100]
        return (
            f"Host {shown!r} is not a name of this ops port: it answers localhost, "
            "127.0.0.1, [::1], the address dialled, the machine's host name and the names "
            "in QUEUE_OPS_ALLOWED_HOSTS\n"
        ).encode("ascii", "backslashreplace")
