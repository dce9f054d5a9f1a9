"""Typed payloads: from a handler's declared model (a dataclass or a pydantic model) to a
checker of the JSON its jobs carry (a model instance back to JSON is brooq.encoding's
`to_json`).

Owns: `codec_for` (one `Codec` per typed topic, built once at registration: the field
checkers, brooq.declare.payload_checks's, are precomputed there, so `decode` only walks the
value), a dataclass's own check, which annotations map to which checker and the refusal
of the others (ValueError naming the field and the
annotation; the caller prefixes the topic), the text of `PayloadMismatch`
(``payload.user_id: expected int, got str (Signup)``).

Must never: import pydantic (an application that uses it has imported it: a class is a
pydantic model iff ``"pydantic" in sys.modules`` and it subclasses its BaseModel), do
I/O, or second-guess a pydantic model's own config (its strictness is the model's).

What `decode` checks for a dataclass, and why:

- Values are checked by their exact JSON type, as ``json.loads`` returns them: ``int``
  refuses ``bool`` (True is an int in Python, not in JSON), ``float`` accepts an int and
  keeps it an int (PEP 484's numeric tower: an int is a valid float), nothing is coerced.
- Unknown keys are ignored, as pydantic's default ``extra="ignore"``: a producer one
  release ahead that adds a field must not kill the jobs of workers one release behind.
- A field with a default or a default_factory may be missing; ``init=False`` fields are
  neither read nor required. Object keys are not checked (JSON keys are strings).
- A ``__post_init__`` that raises ValueError or TypeError refuses the payload too.
- Annotations are resolved once, by typing.get_type_hints against the class's module (so
  string annotations work; a class local to a function cannot be named by one, and is
  refused with the NameError). ``Annotated[X, ...]`` and a NewType of X are checked as X;
  a dataclass may contain itself (``children: list[Node]``).

Cost: `decode` and `to_json` of a small dataclass are each a fraction of what building
a Job costs, so a typed payload adds little to ``Job(topic, Signup(...))`` against the
equivalent dict; a plain payload pays only one frozenset lookup in `brooq.Job`, within
noise (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any, Literal, Union

from brooq.declare.payload_checks import (
    ANY,
    PLAIN,
    Check,
    Mismatch,
    Spec,
    Unsupported,
    dict_of,
    kind_of,
    list_of,
    literal,
    show,
    union,
    wrong,
)
from brooq.encoding import pydantic_base
from brooq.errors import PayloadMismatch

# The payloads `brooq.Job` stores as they are: `to_json` (and Job before calling it)
# answers them with one set lookup, since this is on the enqueue hot path.


class _Shape:
    """One dataclass: its fields' checkers, and the check building an instance."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = cls.__name__
        # (name, path segment, required, check); set by _Builder once the fields are
        # built (after this shape is registered, so that a recursive model terminates).
        self.fields: tuple[tuple[str, str, bool, Check], ...] = ()

    def check(self, value: Any) -> Any:
        if value.__class__ is not dict:
            raise wrong(f"an object for {self.name}", kind_of(value))
        kwargs: dict[str, Any] = {}
        for name, segment, required, check in self.fields:
            try:
                field_value = value[name]
            except KeyError:
                if required:
                    exc = Mismatch("required field missing")
                    exc.path.append(segment)
                    raise exc from None
                continue
            try:
                kwargs[name] = check(field_value)
            except Mismatch as exc:
                exc.path.append(segment)
                raise
        try:
            return self.cls(**kwargs)
        except (TypeError, ValueError) as exc:
            # A __post_init__ refusing a value: the payload does not fit the model.
            raise Mismatch(f"{self.name}() raised {type(exc).__name__}: {exc}") from None


class _FieldUnsupported(Exception):
    """An unsupported annotation with the path of the field holding it."""

    def __init__(self, name: str, hint: object, cause: Unsupported) -> None:
        super().__init__(name)
        self.path = [name]
        self.hint = hint
        self.cause = cause

    def message(self) -> str:
        part = self.cause.part
        reason = self.cause.reason
        if part is not self.hint:
            reason = f"because of {show(part)}; {reason}"
        return f"field {'.'.join(self.path)!r}: {show(self.hint)} is not supported ({reason})"


