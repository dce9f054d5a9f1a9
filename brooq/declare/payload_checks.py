"""The checkers of typed payloads, one per annotation: how brooq.declare.payloads checks a JSON
value against int, float, str, bool, None, Any, Literal[...], unions, list[T] and
dict[str, T] (a dataclass's own check is brooq.declare.payloads'), and how a refusal is worded.
The types JSON has none for and brooq.encoding writes as text (datetime, date, time:
ISO 8601; Decimal: its exact string, an int taken too; UUID) are read back from that
text into their type: the one conversion a checker makes.

Owns: `Spec` (a check and the words for what it expects), the exact-type rule (a JSON
value is checked by its class: ``int`` refuses ``bool``, ``float`` takes an int), the
refusals (`Mismatch`, whose path is appended on the way out so that the happy path
builds no string; `Unsupported`, an annotation refused) and `show` (an annotation as it
would be written).
Must never: do I/O, coerce a value (but text into the types above), or import pydantic.
"""

from __future__ import annotations

import datetime as dt
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, Literal, Union

SCALARS: Final = frozenset({str, int, float, bool, type(None)})
LITERAL_TYPES: Final = frozenset({str, int, bool, type(None)})

SUPPORTED: Final = (
    "supported are int, float, str, bool, None, Any, datetime, date, time, Decimal, "
    "UUID, unions of these, list[T], dict[str, T], Literal[...] and dataclasses"
)

Check = Callable[[Any], Any]


