"""HTTP/1.x as the ops port speaks it: a request parsed from the bytes read so far, and a
plain answer written whole. The master's ops server (brooq.supervisor.ops) parses each
request as it arrives; the page process (brooq.page) parses a handed request again and
answers it with the same plain answers.

Requests are HTTP/1.0 or 1.1, one per connection (answered with Connection: close),
headers at most MAX_HEADER_BYTES, a body (Content-Length only, no chunked) at most
MAX_BODY_BYTES. Host and Content-Length come at most once each: a repeated one is a 400,
whether its values differ (RFC 9112 section 6.3) or not.

Owns: parsing, the limits, the answer's bytes. Pure: no socket, no clock but the Date
header's. Must never raise on what a client sends but BadRequest.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

MAX_HEADER_BYTES = 16 * 1024  # request line and headers
MAX_HEADERS = 100
MAX_BODY_BYTES = 16 * 1024  # no endpoint reads a body; a small one is tolerated
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_VERSION = re.compile(r"HTTP/1\.[0-9]")
_SINGLE = {"host": "Host", "content-length": "Content-Length"}  # at most once each


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased; the last of repeated names


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse(data: bytes | bytearray) -> Request | None:
    """The request at the start of data, or None while it is still incomplete. Raises
    BadRequest (and nothing else) for what can never become a valid request."""
    end = _HEAD_END.search(data)
    if end is None:
        if len(data) > MAX_HEADER_BYTES:
            if b"\n" not in data:
                raise BadRequest(414, "request line too long")
            raise BadRequest(431, "request headers too large")
        return None
    if end.start() > MAX_HEADER_BYTES:
        raise BadRequest(431, "request headers too large")
    head = bytes(data[: end.start()]).decode("latin-1")
    request_line, *header_lines = head.replace("\r\n", "\n").split("\n")
    words = request_line.split()
    if len(words) != 3:
        raise BadRequest(400, f"bad request line {request_line[:100]!r}")
    method, path, version = words
    if not version.startswith("HTTP/"):
        raise BadRequest(400, f"bad request version {version[:20]!r}")
    if not _VERSION.fullmatch(version):
        raise BadRequest(505, f"HTTP version not supported: {version[:20]!r}")
    if len(header_lines) > MAX_HEADERS:
        raise BadRequest(431, "too many headers")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(400, f"bad header line {line[:100]!r}")
        lowered = name.lower()
        # Which one would a proxy read? A second Host or Content-Length, even one
        # repeating the first, is refused (RFC 9112 6.3 allows that for equal values and
        # requires it for different ones): two parsers can never frame the request apart.
        if lowered in _SINGLE and lowered in headers:
            raise BadRequest(400, f"more than one {_SINGLE[lowered]} header")
        headers[lowered] = value.strip()
    if "transfer-encoding" in headers:
        raise BadRequest(501, "Transfer-Encoding is not supported; send Content-Length")
    length_text = headers.get("content-length", "0")
    if not (length_text.isascii() and length_text.isdigit()):  # isdigit alone takes "²"
        raise BadRequest(400, f"bad Content-Length {length_text[:20]!r}")
    # (No int() of thousands of digits: Python refuses those with ValueError.)
    if len(length_text) > 9 or int(length_text) > MAX_BODY_BYTES:
        raise BadRequest(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    length = int(length_text)
    if len(data) < end.end() + length:
        return None
    return Request(method, path, headers)


def plain_response(
    status: int,
    body: bytes,
    content_type: str = "text/plain",
    extra: Collection[tuple[str, str]] = (),
) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [
        f"HTTP/1.0 {status} {phrase}",
        "Server: brooq-ops",
        f"Date: {formatdate(usegmt=True)}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
