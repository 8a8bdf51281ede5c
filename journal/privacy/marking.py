"""Which fields of which payloads hold personal data, and whose: the declarations the codec follows.

Three ways to mark a field, all ending in one registry keyed by event type:

    class CustomerRegistered(BaseModel):            # aggregates: on the event's payload schema
        customer_id: str
        email: Annotated[str, Sensitive(subject="customer_id")]
        photo: Annotated[str, Blob()]

    @flow("signup", input_model=Signup)             # flows: on the input model (EXECUTION_STARTED.input)
    declare_step("charge", ChargeResult)            # flows: a step's result (STEP_COMPLETED.result)

    declare("OrderPlaced", ["email", "address.street"], subject="customer_id")   # plain Envelope payloads

A subject is named by the path of a payload field holding its id (dotted, from the payload's root);
that field itself is stored in clear (it is how the key is found; docs/privacy.md, "limits").
Declarations only add: a type once marked stays marked (old events name their sealed fields
themselves, so a reader needs no declaration; a writer needs one to seal).
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from journal.exceptions import InvalidPayload

Path = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sensitive:
    """Marks a field as personal data of the subject whose id is in the field at path `subject`.

    discloses: roles (besides the owner and LOOM_DISCLOSE_ROLES) whose readers see the value.
    forgotten: what a state loading the field after `forget` gets: "marker" (the FORGOTTEN text)
    or "error" (ForgottenData naming the field)."""

    subject: str
    discloses: tuple[str, ...] = ()
    forgotten: str = "marker"

    def __post_init__(self) -> None:
        if not isinstance(self.subject, str) or not self.subject:
            raise InvalidPayload("Sensitive(subject=...) names the payload field holding the subject's id")
        if self.forgotten not in ("marker", "error"):
            raise InvalidPayload(f"Sensitive(forgotten=...) is 'marker' or 'error', not {self.forgotten!r}")
        object.__setattr__(self, "discloses", tuple(self.discloses))


@dataclass(frozen=True, slots=True)
class Blob:
    """Marks a field whose value is stored in the content store (SHA-256 addressed); the event keeps a
    reference. Combined with Sensitive, the stored blob is the field's ciphertext."""


@dataclass(frozen=True, slots=True)
class Field:
    """One marked field of a payload: where it is, whose it is (None: not sensitive, only a blob)."""

    path: Path
    subject: Path | None
    discloses: tuple[str, ...] = ()
    forgotten: str = "marker"
    blob: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    """The fields of one event type, for payloads whose `when` path holds `value` (None: all of them)."""

    fields: tuple[Field, ...]
    when: tuple[Path, Any] | None = None


_rules: dict[str, tuple[Rule, ...]] = {}
_lock = threading.Lock()

MARKED: frozenset[str] = frozenset()
"""Event types with at least one marked field: the one check the write path makes (empty: no cost)."""


def path_of(dotted: str) -> Path:
    parts = tuple(dotted.split("."))
    if not all(parts):
        raise InvalidPayload(f"field path {dotted!r} has an empty segment")
    return parts


def add(type_: str, fields: Iterable[Field], when: tuple[Path, Any] | None = None) -> None:
    """Register marked fields of `type_` (idempotent: the same rule twice is kept once)."""
    global MARKED
    fields = tuple(fields)
    if not fields:
        return
    for f in fields:
        if f.subject is not None and (f.subject == f.path[: len(f.subject)] or f.path == f.subject[: len(f.path)]):
            raise InvalidPayload(f"{type_}: field {'.'.join(f.path)} cannot be (inside) its own subject field")
    rule = Rule(fields, when)
    with _lock:
        known = _rules.get(type_, ())
        if rule not in known:
            _rules[type_] = (*known, rule)
        MARKED = frozenset(_rules)


