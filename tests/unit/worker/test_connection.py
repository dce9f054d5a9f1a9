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


def test_the_payload_loader_decodes_as_the_decoder_does() -> None:
    """The loader of the claims' json and jsonb payloads (text) gives what _decode_payload
    gives: the value, or an Undecodable with the same reason."""
    from brooq.worker.connection import _PayloadLoader

    loader = _PayloadLoader(3802)
    texts = [
        b"null",
        b" null",
        b"{}",
        b'{"a": [1, 2.5, -0, 1e400, true, null, "\\u00e9\\ud83d\\ude00 \\\\ \\""]}',
        '"é✓𝄞"'.encode(),
        b'"\\ud800"',  # a lone surrogate, as json reads it
        b"NaN",
        b"{not json",
        b'{"a": 1} x',
        b"",
        b"\xff",
        b"[" * 100_000 + b"]" * 100_000,
    ]
    for text in texts:
        for data in (text, memoryview(text)):
            got, expected = loader.load(data), _decode_payload(text)
            if isinstance(expected, Undecodable):
                assert isinstance(got, Undecodable) and str(got) == str(expected), text[:20]
            else:
                assert repr(got) == repr(expected), text[:20]
