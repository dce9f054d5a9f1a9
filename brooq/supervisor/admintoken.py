"""The admin token: where it is read from, and noticing that it changed.

The token is in the file QUEUE_ADMIN_TOKEN_FILE names, or in the systemd credential
``admin-token``. The master reads it at start-up (a missing or short one stops it with
exit 2), again on SIGHUP, and again whenever the file changes (its inode, size or
modification time, looked at once a second: a stat, never a wait). A new token takes
effect at once for the bearer endpoints and the status page, and signs everyone out:
sessions are signed with a key derived from the token (brooq.page.signin). A file
that cannot be read any more, or holds fewer than MIN_BYTES, turns the actions off until
it holds a token again (deleting the file is a way to revoke every session and the
bearer token at once).

Owns: the file's path, reading it, and the change check. Reads nothing but that file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from brooq import settings as settings_mod

log = logging.getLogger("brooq.master")

MIN_BYTES = 16
CHECK_PERIOD = 1.0  # seconds between two looks at the file

_Signature = tuple[int, int, int, int] | None


def token_path(environ: Mapping[str, str] | None = None) -> str | None:
    """QUEUE_ADMIN_TOKEN_FILE, else the credential admin-token if there is one."""
    path = settings_mod.getenv("QUEUE_ADMIN_TOKEN_FILE", environ)
    creds = settings_mod.getenv("CREDENTIALS_DIRECTORY", environ)
    if path is None and creds and (Path(creds) / "admin-token").exists():
        path = str(Path(creds) / "admin-token")
    return path


def read(path: str) -> bytes:
    """The token in ``path``; ValueError saying why there is none."""
    try:
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the admin token file {path}: {exc.strerror}") from None
    if len(token) < MIN_BYTES:
        raise ValueError(f"the admin token in {path} is shorter than {MIN_BYTES} bytes")
    return token


def _signature(path: str) -> _Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class TokenWatch:
    """The token of ``path`` as last read; ``poll`` and ``reload`` say when it changed."""

    def __init__(self, path: str, token: bytes | None, now: float) -> None:
        self.path = path
        self.token = token
        self.signature = _signature(path)
        self.checked_at = now

    def poll(self, now: float) -> bool:
        """Look at the file if a CHECK_PERIOD has passed; True when the token changed."""
        if now - self.checked_at < CHECK_PERIOD:
            return False
        self.checked_at = now
        signature = _signature(self.path)
        if signature == self.signature:
            return False
        return self.reload(now)

    def reload(self, now: float) -> bool:
        """Read the file again (SIGHUP); True when the token changed."""
        self.checked_at = now
        self.signature = _signature(self.path)
        try:
            token: bytes | None = read(self.path)
        except ValueError as exc:
            token = None
            if self.token is not None:
                log.error("event=admin_token_unreadable error=%r: actions are off", str(exc))
        if token == self.token:
            return False
        self.token = token
        if token is not None:
            log.warning("event=admin_token_changed: every session of the status page ends")
        return True