def declare(type_: str, sensitive: Iterable[str] = (), *, subject: str | None = None,
            blobs: Iterable[str] = (), discloses: Iterable[str] = (), forgotten: str = "marker") -> None:
    """Mark fields of plain Envelope payloads of `type_`: `sensitive` paths belong to the subject whose
    id is at path `subject`; `blobs` paths go to the content store."""
    sensitive, blobs = [path_of(p) for p in sensitive], [path_of(p) for p in blobs]
    if sensitive and not subject:
        raise InvalidPayload(f"declare({type_!r}): sensitive fields need subject=<path of the subject's id>")
    marker = Sensitive(subject or "-", tuple(discloses), forgotten)
    who = path_of(subject) if subject else None
    add(type_, [Field(p, who, marker.discloses, marker.forgotten, p in blobs) for p in sensitive]
        + [Field(p, None, blob=True) for p in blobs if p not in sensitive])


def fields_of_model(model: type, prefix: Path = (), root: Path | None = None) -> list[Field]:
    """The marked fields of a pydantic model (nested models included), paths under `prefix`; a subject
    path is read from `root` (default: `prefix`, the payload object the model is stored as)."""
    root = prefix if root is None else root
    found: list[Field] = []
    model_fields = getattr(model, "model_fields", None)
    if not model_fields:
        return found
    for name, info in model_fields.items():
        path = (*prefix, name)
        sensitive = next((m for m in info.metadata if isinstance(m, Sensitive)), None)
        blob = any(isinstance(m, Blob) for m in info.metadata)
        if sensitive is not None or blob:
            subject = (*root, *path_of(sensitive.subject)) if sensitive else None
            found.append(Field(path, subject, sensitive.discloses if sensitive else (),
                               sensitive.forgotten if sensitive else "marker", blob))
            continue
        for inner in _models_in(info.annotation):
            found.extend(fields_of_model(inner, path, root))
    return found


def _models_in(annotation: Any) -> list[type]:
    """Pydantic models directly in an annotation (X, X | None); a list of models is not walked (its
    items have no fixed path: mark the list field itself)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return [annotation]
    return [a for a in typing.get_args(annotation) if isinstance(a, type) and hasattr(a, "model_fields")]


def declare_model(type_: str, model: type, prefix: Path = (), when: tuple[Path, Any] | None = None) -> bool:
    """Register the marked fields of `model` stored at `prefix` of `type_` payloads; whether any were."""
    fields = fields_of_model(model, prefix)
    add(type_, fields, when)
    return bool(fields)


def declare_step(step: str, result_model: type) -> None:
    """Mark the fields of a flow step's result (by step name, in every flow): STEP_COMPLETED.result."""
    declare_model("STEP_COMPLETED", result_model, ("result",), (("step",), step))


def fields_for(type_: str, payload: Any) -> list[Field]:
    """The marked fields that apply to this payload of `type_` (its rules' `when` checked)."""
    out: list[Field] = []
    for rule in _rules.get(type_, ()):
        if rule.when is None or (isinstance(payload, Mapping) and get(payload, rule.when[0]) == rule.when[1]):
            out.extend(rule.fields)
    return out


def fixed_fields(type_: str) -> tuple[Field, ...] | None:
    """The marked fields of every payload of `type_` when no rule of it depends on the payload (no `when`);
    None when one does (fields_for must look at each payload)."""
    rules = _rules.get(type_, ())
    if any(rule.when is not None for rule in rules):
        return None
    return tuple(f for rule in rules for f in rule.fields)


def field_rule(type_: str, path: Path) -> Field | None:
    """The declaration of one field (for its disclosure roles), if this process knows it."""
    for rule in _rules.get(type_, ()):
        for f in rule.fields:
            if f.path == path:
                return f
    return None


_MISSING = object()


def get(payload: Any, path: Path, default: Any = None) -> Any:
    node = payload
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def has(payload: Any, path: Path) -> bool:
    return get(payload, path, _MISSING) is not _MISSING


def copy_set(payload: dict, path: Path, value: Any) -> dict:
    """`payload` with `value` at `path` (the writing twin of `get`), copying only the objects along the path:
    the caller's payload is never changed."""
    top = dict(payload)
    node = top
    for part in path[:-1]:
        node[part] = dict(node[part])
        node = node[part]
    node[path[-1]] = value
    return top
