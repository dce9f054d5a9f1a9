"""Typed payloads (brooq.declare.payloads): the codec of a dataclass or a pydantic model, its
refusals at build and at decode (the exact messages), to_json, and Job with a model
instance. Pure: no database.

This module uses ``from __future__ import annotations``, so the dataclasses below have
string annotations: every codec built from them goes through get_type_hints.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from dataclasses import InitVar, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, NewType, Optional

import pydantic
import pytest

from brooq.declare import payloads
from brooq.declare.payload_checks import show
from brooq.declare.payloads import codec_for
from brooq.encoding import is_model_instance, to_json
from brooq.errors import InvalidPayload, PayloadMismatch
from brooq.job import Claim, Job


@dataclass
class Address:
    zip: str
    city: str = "Paris"


@dataclass
class Signup:
    user_id: int
    email: str
    score: float
    address: Optional[Address] = None  # noqa: UP045 (Optional is supported too)
    tags: list[str] = field(default_factory=list)
    meta: dict[str, int] = field(default_factory=dict)
    plan: Literal["free", "pro"] = "free"


@dataclass
class Node:
    name: str
    children: list[Node] = field(default_factory=list)


class PSignup(pydantic.BaseModel):
    user_id: int
    email: str
    tags: list[int] = []


class PStrict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)
    user_id: int


def one_field(annotation: Any, **kwargs: Any) -> type:
    """A dataclass `Model` with the single field `x` (a real annotation, not a string)."""
    spec: Any = ("x", annotation, field(**kwargs)) if kwargs else ("x", annotation)
    return dataclasses.make_dataclass("Model", [spec])


def mismatch(codec: payloads.Codec, obj: Any) -> str:
    with pytest.raises(PayloadMismatch) as info:
        codec.decode(obj)
    return str(info.value)


# -- every supported annotation: accepted, and refused with its message ------------------

UserId = NewType("UserId", int)

SUPPORTED: list[tuple[Any, list[Any], list[tuple[Any, str]]]] = [
    (
        int,
        [0, -7, 10**30],
        [
            (True, "expected int, got bool"),
            ("1", "expected int, got str"),
            (1.0, "expected int, got float"),
        ],
    ),
    (
        float,
        [1.5, 2, -0.0],
        [("1.5", "expected float, got str"), (False, "expected float, got bool")],
    ),
    (str, ["", "é"], [(1, "expected str, got int"), (None, "expected str, got None")]),
    (bool, [True, False], [(1, "expected bool, got int"), ("true", "expected bool, got str")]),
    (None, [None], [(0, "expected None, got int")]),
    (type(None), [None], [(False, "expected None, got bool")]),
    (Any, [None, 1, "x", [1], {"a": [None]}], []),
    (Optional[int], [None, 3], [("3", "expected int or None, got str")]),  # noqa: UP045
    (int | None, [None, 3], [(True, "expected int or None, got bool")]),
    (
        int | str,
        [1, "1"],
        [(1.5, "expected int or str, got float"), (None, "expected int or str, got None")],
    ),
    (list[int], [[], [1, 2]], [({}, "expected list, got dict"), ("ab", "expected list, got str")]),
    (list, [[], [1, "a", None]], [((1,), "expected list, got tuple")]),
    (dict[str, int], [{}, {"a": 1}], [([], "expected dict, got list")]),
    (dict, [{}, {"a": [1]}], [("{}", "expected dict, got str")]),
    (dict[str, Any], [{"a": object}], [(None, "expected dict, got None")]),
    (
        Literal["a", 1],
        ["a", 1],
        [
            ("b", "expected 'a' or 1, got 'b'"),
            (True, "expected 'a' or 1, got True"),
            ([], "expected 'a' or 1, got list"),
        ],
    ),
    (Literal[None, True], [None, True], [(1, "expected None or True, got 1")]),
    (Literal["a"] | None, [None, "a"], [("b", "expected 'a' or None, got 'b'")]),
    (UserId, [5], [("5", "expected int, got str")]),
    (Address, [{"zip": "75001"}], [("75001", "expected an object for Address, got str")]),
]


@pytest.mark.parametrize(
    ("annotation", "good", "bad"), SUPPORTED, ids=[show(a) for a, _, _ in SUPPORTED]
)
def test_supported_annotation(annotation: Any, good: list[Any], bad: list[tuple[Any, str]]):
    codec = codec_for(one_field(annotation))
    for value in good:
        decoded = codec.decode({"x": value}).x
        if annotation is Address:
            assert decoded == Address(zip="75001")
        else:
            assert decoded is value  # validated, never copied nor coerced
    for value, message in bad:
        assert mismatch(codec, {"x": value}) == f"payload.x: {message} (Model)"


def test_float_keeps_an_int_as_given():
    assert codec_for(one_field(float)).decode({"x": 2}).x.__class__ is int


def test_literal_int_refuses_true_and_one_point_zero():
    codec = codec_for(one_field(Literal[1]))
    assert codec.decode({"x": 1}).x == 1
    assert mismatch(codec, {"x": True}) == "payload.x: expected 1, got True (Model)"
    assert mismatch(codec, {"x": 1.0}) == "payload.x: expected 1, got 1.0 (Model)"


# -- paths, unknown keys, missing fields, defaults ----------------------------------------

SIGNUP = codec_for(Signup)


def test_decode_builds_the_model():
    obj = {
        "user_id": 1,
        "email": "a@b",
        "score": 0.5,
        "address": {"zip": "75001", "city": "Lyon"},
        "tags": ["x"],
        "meta": {"k": 2},
        "plan": "pro",
    }
    assert SIGNUP.decode(obj) == Signup(
        1, "a@b", 0.5, Address("75001", "Lyon"), ["x"], {"k": 2}, "pro"
    )
    assert SIGNUP.model is Signup
    assert isinstance(SIGNUP, payloads.Codec)


def test_wrong_type_names_the_field_and_the_model():
    obj = {"user_id": "1", "email": "a", "score": 1.0}
    assert mismatch(SIGNUP, obj) == "payload.user_id: expected int, got str (Signup)"


def test_nested_dataclass_path():
    obj = {"user_id": 1, "email": "a", "score": 1.0, "address": {"zip": 75001}}
    assert mismatch(SIGNUP, obj) == "payload.address.zip: expected str, got int (Signup)"
    obj["address"] = {"city": "Lyon"}
    assert mismatch(SIGNUP, obj) == "payload.address.zip: required field missing (Signup)"
    obj["address"] = ["75001"]
    assert mismatch(SIGNUP, obj) == ("payload.address: expected Address or None, got list (Signup)")


def test_list_index_path():
    obj = {"user_id": 1, "email": "a", "score": 1.0, "tags": ["a", "b", "c", 4]}
    assert mismatch(SIGNUP, obj) == "payload.tags[3]: expected str, got int (Signup)"


def test_dict_key_path():
    obj = {"user_id": 1, "email": "a", "score": 1.0, "meta": {"ok": 1, "k": "v"}}
    assert mismatch(SIGNUP, obj) == "payload.meta['k']: expected int, got str (Signup)"


def test_literal_field():
    obj = {"user_id": 1, "email": "a", "score": 1.0, "plan": "gold"}
    assert mismatch(SIGNUP, obj) == "payload.plan: expected 'free' or 'pro', got 'gold' (Signup)"


def test_paths_through_lists_dicts_and_unions_of_dataclasses():
    @dataclass
    class Box:
        items: list[Address]
        by_name: dict[str, Address]
        either: list[int] | str = "none"

    codec = codec_for(Box)
    good = codec.decode({"items": [{"zip": "1"}], "by_name": {"a": {"zip": "2"}}})
    assert good == Box([Address("1")], {"a": Address("2")})
    bad = {"items": [{"zip": "1"}, {"zip": 2}], "by_name": {}}
    assert mismatch(codec, bad) == "payload.items[1].zip: expected str, got int (Box)"
    bad = {"items": [], "by_name": {"a": {}}}
    assert mismatch(codec, bad) == "payload.by_name['a'].zip: required field missing (Box)"
    # A union member that got inside the value says where; else the union's own words.
    bad = {"items": [], "by_name": {}, "either": [1, "2"]}
    assert mismatch(codec, bad) == "payload.either[1]: expected int, got str (Box)"
    bad = {"items": [], "by_name": {}, "either": 3}
    assert mismatch(codec, bad) == "payload.either: expected list or str, got int (Box)"


def test_unknown_keys_are_ignored():
    obj = {"user_id": 1, "email": "a", "score": 1.0, "added_by_a_newer_producer": [1]}
    assert SIGNUP.decode(obj) == Signup(1, "a", 1.0)
    nested = {**obj, "address": {"zip": "1", "floor": 3}}
    assert SIGNUP.decode(nested).address == Address("1")


def test_missing_required_field():
    assert mismatch(SIGNUP, {"email": "a", "score": 1.0}) == (
        "payload.user_id: required field missing (Signup)"
    )


def test_defaults_and_default_factories_are_optional():
    first = SIGNUP.decode({"user_id": 1, "email": "a", "score": 1.0})
    second = SIGNUP.decode({"user_id": 2, "email": "a", "score": 1.0})
    assert (first.address, first.tags, first.meta, first.plan) == (None, [], {}, "free")
    assert first.tags is not second.tags  # the factory ran for each


def test_init_false_fields_are_neither_read_nor_required():
    @dataclass
    class Order:
        total: int
        doubled: int = field(init=False)

        def __post_init__(self) -> None:
            self.doubled = self.total * 2

    codec = codec_for(Order)
    assert codec.decode({"total": 2, "doubled": "ignored"}).doubled == 4


def test_post_init_refusing_a_value_is_a_mismatch():
    @dataclass
    class Positive:
        n: int

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError("n must be positive")

    assert mismatch(codec_for(Positive), {"n": 0}) == (
        "payload: Positive() raised ValueError: n must be positive (Positive)"
    )


def test_payload_not_an_object():
    assert mismatch(SIGNUP, [1]) == "payload: expected an object for Signup, got list (Signup)"
    assert mismatch(SIGNUP, None) == "payload: expected an object for Signup, got None (Signup)"


def test_payload_mismatch_is_an_invalid_payload():
    with pytest.raises(InvalidPayload):
        SIGNUP.decode("x")


def test_string_annotations_are_resolved():
    # This module's `from __future__ import annotations`: the annotations are strings.
    assert Signup.__annotations__["user_id"] == "int"
    assert SIGNUP.decode({"user_id": 1, "email": "a", "score": 1, "address": {"zip": "1"}})


def test_recursive_dataclass():
    codec = codec_for(Node)
    tree = {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}
    assert codec.decode(tree) == Node("a", [Node("b", [Node("c")])])
    tree["children"][0]["children"][0]["name"] = 3
    assert (
        mismatch(codec, tree)
        == "payload.children[0].children[0].name: expected str, got int (Node)"
    )


def test_unresolvable_annotation_is_refused():
    @dataclass
    class Local:
        x: int

    @dataclass
    class Outer:
        inner: Local  # a string naming a class local to this function: not resolvable

    with pytest.raises(ValueError, match=r"annotations of .*Outer cannot be resolved: NameError"):
        codec_for(Outer)


# -- refused at build ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (
            list[set[int]],
            "field 'x': list[set[int]] is not supported (because of set[int]; supported are "
            "int, float, str, bool, None, Any, datetime, date, time, Decimal, UUID, unions "
            "of these, list[T], dict[str, T], Literal[...] and dataclasses)",
        ),
        (timedelta, "field 'x': timedelta is not supported (supported are int, float"),
        (tuple[int, ...], "field 'x': tuple[int, ...] is not supported"),
        (
            dict[int, str],
            "field 'x': dict[int, str] is not supported (dict keys must be str: JSON object "
            "keys are strings)",
        ),
        (
            int | bytes,
            "field 'x': int | bytes is not supported (because of bytes; supported are",
        ),
        (
            Literal[1.5],
            "field 'x': Literal[1.5] is not supported (Literal values must be str, int, bool "
            "or None)",
        ),
        (PSignup, "field 'x': PSignup is not supported"),
    ],
)
def test_unsupported_annotation_is_refused_naming_the_field(annotation: Any, message: str):
    with pytest.raises(ValueError) as info:
        codec_for(one_field(annotation))
    assert str(info.value).startswith(message)


@dataclass
class Inner:
    tags: set[int]


@dataclass
class Outer:
    ok: int
    inner: Optional[Inner]  # noqa: UP045


def test_unsupported_annotation_in_a_nested_dataclass_names_the_path():
    with pytest.raises(ValueError, match=r"^field 'inner\.tags': set\[int\] is not supported"):
        codec_for(Outer)


def test_init_var_is_refused():
    @dataclass
    class WithInitVar:
        x: int
        seed: InitVar[int]

    with pytest.raises(ValueError, match=r"^field 'seed': .* is not supported \(an InitVar"):
        codec_for(WithInitVar)


@pytest.mark.parametrize(
    ("model", "what"),
    [
        (int, "int"),
        (dict, "dict"),
        ({"a": 1}, "dict"),
        (None, "NoneType"),
        (Signup(1, "a", 1.0), "a dataclass instance, not its class"),
        (PSignup(user_id=1, email="a"), "PSignup"),
        (type("Plain", (), {}), "Plain"),
    ],
)
def test_not_a_model_is_refused(model: object, what: str):
    with pytest.raises(ValueError) as info:
        codec_for(model)
    assert str(info.value) == f"payload= takes a dataclass or a pydantic model class, not {what}"


# -- pydantic ---------------------------------------------------------------------------


def test_pydantic_decode_is_model_validate_lax_by_default():
    codec = codec_for(PSignup)
    assert codec.model is PSignup
    assert codec.decode({"user_id": "42", "email": "a", "extra": 1}) == PSignup(
        user_id=42, email="a"
    )


def test_pydantic_strict_model_refuses_a_string_for_an_int():
    codec = codec_for(PStrict)
    assert codec.decode({"user_id": 42}) == PStrict(user_id=42)
    assert mismatch(codec, {"user_id": "42"}) == (
        "payload.user_id: int_type: Input should be a valid integer (PStrict)"
    )


def test_pydantic_error_message():
    codec = codec_for(PSignup)
    assert mismatch(codec, {"user_id": "x", "email": "a"}) == (
        "payload.user_id: int_parsing: Input should be a valid integer, unable to parse "
        "string as an integer (PSignup)"
    )
    assert mismatch(codec, {"user_id": "x"}) == (
        "payload.user_id: int_parsing: Input should be a valid integer, unable to parse "
        "string as an integer (PSignup) (and 1 more)"
    )
    assert mismatch(codec, {"user_id": 1, "email": "a", "tags": [1, "b"]}) == (
        "payload.tags[1]: int_parsing: Input should be a valid integer, unable to parse "
        "string as an integer (PSignup)"
    )
    assert mismatch(codec, [1]).startswith("payload: model_type: Input should be")


def test_pydantic_is_never_imported_by_brooq_payloads():
    script = """
