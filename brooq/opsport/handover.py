"""The hand-over between the master and its page process: what crosses their socket.

The master hands each page request over a SOCK_SEQPACKET socketpair, one message per
request: the request's number (SEQ), the bytes read so far, and the client's socket by
SCM_RIGHTS. The page process reports back on the same socket, each report a kind and a
number: START when it starts a request, WRITING when its answer is being written, END
when it is done, BACKGROUND when the request goes on in a bulk helper, and ALIVE (number
CONTROL) every HEARTBEAT while a bulk helper runs. A signed-out session is reported as
REVOKED + its expiry + its nonce (the master keeps it for the page processes it forks
later). The master's own messages carry the number CONTROL: TOKEN + the new admin token
(nothing after it: no token any more).

Both processes import this module; changing a message changes both sides at once (the
master forks the page process from its own code, so both always run the same version).

Owns: the messages' layout and their encoding. Pure: no socket, no clock.
"""

from __future__ import annotations

import struct

from brooq.opsport.httpmsg import MAX_BODY_BYTES, MAX_HEADER_BYTES

SEQ = struct.Struct("!Q")  # the request's number, at the head of each message
MESSAGE_BYTES = MAX_HEADER_BYTES + MAX_BODY_BYTES + 64  # a handed request, whole
START, WRITING, END = b"s", b"w", b"e"  # the page process's reports, each + SEQ
# The request goes on in a helper process (a bulk action): the page process is free;
# while one does, it sends ALIVE (+ number CONTROL) every HEARTBEAT.
BACKGROUND, ALIVE = b"b", b"h"
HEARTBEAT = 1.0
REVOKED = b"r"
# A message of the master's own, not a request: number 0, then TOKEN + the token.
CONTROL = 0
TOKEN = b"T"


def revoked(nonce: str, expires: int) -> bytes:
    """The report of a signed-out session."""
    return REVOKED + SEQ.pack(expires) + nonce.encode("ascii")


def read_revoked(message: bytes, nonce_chars: int) -> tuple[str, int] | None:
    """(nonce, expiry) of a REVOKED report whose nonce has ``nonce_chars`` characters;
    None for any other message."""
    if message[:1] != REVOKED or len(message) != 1 + SEQ.size + nonce_chars:
        return None
    nonce = message[1 + SEQ.size :].decode("ascii", "replace")
    return nonce, SEQ.unpack(message[1 : 1 + SEQ.size])[0]


def token_message(token: bytes | None) -> bytes:
    """The master's message carrying a new admin token (None: actions off)."""
    return SEQ.pack(CONTROL) + TOKEN + (token or b"")
