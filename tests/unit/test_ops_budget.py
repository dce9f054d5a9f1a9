"""The ops port's wrong-token budget (brooq.opsport.budget): what a source is, the
global count that rotating addresses cannot escape, the one log line per wait, and a new
token starting afresh."""

from __future__ import annotations

from brooq.opsport import budget
from brooq.opsport.budget import EVERYONE, AuthBudget, source_of


def test_what_a_source_is() -> None:
    assert source_of("127.0.0.1") == source_of("127.9.8.7") == source_of("::1") == "loopback"
    assert source_of("::ffff:127.0.0.2") == "loopback"
    assert source_of("::ffff:10.1.2.3") == "10.1.2.3"
    assert source_of("10.1.2.3") == "10.1.2.3" != source_of("10.1.2.4")
    assert source_of("2001:db8:0:1::5") == source_of("2001:db8:0:1:ffff::9") == "2001:db8:0:1::/64"
    assert source_of("2001:db8:0:2::5") == "2001:db8:0:2::/64"
    assert source_of("fe80::1%eth0") == "fe80::/64"
    assert source_of("?") == "?"


def test_rotating_addresses_meet_the_global_budget() -> None:
    b = AuthBudget()
    now = 100.0
    addresses = [f"10.{i // 250}.{i % 250}.1" for i in range(1000)]
    compared = 0
    for address in addresses:  # each address tries once: no source is over its budget
        if b.wait(address, now) == 0:
            compared += 1
            b.failed(address, now)
        now += 0.001
    assert compared == budget.GLOBAL_FREE_FAILURES + 1
    # Everyone waits, a fresh address too; named once as every source.
    assert b.wait("192.0.2.1", now) > 0 and b.retry_after("192.0.2.1", now) == 1
    assert b.refused("192.0.2.1", now) == EVERYONE
    assert b.refused("192.0.2.2", now) is None  # the same wait: no second line
    now += 1.0
    assert b.wait("192.0.2.1", now) == 0
    b.failed("192.0.2.1", now)
    assert b.retry_after("192.0.2.3", now) == 2  # the next wait doubles
    assert b.refused("192.0.2.3", now) == EVERYONE  # a new wait: a new line


def test_a_source_is_named_once_per_wait_and_a_new_token_starts_afresh() -> None:
    b = AuthBudget()
    b.for_token(b"first-token-0123456789")
    now = 50.0
    for i in range(budget.FREE_FAILURES + 1):
        assert b.wait(f"127.0.0.{i + 2}", now) == 0
        b.failed(f"127.0.0.{i + 2}", now)
    assert b.wait("127.0.0.200", now) == 1.0
    assert b.refused("127.0.0.200", now) == "loopback"
    assert b.refused("127.0.0.201", now) is None
    assert b.wait("10.0.0.1", now) == 0  # another source is not touched
    b.for_token(b"first-token-0123456789")  # the same token: nothing changes
    assert b.wait("127.0.0.1", now) == 1.0
    b.for_token(b"second-token-987654321")
    assert b.wait("127.0.0.1", now) == 0