import sys
from dataclasses import dataclass
import brooq
from brooq import encoding
from brooq.declare import payloads
from brooq.job import Job

@dataclass
class Signup:
    user_id: int

codec = payloads.codec_for(Signup)
codec.decode({"user_id": 1})
encoding.to_json(Signup(1))
encoding.is_model_instance(Signup(1))
Job("t", Signup(1))
try:
    payloads.codec_for(int)
except ValueError:
    pass
assert "pydantic" not in sys.modules, "pydantic was imported"
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- to_json, is_model_instance -----------------------------------------------------------


def test_to_json_of_a_dataclass_is_recursive():
    value = Signup(1, "a", 0.5, Address("1"), ["t"], {"k": 1}, "pro")
    assert to_json(value) == {
        "user_id": 1,
        "email": "a",
        "score": 0.5,
        "address": {"zip": "1", "city": "Paris"},
        "tags": ["t"],
        "meta": {"k": 1},
        "plan": "pro",
    }


def test_to_json_of_lists_and_dicts_of_dataclasses():
    @dataclass
    class Box:
        items: list[Address]
        by_name: dict[str, Address]
        pair: Any

    value = Box([Address("1")], {"a": Address("2", "Lyon")}, (Address("3"), 4))
    assert to_json(value) == {
        "items": [{"zip": "1", "city": "Paris"}],
        "by_name": {"a": {"zip": "2", "city": "Lyon"}},
        "pair": [{"zip": "3", "city": "Paris"}, 4],
    }