class Mismatch(Exception):
    """A checker's refusal. The path is appended on the way out (innermost first), so
    the happy path never builds a path string."""

    def __init__(self, text: str, got: str | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.got = got  # for "expected X, got Y": a union rewords X and keeps Y
        self.path: list[str] = []

    def render(self, model: str) -> str:
        return f"payload{''.join(reversed(self.path))}: {self.text} ({model})"


class Unsupported(Exception):
    """An annotation codec_for refuses; `part` is the piece at fault within it."""

    def __init__(self, part: object, reason: str = SUPPORTED) -> None:
        super().__init__(reason)
        self.part = part
        self.reason = reason


def kind_of(value: object) -> str:
    return "None" if value is None else type(value).__name__


def wrong(expected: str, got: str) -> Mismatch:
    return Mismatch(f"expected {expected}, got {got}", got)


def show(hint: object) -> str:
    """An annotation as it would be written: list[set[int]], int | None, Literal['a']."""
    if hint is None or hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    if hint is Ellipsis:
        return "..."
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is Union or origin is types.UnionType:
        return " | ".join(map(show, args))
    if origin is not None:
        return f"{show(origin)}[{', '.join(map(show, args))}]" if args else show(origin)
    if isinstance(hint, type):
        return hint.__qualname__
    return repr(hint)


class Spec:
    """How to check one annotation. `transforms`: the check returns a new value (a
    dataclass built from a dict, or a container of such); when False it only validates,
    and a container may keep the list or dict it was given instead of copying it."""

    __slots__ = ("check", "expected", "transforms")

    def __init__(self, check: Check, expected: str, transforms: bool = False) -> None:
        self.check = check
        self.expected = expected
        self.transforms = transforms


def _any(value: Any) -> Any:
    return value


ANY: Final = Spec(_any, "Any")


def exact(*classes: type, expected: str) -> Spec:
    if len(classes) == 1:
        only = classes[0]

        def check(value: Any) -> Any:
            if value.__class__ is only:
                return value
            raise wrong(expected, kind_of(value))

    else:
        allowed = frozenset(classes)

        def check(value: Any) -> Any:
            if value.__class__ in allowed:
                return value
            raise wrong(expected, kind_of(value))

    return Spec(check, expected)


PLAIN: Final[dict[object, Spec]] = {
    int: exact(int, expected="int"),
    float: exact(float, int, expected="float"),
    str: exact(str, expected="str"),
    bool: exact(bool, expected="bool"),
    type(None): exact(type(None), expected="None"),
}
PLAIN[None] = PLAIN[type(None)]  # one spec, so that a union can tell it is Optional


def _iso(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``fromisoformat`` taking a final Z (UTC) on Python 3.10 too."""

    def read(text: str) -> Any:
        return parse(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)

    return read


def from_text(parse: Callable[[str], Any], expected: str, form: str, *more: type) -> Spec:
    """A type brooq.encoding writes as text: a str in ``form`` parsed back into it (and
    a value of a class of ``more`` taken as it is); the text is not echoed in a refusal
    (a payload may hold what should not be logged)."""
    taken = frozenset(more)

    def check(value: Any) -> Any:
        if value.__class__ is not str:
            if value.__class__ in taken:
                return parse(str(value))
            raise wrong(f"{expected} ({form})", kind_of(value))
        try:
            return parse(value)
        except (ValueError, ArithmeticError):
            raise Mismatch(f"expected {expected} ({form}), got a str not in that form") from None

    return Spec(check, expected, transforms=True)


PLAIN[dt.datetime] = from_text(_iso(dt.datetime.fromisoformat), "datetime", "ISO 8601 text")
PLAIN[dt.date] = from_text(_iso(dt.date.fromisoformat), "date", "ISO 8601 text")
PLAIN[dt.time] = from_text(_iso(dt.time.fromisoformat), "time", "ISO 8601 text")
PLAIN[Decimal] = from_text(Decimal, "Decimal", "a decimal string or an int", int)
PLAIN[uuid.UUID] = from_text(uuid.UUID, "UUID", "its text")


def literal(values: tuple[Any, ...]) -> Spec:
    for value in values:
        if value.__class__ not in LITERAL_TYPES:
            raise Unsupported(Literal[values], "Literal values must be str, int, bool or None")
    # Keyed by (class, value): True == 1, and a Literal[1] must not accept true.
    allowed = frozenset((value.__class__, value) for value in values)
    expected = " or ".join(map(repr, values))

    def check(value: Any) -> Any:
        if value.__class__ in SCALARS and (value.__class__, value) in allowed:
            return value
        got = repr(value) if value.__class__ in SCALARS else kind_of(value)
        raise wrong(expected, got)

    return Spec(check, expected)


def union(members: list[Spec]) -> Spec:
    expected = " or ".join(member.expected for member in members)
    transforms = any(member.transforms for member in members)
    nullable = any(member is PLAIN[None] for member in members)
    others = [member for member in members if member is not PLAIN[None]]
    if nullable and len(others) == 1:
        # Optional[X], the common case: no exception-driven tries, and X's own error
        # (with its path) when the value is not None.
        inner = others[0].check

        def optional(value: Any) -> Any:
            if value is None:
                return None
            try:
                return inner(value)
            except Mismatch as exc:
                if exc.path or exc.got is None:
                    raise  # X's own words from inside the value
                raise wrong(expected, exc.got) from None

        return Spec(optional, expected, transforms)

    checks = [member.check for member in members]

    def check(value: Any) -> Any:
        deeper: Mismatch | None = None
        got: str | None = None
        for one in checks:
            try:
                return one(value)
            except Mismatch as exc:
                # A member that got inside the value (a list, an object) says more
                # than "expected A or B, got list".
                if deeper is None and exc.path:
                    deeper = exc
                got = got or exc.got
        if deeper is not None:
            raise deeper
        raise wrong(expected, got or kind_of(value))

    return Spec(check, expected, transforms)


def list_of(item: Spec) -> Spec:
    if item is ANY:

        def check_any(value: Any) -> Any:
            if value.__class__ is list:
                return value
            raise wrong("list", kind_of(value))

        return Spec(check_any, "list")

    each = item.check
    transforms = item.transforms

    def check(value: Any) -> Any:
        if value.__class__ is not list:
            raise wrong("list", kind_of(value))
        try:
            if transforms:
                return [each(x) for x in value]
            for x in value:
                each(x)
            return value
        except Mismatch:
            pass
        # The slow path, taken only to refuse: find which item, for the path.
        for index, x in enumerate(value):
            try:
                each(x)
            except Mismatch as exc:
                exc.path.append(f"[{index}]")
                raise exc from None
        raise AssertionError("unreachable: an item was refused above")

    return Spec(check, "list", transforms)


def dict_of(item: Spec) -> Spec:
    if item is ANY:

        def check_any(value: Any) -> Any:
            if value.__class__ is dict:
                return value
            raise wrong("dict", kind_of(value))

        return Spec(check_any, "dict")

    each = item.check
    transforms = item.transforms

    def check(value: Any) -> Any:
        if value.__class__ is not dict:
            raise wrong("dict", kind_of(value))
        out: dict[str, Any] | None = {} if transforms else None
        for key, x in value.items():
            try:
                checked = each(x)
            except Mismatch as exc:
                exc.path.append(f"[{key!r}]")
                raise
            if out is not None:
                out[key] = checked
        return value if out is None else out

    return Spec(check, "dict", transforms)