class _Builder:
    """Builds the specs of one codec_for call; `shapes` makes recursive models finite."""

    def __init__(self) -> None:
        self.shapes: dict[type, _Shape] = {}

    def spec(self, hint: Any) -> Spec:
        plain = PLAIN.get(hint) if isinstance(hint, type) or hint is None else None
        if plain is not None:
            return plain
        if hint is Any:
            return ANY
        supertype = getattr(hint, "__supertype__", None)  # typing.NewType
        if supertype is not None:
            return self.spec(supertype)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is Literal:
            return literal(args)
        if origin is Union or origin is types.UnionType:
            return union([self.spec(arg) for arg in args])
        if hint is list or origin is list:
            return list_of(self.spec(args[0]) if args else ANY)
        if hint is dict or origin is dict:
            if args and args[0] is not str:
                raise Unsupported(hint, "dict keys must be str: JSON object keys are strings")
            return dict_of(self.spec(args[1]) if args else ANY)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            shape = self.shape(hint)
            return Spec(shape.check, hint.__name__, transforms=True)
        raise Unsupported(hint)

    def shape(self, cls: type) -> _Shape:
        known = self.shapes.get(cls)
        if known is not None:
            return known
        shape = self.shapes[cls] = _Shape(cls)
        try:
            # Once, here: resolves string annotations (from __future__ import annotations)
            # against the class's module.
            hints = typing.get_type_hints(cls)
        except Exception as exc:  # NameError for a name the module does not define, ...
            raise ValueError(
                f"the annotations of {cls.__qualname__} cannot be resolved: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        for name, hint in hints.items():
            if isinstance(hint, dataclasses.InitVar):
                # A constructor argument that is not a field: decode could not pass it.
                reason = "an InitVar is a constructor argument, not a field"
                raise _FieldUnsupported(name, hint, Unsupported(hint, reason))
        fields = []
        for field in dataclasses.fields(cls):
            if not field.init:
                continue  # computed by the class itself (in __post_init__)
            hint = hints[field.name]
            try:
                spec = self.spec(hint)
            except Unsupported as exc:
                raise _FieldUnsupported(field.name, hint, exc) from None
            except _FieldUnsupported as exc:
                exc.path.insert(0, field.name)
                raise
            required = (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            fields.append((field.name, f".{field.name}", required, spec.check))
        shape.fields = tuple(fields)
        return shape


class Codec:
    """A typed topic's payload model, and its decoding of a job's parsed JSON."""

    __slots__ = ("model",)

    def __init__(self, model: type) -> None:
        self.model = model

    def decode(self, obj: Any) -> Any:
        """The model instance, or PayloadMismatch naming the field at fault."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model.__qualname__})"


class _DataclassCodec(Codec):
    __slots__ = ("_check",)

    def __init__(self, model: type, shape: _Shape) -> None:
        super().__init__(model)
        self._check = shape.check

    def decode(self, obj: Any) -> Any:
        try:
            return self._check(obj)
        except Mismatch as exc:
            raise PayloadMismatch(exc.render(self.model.__name__)) from None


class _PydanticCodec(Codec):
    __slots__ = ("_error", "_validate")

    def __init__(self, model: type, error: type[Exception]) -> None:
        super().__init__(model)
        self._validate: Check = model.model_validate  # type: ignore[attr-defined]
        self._error = error

    def decode(self, obj: Any) -> Any:
        try:
            return self._validate(obj)
        except self._error as exc:
            raise PayloadMismatch(_pydantic_message(exc, self.model.__name__)) from None


def _pydantic_message(exc: Any, model: str) -> str:
    errors = exc.errors(include_url=False)
    if not errors:  # not seen in practice; keep pydantic's own text
        return f"payload: {exc} ({model})"
    first = errors[0]
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"payload{path}: {first['type']}: {first['msg']} ({model}){more}"


def codec_for(model: object) -> Codec:
    """The codec of ``model``, a dataclass class or a pydantic BaseModel subclass.
    ValueError when it is neither, or when a field's annotation is not supported (the
    message names the field and the annotation; the caller prefixes the topic)."""
    base = pydantic_base()
    if base is not None and isinstance(model, type) and issubclass(model, base):
        error = sys.modules["pydantic"].ValidationError
        return _PydanticCodec(model, error)
    if not (isinstance(model, type) and dataclasses.is_dataclass(model)):
        what = (
            "a dataclass instance, not its class"
            if dataclasses.is_dataclass(model)
            else f"{show(model) if isinstance(model, type) else type(model).__name__}"
        )
        raise ValueError(f"payload= takes a dataclass or a pydantic model class, not {what}")
    try:
        shape = _Builder().shape(model)
    except _FieldUnsupported as exc:
        raise ValueError(exc.message()) from None
    return _DataclassCodec(model, shape)