def test_to_json_of_a_pydantic_model():
    value = PSignup(user_id=1, email="a", tags=[2])
    assert to_json(value) == {"user_id": 1, "email": "a", "tags": [2]}

    class WithTime(pydantic.BaseModel):
        at: datetime

    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert to_json(WithTime(at=at)) == {"at": "2026-01-02T03:04:05Z"}  # mode="json"


@pytest.mark.parametrize("value", [{"a": [1]}, [1], "s", 1, 1.5, True, None, (1, 2), object()])
def test_to_json_leaves_anything_else_as_it_is(value: Any):
    assert to_json(value) is value


def test_to_json_of_a_cyclic_dataclass_is_refused():
    node = Node("a")
    node.children.append(node)
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        to_json(node)


def test_to_json_round_trips_through_decode():
    value = Node("a", [Node("b"), Node("c", [Node("d")])])
    assert codec_for(Node).decode(json.loads(json.dumps(to_json(value)))) == value


def test_is_model_instance():
    assert is_model_instance(Signup(1, "a", 1.0))
    assert is_model_instance(PSignup(user_id=1, email="a"))
    assert not is_model_instance(Signup)
    assert not is_model_instance(PSignup)
    assert not is_model_instance({"user_id": 1})
    assert not is_model_instance(None)
    assert not is_model_instance(object())


