"""Payloads as stored: a job's payload (or a handler's result) as the JSON text jsonb
takes, and the checks that text passes before it is sent.

Owns: encode_payload (one JSON encoder for every payload, its C accelerator built once,
the values it writes as text (`as_text`: a datetime, date or time as ISO 8601, a
Decimal as its exact string, a UUID in its hyphenated form), the refusals jsonb would
answer later: NaN, \u0000, unpaired surrogates, nesting past MAX_PAYLOAD_DEPTH, and
floats such as 1e+23 written out so that jsonb keeps them floats) and
check_payload_size (the byte limit, QUEUE_MAX_PAYLOAD_BYTES).
Must never: do I/O, know a job's other fields, or accept a text jsonb would refuse or
change (the worker decodes exactly what the producer encoded).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal
from itertools import accumulate
from typing import Any, Final

from brooq.errors import InvalidJob, InvalidPayload

# Deeper payloads are refused. Without a fixed limit the accepted depth was whatever the
# producer's stack allowed (about 950), and a reader with a deeper stack (a worker
# decoding its claim) could then fail with RecursionError on a job already stored.
MAX_PAYLOAD_DEPTH: Final = 256

# "\u0000" as JSON writes it, preceded by an even number of backslashes (so not "\\u0000").
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A JSON string or a whole number, each taken in one piece so that the scan stays linear
# (a pattern that could start inside a 4,000-digit integer backtracks quadratically).
_JSON_STRING_OR_NUMBER = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"|-?[0-9]+(?:\.[0-9]+)?(?:e[-+][0-9]+)?'
)

_BRACKET_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
_JSON_STRING_OR_OTHER = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^"\[\]{}]+')


def _depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON text."""
    if text.count("[") + text.count("{") <= MAX_PAYLOAD_DEPTH:
        return 0  # cannot be deeper than the number of brackets (strings included)
    brackets = _JSON_STRING_OR_OTHER.sub("", text)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def _expand_big_float(match: re.Match[str]) -> str:
    token = match.group(0)
    if "e+" not in token or token[0] == '"':  # a string, or a number jsonb keeps as it is
        return token
    return format(Decimal(token), "f") + ".0"


def _keep_floats(text: str) -> str:
    """jsonb stores 1e+23 as the integer 100000000000000000000000: it would come back as an
    int, and not even equal to the float 1e23. Written out with a fraction ("...000.0") the
    number keeps a scale in jsonb and comes back as the same float."""
    if "e+" not in text:
        return text
    return _JSON_STRING_OR_NUMBER.sub(_expand_big_float, text)


def as_text(value: Any) -> str:
    """A value JSON has no type for, written as the text its type reads back
    (docs/how-to/enqueue.md, "Dates, decimals and UUIDs"): a datetime, date or time as
    ISO 8601 (``isoformat()``: an aware datetime keeps its offset, a naive one stays
    naive), a Decimal as its exact string (``"12.50"``, never a float), a UUID in its
    hyphenated form. A typed payload's field of that type gets it back as one
    (brooq.declare.payload_checks); an untyped payload gets the string. Anything else is
    TypeError, which encode_payload reports as not JSON-serialisable."""
    if isinstance(value, (dt.date, dt.time)):  # a datetime is a date
        return value.isoformat()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


# One encoder for every payload: json.dumps with options builds a new one per call.
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=as_text
)


