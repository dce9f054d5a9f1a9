"""The ops port under a real master: wrong admin tokens are budgeted on the bearer
endpoints and the sign-in form alike (a few cost nothing, then 429 with Retry-After and
one log line per wait naming the source, never the token), rotating loopback addresses
gains nothing, and a request framed twice (two Content-Length headers) is refused."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import psycopg

import brooq
from brooq.opsport import budget
from tests.harness import MasterProcess, StartMaster, wait_for
from tests.process.test_ops_slow_clients import ops_addr

TOKEN = "the-admin-token-of-this-test-0123"
WRONG = "a-wrong-token-a-wrong-token-0000"
NOBODY = "00000000-0000-4000-8000-000000000000"
ADMIN = f"/admin/jobs/{NOBODY}/cancel"


def start(start_master: StartMaster, tmp_path: Path) -> tuple[MasterProcess, tuple[str, int]]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    return m, ops_addr(m)


def exchange(addr: tuple[str, int], raw: bytes, source: str = "127.0.0.1") -> bytes:
    """One request's raw bytes sent from ``source`` (any 127.0.0.x is this host), the
    whole answer read."""
    with socket.create_connection(addr, timeout=10, source_address=(source, 0)) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def status_and_head(data: bytes) -> tuple[int, str]:
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1")
    return int(head.split()[1]), head


def bearer(addr: tuple[str, int], token: str, source: str = "127.0.0.1") -> tuple[int, str]:
    raw = f"POST {ADMIN} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n"
    return status_and_head(exchange(addr, raw.encode(), source))


def sign_in(addr: tuple[str, int], token: str, source: str = "127.0.0.1") -> tuple[int, str]:
    body = f"token={token}"
    raw = (
        f"POST /sign-in HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\n\r\n{body}"
    )
    return status_and_head(exchange(addr, raw.encode(), source))


def retry_after(head: str) -> int:
    found = re.search(r"\r\nRetry-After: ([0-9]+)\r\n", head + "\r\n")
    assert found, head
    return int(found.group(1))


def test_wrong_bearer_tokens_from_rotating_loopback_addresses_are_refused_with_429(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    m, addr = start(start_master, tmp_path)
    assert bearer(addr, TOKEN)[0] == 404  # the token is taken: no job with that id
    # 200 wrong tokens, each from another loopback address, as fast as they go.
    answers = [bearer(addr, WRONG, f"127.0.0.{2 + i % 250}") for i in range(200)]
    statuses = [status for status, _ in answers]
    assert statuses[: budget.FREE_FAILURES] == [401] * budget.FREE_FAILURES
    # Past the free ones: refused without being compared, a wrong token now and then
    # (after each wait: 1 s, 2 s, 4 s... on a slow host).
    assert statuses.count(401) <= budget.FREE_FAILURES + 4, statuses
    assert statuses.count(429) >= 150
    refused = next(head for status, head in answers if status == 429)
    assert 1 <= retry_after(refused) <= budget.MAX_BACKOFF
    # The right token from yet another loopback address waits too, then is taken.
    assert bearer(addr, TOKEN, "127.0.0.251")[0] == 429
    wait_for(lambda: bearer(addr, TOKEN, "127.0.0.252")[0] == 404, timeout=40, what="taken")
    # One line per wait naming the source; never the token.
    log = m.log()
    lines = re.findall(r"event=ops_bearer_refused source='loopback' peer=127\.0\.0\.\d+ .*", log)
    assert 1 <= len(lines) <= statuses.count(401) - budget.FREE_FAILURES + 1, lines
    assert "event=ops_bearer_failed" in log
    assert WRONG not in log and TOKEN not in log


def test_wrong_sign_in_tokens_from_rotating_loopback_addresses_are_refused_with_429(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    m, addr = start(start_master, tmp_path)
    answers = [sign_in(addr, WRONG, f"127.0.0.{2 + i}") for i in range(40)]
    statuses = [status for status, _ in answers]
    assert statuses[: budget.FREE_FAILURES] == [401] * budget.FREE_FAILURES
    assert statuses.count(401) <= budget.FREE_FAILURES + 3, statuses
    assert statuses.count(429) >= 30
    assert retry_after(next(head for status, head in answers if status == 429)) >= 1
    wait_for(lambda: sign_in(addr, TOKEN, "127.0.0.99")[0] == 303, timeout=40, what="signed in")
    log = m.log()
    assert re.search(r"event=page_sign_in_refused source='loopback' peer=127\.0\.0\.\d+", log)
    assert WRONG not in log and TOKEN not in log


def test_two_content_length_headers_are_refused(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    _, addr = start(start_master, tmp_path)
    for lengths in ((2, 5), (2, 2)):
        for target in ("/readyz", "/sign-in", ADMIN):
            raw = (
                f"POST {target} HTTP/1.1\r\nHost: localhost\r\n"
                f"Content-Length: {lengths[0]}\r\nContent-Length: {lengths[1]}\r\n\r\nab"
            ).encode()
            status, _ = status_and_head(exchange(addr, raw))
            assert status == 400, (lengths, target)
    # The same request with one Content-Length is served.
    one = f"POST {ADMIN} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
    one += f"Authorization: Bearer {TOKEN}\r\n\r\nab"
    assert status_and_head(exchange(addr, one.encode()))[0] == 404
    assert b"more than one Content-Length header" in exchange(
        addr, b"GET /healthz HTTP/1.1\r\nContent-Length: 0\r\ncontent-length: 0\r\n\r\n"
    )
