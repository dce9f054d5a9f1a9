"""The child's connection (brooq.worker.connection): an undecodable payload is a value, not a
crash.
"""

from __future__ import annotations

from brooq.worker.connection import Undecodable, _decode_payload

# -- payloads json cannot read ---------------------------------------------------------------


def test_an_undecodable_payload_is_a_value_not_a_crash() -> None:
    assert _decode_payload(b'{"a": 1}') == {"a": 1}
    bad = _decode_payload(b"{not json")
    assert isinstance(bad, Undecodable) and str(bad).startswith("JSONDecodeError: ")
    deep = _decode_payload("[" * 100_000 + "]" * 100_000)
    assert isinstance(deep, Undecodable) and str(deep).startswith("RecursionError: ")
    assert len(str(deep)) <= len("RecursionError: ") + 200
