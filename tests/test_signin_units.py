"""The status page's session cookie and CSRF tokens (brooq.supervisor.signin), pure."""

from __future__ import annotations

from brooq.supervisor import signin

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