def _c_encoder() -> Callable[[Any, int], list[str]] | None:
    """The C accelerator _ENCODER.encode builds on every call, built once (a single
    enqueue's Job spent half its Python time in that setup, most of it cold code),
    without the circular-reference markers: a dict shared between threads could be
    taken for a cycle, and a real cycle ends in RecursionError, reported as one. None
    where it is missing or does not write exactly what _ENCODER writes (checked here)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    probe = {"a": [1, -2.5, None, True, False, '\u00e9\n"\u2028'], "b": {"1e300": 1e300}, "": ""}
    try:
        enc = make(
            None,
            _ENCODER.default,
            json.encoder.encode_basestring,
            None,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            False,  # sort_keys
            False,  # skipkeys
            False,  # allow_nan
        )
        same = "".join(enc(probe, 0)) == _ENCODER.encode(probe)
    except Exception:  # another Python's accelerator: another signature
        return None
    return enc if same else None


_C_ENCODER: Final = _c_encoder()


def encode_payload(
    payload: Any, what: str = "payload", error: type[InvalidJob] = InvalidPayload
) -> str:
    """The payload (a handler's result: ``what``) as JSON text ready for jsonb, or
    ``error`` saying why not."""
    try:
        text = _ENCODER.encode(payload) if _C_ENCODER is None else "".join(_C_ENCODER(payload, 0))
    except RecursionError:
        raise error(
            f"{what} is nested too deeply to be encoded as JSON (or holds itself)"
        ) from None
    except (TypeError, ValueError) as exc:
        raise error(f"{what} is not JSON-serialisable: {exc}") from None
    # _depth's and _keep_floats' first tests here: a plain payload calls neither.
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH and _depth(text) > MAX_PAYLOAD_DEPTH:
        raise error(
            f"{what} is nested more than {MAX_PAYLOAD_DEPTH} levels deep (arrays and objects)"
        )
    # The plain substring first: the pattern only decides whether it is escaped.
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise error(rf"{what} contains the character \u0000, which jsonb cannot store")
    if not text.isascii():  # ASCII text holds no surrogate (isascii is O(1) in CPython)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise error(
                f"{what} contains an unpaired surrogate, which is not valid Unicode"
            ) from None
    return text if "e+" not in text else _keep_floats(text)


def check_payload_size(
    text: str, limit: int, what: str = "payload", error: type[InvalidJob] = InvalidPayload
) -> None:
    if len(text) <= limit // 4:  # 4 bytes at most per character in UTF-8: no encoding
        return
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise error(f"{what} is {size} bytes encoded as JSON; the limit is {limit}")


# -- a model instance to JSON -----------------------------------------------------------
# A dataclass or pydantic instance given as a payload or returned as a result becomes its
# JSON-able value here, before encode_payload; the codecs that check and decode a
# handler's model are brooq.declare.payloads'.

JSON_TYPES: Final = frozenset({dict, list, str, int, float, bool, type(None)})
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def pydantic_base() -> type | None:
    module = sys.modules.get("pydantic")
    base = getattr(module, "BaseModel", None)
    return base if isinstance(base, type) else None


# Field names per dataclass (dataclasses.fields() is slow to call per instance).
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        pass
    names = (
        tuple(field.name for field in dataclasses.fields(cls))
        if dataclasses.is_dataclass(cls)
        else None
    )
    _FIELD_NAMES[cls] = names
    return names


def _is_pydantic(value: object) -> bool:
    base = pydantic_base()
    return base is not None and isinstance(value, base)


def _convert(value: Any) -> Any:
    cls = value.__class__
    if cls in _SCALARS:
        return value
    if cls is list or cls is tuple:
        return [_convert(x) for x in value]
    if cls is dict:
        return {key: _convert(x) for key, x in value.items()}
    names = _field_names(cls)
    if names is not None:
        # Every field, init=False ones too (as dataclasses.asdict): decode ignores them.
        return {name: _convert(getattr(value, name)) for name in names}
    if _is_pydantic(value):
        return value.model_dump(mode="json")
    return value  # left for encode_payload to accept or refuse


def to_json(value: Any) -> Any:
    """A dataclass or pydantic instance as a JSON-able value (nested dataclasses, and
    lists and dicts of them, converted too); any other value unchanged. A plain dict
    is not walked: only a model's fields are."""
    if value.__class__ in JSON_TYPES:
        return value
    if _field_names(value.__class__) is None and not _is_pydantic(value):
        return value
    try:
        return _convert(value)
    except RecursionError:  # a dataclass holding itself
        raise InvalidPayload("payload is nested too deeply to be encoded as JSON") from None


def is_model_instance(value: Any) -> bool:
    """Whether ``value`` is a dataclass instance or a pydantic model instance."""
    if value.__class__ in JSON_TYPES:
        return False
    return _field_names(value.__class__) is not None or _is_pydantic(value)