# -- Job and Claim --------------------------------------------------------------------------


def test_job_with_a_dataclass_instance():
    value = Signup(7, "a@b", 1.5, Address("1"), ["x"])
    job = Job("user.signup", value)
    assert job.payload is value
    assert json.loads(job.payload_json) == to_json(value)
    assert SIGNUP.decode(json.loads(job.payload_json)) == value


def test_job_with_a_pydantic_instance():
    value = PSignup(user_id=7, email="a@b", tags=[1])
    job = Job("user.signup", value)
    assert job.payload is value
    assert json.loads(job.payload_json) == {"user_id": 7, "email": "a@b", "tags": [1]}
    assert codec_for(PSignup).decode(json.loads(job.payload_json)) == value


def test_job_with_a_dataclass_of_unserialisable_fields_is_refused():
    @dataclass
    class Stamp:
        lasted: timedelta

    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        Job("t", Stamp(timedelta(seconds=1)))


def test_job_with_a_plain_payload_is_unchanged():
    assert Job("t", {"a": [1, 2.5]}).payload_json == '{"a":[1,2.5]}'
    assert Job("t", (1, 2)).payload_json == "[1,2]"
    assert Job("t").payload_json == "null"


def test_claim_is_generic_at_no_cost():
    now = datetime.now(timezone.utc)
    typed = Claim[Signup](uuid.uuid4(), "t", Signup(1, "a", 1.0), 1, "w", now)
    assert typed.payload.user_id == 1
    bare = Claim(uuid.uuid4(), "t", {"a": 1}, 1, "w", now)
    assert bare.payload == {"a": 1}
    assert type(typed) is Claim


