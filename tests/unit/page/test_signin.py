"""The status page's session cookie and CSRF tokens (brooq.page.signin), pure."""

from __future__ import annotations

from brooq.page import signin

TOKEN = b"0123456789abcdef-admin"


def test_a_session_round_trips_until_it_expires() -> None:
    session, cookie = signin.new_session(TOKEN, now=1000.0)
    header = f"other=1; {signin.COOKIE}={cookie}"
    assert signin.session_of(TOKEN, header, 1000.0) == session
    assert signin.session_of(TOKEN, header, 1000.0 + signin.SESSION_SECONDS - 1) == session
    assert signin.session_of(TOKEN, header, 1000.0 + signin.SESSION_SECONDS) is None


def test_a_tampered_or_foreign_cookie_is_no_session() -> None:
    _, cookie = signin.new_session(TOKEN, now=1000.0)
    expires, nonce, mac = cookie.split(".")
    later = f"{int(expires) + 3600}.{nonce}.{mac}"  # a longer life, same mac
    for value in (later, f"{expires}.{nonce}.{'0' * len(mac)}", "garbage", "", "1.2"):
        assert signin.session_of(TOKEN, f"{signin.COOKIE}={value}", 1000.0) is None
    # Another token (changed, or another fleet's) ends every session.
    assert signin.session_of(b"another-token-0123456", f"{signin.COOKIE}={cookie}", 1000.0) is None


def test_csrf_belongs_to_its_session() -> None:
    one, _ = signin.new_session(TOKEN, now=1000.0)
    two, _ = signin.new_session(TOKEN, now=1000.0)
    assert signin.csrf_ok(TOKEN, one, one.csrf(TOKEN))
    assert not signin.csrf_ok(TOKEN, one, two.csrf(TOKEN))
    assert not signin.csrf_ok(TOKEN, None, one.csrf(TOKEN))
    assert not signin.csrf_ok(TOKEN, one, "")


def test_the_cookie_flags_and_the_token_compare() -> None:
    value = signin.set_cookie("x.y.z")
    assert "HttpOnly" in value and "SameSite=Strict" in value and "Path=/" in value
    assert f"Max-Age={signin.SESSION_SECONDS}" in value and "Secure" not in value
    assert "Secure" in signin.set_cookie("x.y.z", secure=True)
    assert "Max-Age=0" in signin.clear_cookie()
    assert signin.token_matches(TOKEN, " 0123456789abcdef-admin\n")
    assert not signin.token_matches(TOKEN, "0123456789abcdef-admiN")


def test_a_revoked_session_is_no_session() -> None:
    session, cookie = signin.new_session(TOKEN, now=1000.0)
    header = f"{signin.COOKIE}={cookie}"
    assert len(session.nonce) == signin.NONCE_CHARS
    assert signin.session_of(TOKEN, header, 1000.0, revoked={"other"}) == session
    assert signin.session_of(TOKEN, header, 1000.0, revoked={session.nonce}) is None


def test_revoked_sessions_are_kept_until_they_expire_and_bounded() -> None:
    from brooq.page.signin import MAX_REVOKED, revoke

    revoked: dict[str, int] = {}
    revoke(revoked, "a", 2000, now=1000.0)
    revoke(revoked, "b", 3000, now=1500.0)
    assert revoked == {"a": 2000, "b": 3000}
    revoke(revoked, "c", 4000, now=2000.0)  # a's session would have expired: forgotten
    assert revoked == {"b": 3000, "c": 4000}
    for n in range(MAX_REVOKED + 5):
        revoke(revoked, f"n{n}", 5000 + n, now=2000.0)
    assert len(revoked) == MAX_REVOKED and "n0" not in revoked and f"n{MAX_REVOKED + 4}" in revoked


def test_a_few_wrong_tokens_cost_nothing_then_the_address_waits_longer_each_time() -> None:
    budget = signin.SignInBudget()
    now = 1000.0
    for n in range(1, signin.FREE_FAILURES + 1):
        assert budget.wait("10.0.0.1", now) == 0
        assert budget.failed("10.0.0.1", now) == n
    assert budget.wait("10.0.0.1", now) == 0  # a mistyped token or five: no one waits
    waits = []
    for _ in range(8):
        budget.failed("10.0.0.1", now)
        waits.append(budget.wait("10.0.0.1", now))
        now += waits[-1]
    assert waits == [1, 2, 4, 8, 16, signin.MAX_BACKOFF, signin.MAX_BACKOFF, signin.MAX_BACKOFF]
    assert budget.wait("10.0.0.2", now) == 0  # another address is not touched
    budget.failed("10.0.0.1", now)
    budget.succeeded("10.0.0.1")  # the right token: its address starts afresh
    assert budget.wait("10.0.0.1", now) == 0 and budget.failed("10.0.0.1", now) == 1
    # An address quiet for a while starts afresh too.
    for _ in range(signin.FREE_FAILURES):
        budget.failed("10.0.0.3", now)
    assert budget.failed("10.0.0.3", now + signin.FORGET_AFTER + 1) == 1