def test_the_prebuilt_encoder_writes_what_json_dumps_writes():
    from brooq import encoding as encoding_mod

    assert encoding_mod._C_ENCODER is not None  # CPython: the accelerator is the one in use
    values = [
        {"a": [1, -2.5, None, True, 'é\n\u2028"q"', {"n": {}}], "": [], "k": 1e300},
        "plain",
        [0.1, 1e-7, 12345678901234567890, -0.0],
        {"emoji": "\U0001f600", "tab": "\t", "nul-escaped": "\\u0000"},
    ]
    for value in values:
        expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        assert "".join(encoding_mod._C_ENCODER(value, 0)) == expected
        assert Job("t", value).payload_json == encoding_mod._keep_floats(expected)


def test_without_the_accelerator_the_same_payloads_and_refusals(monkeypatch):
    from brooq import encoding as encoding_mod

    with_it = Job("t", {"a": [1, 2.5, "x"]}).payload_json
    monkeypatch.setattr(encoding_mod, "_C_ENCODER", None)
    assert Job("t", {"a": [1, 2.5, "x"]}).payload_json == with_it
    looped: dict[str, Any] = {}
    looped["me"] = looped
    with pytest.raises(InvalidPayload, match="not JSON-serialisable: Circular reference"):
        Job("t", looped)
    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        Job("t", float("nan"))
