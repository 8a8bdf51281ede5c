"""The encode/decode boundary of personal data: seal payloads before their row is written, reveal
them after a read, a whole batch at a time.

A sealed payload names its own sealed fields, so a reader needs no declaration:

    {"customer_id": "c-7", "email": "<base64 nonce+ciphertext>",
     "$sealed": [[["email"], "c-7", 2]],      # path, subject, version: AES-GCM under c-7's data key
     "$blobs": [["photo"]]}                   # path: the value is the SHA-256 of its content

and a payload above LOOM_CONTENT_THRESHOLD_BYTES is stored as `{"$content": "<sha256>", "$size": n}`.
Each field's ciphertext is bound (AES-GCM associated data) to its event type, path and subject and (version 2)
to the event's stream and whole header, so a ciphertext moved to another field, subject or stream, or a header
edited, fails like a tampered one (TamperedCiphertext); a marked field left in clear is SealDowngraded.
Version-1 entries (`[path, subject]`, written before the stream binding) keep their old rule.

Reading: whole-payload references are resolved in one content-store call; the keys of every subject of
the batch are looked up in one statement (on PostgreSQL they come with the read's own, `READ_SEALED`); the blob
fields a reader will see are fetched in one more call; each field is decrypted, or replaced by FORGOTTEN
(no key: the subject was forgotten) or WITHHELD (the reader may not see it).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.signals import setting_changed
from django.dispatch import receiver

from journal import conf, jsonvalues
from journal.envelopes import Envelope, StoredEvent
from journal.exceptions import InvalidPayload, SealDowngraded, TamperedCiphertext
from journal.privacy import content, keys, marking
from journal.privacy.marking import Path

FORGOTTEN = "<forgotten>"
"""What a sealed field reads as once its subject was forgotten (its data key destroyed)."""

WITHHELD = "<redacted>"
"""What a sealed field reads as for a reader its disclosure does not allow."""

SEALED, BLOBS, CONTENT, SIZE = "$sealed", "$blobs", "$content", "$size"
RESERVED = frozenset({SEALED, BLOBS, CONTENT, SIZE})
NONCE = 12


class Sealed(dict):
    """A payload our own sealing produced (`seal_payload`): the write path stores it as it is, neither sealing
    it again nor refusing its reserved keys. Only code makes one (a payload from outside is a plain dict), and
    it pickles as a dict does: a queued start carries its input in this form (leases/tasks.py)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Reader:
    """Who reads, for disclosure: an id (the owner sees its own fields) and roles. None = the system."""

    id: str | None = None
    roles: frozenset[str] = frozenset()


_switches: tuple[bool, int | None] | None = None


def _settings() -> tuple[bool, int | None]:
    """(a master key or key service is configured, LOOM_CONTENT_THRESHOLD_BYTES), read once and again after
    any LOOM_* setting changes (Django's setting_changed: override_settings, the tests' `settings`). Every
    append and read asks, and a setting read costs microseconds."""
    global _switches
    if _switches is None:
        _switches = (bool(conf.get("LOOM_KEYS")) or bool(conf.get("LOOM_KEY_SERVICE")),
                     conf.get("LOOM_CONTENT_THRESHOLD_BYTES"))
    return _switches


@receiver(setting_changed)
def _forget_switches(setting: str = "", **kwargs) -> None:
    global _switches
    if setting.startswith("LOOM_"):
        _switches = None


def active() -> bool:
    """Whether reads may meet sealed or stored-away payloads (False: the read path does nothing)."""
    if marking.MARKED:
        return True
    keyed, threshold = _settings()
    return keyed or threshold is not None


def needs_seal(items: Sequence) -> bool:
    """The write path's one check (AppendItems): a marked type, or a content threshold to measure against.
    Nothing marked and no threshold: two lookups, no walk over the envelopes."""
    marked = marking.MARKED
    if marked and any(env.type in marked for item in items for env in item.envelopes):
        return True
    return _settings()[1] is not None


# == sealing ==========================================================================================


VERSION = 2
"""The sealing rule new fields are written with; a header entry names it as its third element."""


def _aad(type_: str, path: Path, subject: str) -> bytes:
    """Version 1 (an entry of two elements): a field's ciphertext is bound to its event type, path and subject
    (none holds a NUL). Still read, never written."""
    return ("\x00".join((type_, *path)) + "\x01" + subject).encode()


def _header_text(sealed: list) -> str:
    """The header as bound into version-2 associated data: its JSON, compact (the same text at seal and read)."""
    return json.dumps(sealed, separators=(",", ":"))


def _aad2(stream_id: str, header: str, type_: str, path: Path, subject: str) -> bytes:
    """Version 2 (an entry `[path, subject, 2]`): bound also to the event's stream and to its whole header.

    The stream: a ciphertext replayed into another event of the subject (another execution's, another
    aggregate's) fails its tag. The header: a field dropped from it, to be read in clear (a downgrade), or any
    other edit of it, fails every other field's tag. (The event's seq is not known when it is sealed: the
    guarded insert assigns it, after the coalescer or a batch encoded the payload.) A version-1 text never
    equals a version-2 one: it starts with the event type, which holds no NUL."""
    return ("loom/2\x00" + stream_id + "\x00" + header + "\x00" + "\x00".join((type_, *path)) + "\x01"
            + subject).encode()


def _entry_aad(stream_id: str, header: Any, type_: str, entry: list) -> bytes:
    """The associated data of one header entry, by its version (`header`: the header's text, or the header)."""
    if len(entry) == 2:
        return _aad(type_, tuple(entry[0]), entry[1])
    text = header if type(header) is str else _header_text(header)
    return _aad2(stream_id, text, type_, tuple(entry[0]), entry[1])


def _pack(value: Any, text: str) -> bytes:
    """The plaintext of a field: a string as its UTF-8 (tag `s`), anything else as its JSON (tag `j`)."""
    return b"s" + value.encode() if type(value) is str else b"j" + text.encode()


def _subject_of(type_: str, payload: Any, field: marking.Field) -> str:
    value = marking.get(payload, field.subject)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise InvalidPayload(f"payload of {type_}: sensitive field {'.'.join(field.path)} needs its subject's id "
                             f"in {'.'.join(field.subject)} (a non-empty string or an integer), got {value!r}")
    subject = str(value)
    jsonvalues.dumps(subject, f"subject id in {'.'.join(field.subject)} of {type_}")  # no NUL, no lone surrogate
    if len(subject) > 200:
        raise InvalidPayload(f"payload of {type_}: subject id in {'.'.join(field.subject)} is over 200 characters "
                             "or holds a NUL")
    return subject


def refuse_reserved(type_: str, payload: Any) -> None:
    """InvalidPayload if a payload not sealed by us holds a reserved top-level key: a reader would take it for
    sealed data (and fail, or show the marker in place of a field). One set test per payload."""
    if type(payload) is dict and not RESERVED.isdisjoint(payload):
        found = ", ".join(sorted(RESERVED.intersection(payload)))
        raise InvalidPayload(f"payload of {type_} uses the reserved key {found} (reserved for sealed payloads: "
                             "$sealed, $blobs, $content, $size)")


def seal(store, envelopes: Sequence[Envelope], whole: bool = True, stream_id: str | None = None) -> list[Envelope]:
    """The envelopes to write: marked fields encrypted and blobs stored away. The caller's payloads are not
    changed. Raises InvalidPayload (nothing written, nothing stored) for a field that may not be stored.

    stream_id: the stream the events go to, bound into each field (version 2); None only for a payload sealed
    for the broker before its stream is written (version 1: `start` seals it again for its stream).
    A `Sealed` payload is already sealed: only the content threshold applies to it. whole=False: no
    content threshold (a payload sealed for the broker, not yet for the log)."""
    plans = []
    subjects: set[str] = set()
    for env in envelopes:
        payload = env.payload
        if not isinstance(payload, dict) or type(payload) is Sealed:
            plans.append((env, ()))
            continue
        refuse_reserved(env.type, payload)
        present = []
        for f in marking.fields_for(env.type, payload):
            value = marking.get(payload, f.path)
            if value is None:
                continue
            text = jsonvalues.dumps(value, f"field {'.'.join(f.path)} of {env.type}")  # the JSON rules, first
            owner = _subject_of(env.type, payload, f) if f.subject is not None else None
            if owner is not None:
                subjects.add(owner)
            present.append((f, value, text, owner))
        plans.append((env, present))
    data_keys = keys.for_write(store, subjects) if subjects else {}
    threshold = _settings()[1] if whole else None
    out: list[Envelope] = []
    links: list[tuple[str, str]] = []
    for env, present in plans:
        payload = env.payload
        sealed = [[list(f.path), owner] if stream_id is None else [list(f.path), owner, VERSION]
                  for f, _, _, owner in present if owner is not None and data_keys[owner] is not None]
        header = _header_text(sealed) if sealed and stream_id is not None else ""
        blobs = []
        for f, value, text, owner in present:
            if owner is not None:
                key = data_keys[owner]
                if key is None:  # forgotten: nothing of it is written
                    payload = marking.copy_set(payload, f.path, FORGOTTEN)
                    continue
                nonce = os.urandom(NONCE)
                aad = (_aad(env.type, f.path, owner) if stream_id is None
                       else _aad2(stream_id, header, env.type, f.path, owner))
                cipher = key.encrypt(nonce, _pack(value, text), aad)
                text = base64.b64encode(nonce + cipher).decode()
                if not f.blob:
                    payload = marking.copy_set(payload, f.path, text)
                    continue
            if f.blob:
                sha = content.store().put(text.encode())
                links.append((sha, owner or ""))
                blobs.append(list(f.path))
                payload = marking.copy_set(payload, f.path, sha)
        if sealed:
            payload = {**payload, SEALED: sealed}
        if blobs:
            payload = {**payload, BLOBS: blobs}
        if threshold is not None:
            text = jsonvalues.dumps(payload, f"payload of {env.type}")
            if len(text) > threshold and len(text.encode()) > threshold:
                sha = content.store().put(text.encode())
                links.append((sha, ""))
                payload = {CONTENT: sha, SIZE: len(text.encode())}
        out.append(env if payload is env.payload else Envelope(env.type, payload))
    if links:
        store.link_content(links)
    return out


def seal_payload(store, type_: str, payload: dict) -> Sealed:
    """`payload` of `type_` with its marked fields sealed (no content threshold), for a copy kept outside the
    log until it is written there (a queued start's input in the broker's rows): the log stores it as is."""
    return Sealed(seal(store, [Envelope(type_, payload)], whole=False)[0].payload)


def unseal(store, type_: str, payload: Sealed, stream_id: str = "(sealed)") -> dict:
    """A copy of a `Sealed` payload revealed as the system reads it (FORGOTTEN for a forgotten subject)."""
    event = StoredEvent(stream_id, 0, type_, json.loads(json.dumps(payload)), None)
    return reveal(store, [event])[0].payload


# == revealing ========================================================================================


def _allowed(reader: Reader | None, type_: str, path: Path, subject: str, rule: marking.Field | None = None) -> bool:
    if reader is None or reader.id == subject:
        return True
    roles = set(conf.get("LOOM_DISCLOSE_ROLES"))
    rule = rule or marking.field_rule(type_, path)
    if rule is not None:
        roles.update(rule.discloses)
    return bool(roles & reader.roles)


def disclose_model(model: type, data: Any, reader: Reader | None) -> Any:
    """A folded state's JSON (`model`'s marked fields) as `reader` may see it: WITHHELD where not allowed."""
    if reader is None or not isinstance(data, dict):
        return data
    for f in marking.fields_of_model(model):
        value = marking.get(data, f.path)
        if f.subject is None or value is None or value == FORGOTTEN:
            continue
        if not _allowed(reader, "", f.path, str(marking.get(data, f.subject)), f):
            data = marking.copy_set(data, f.path, WITHHELD)
    return data


def reveal(store, events: list[StoredEvent], reader: Reader | None = None,
           key_rows: dict | None = None) -> list[StoredEvent]:
    """The events as `reader` may see them (None: the system, everything still decryptable).

    key_rows: subject -> key row, of the rows the read's own statement brought with the events (PostgreSQL's
    READ_SEALED): no statement more for those subjects."""
    todo = []
    only_sealed = True  # no blob, no stored-away payload: the common case, _reveal_sealed
    marked = marking.MARKED
    passed: Any = _NOTHING  # (type, header) of an event whose header lists every field its type marks
    for i, e in enumerate(events):
        p = e.payload
        if type(p) is dict:
            # Events of a read mostly share type and header: one whose header lists every marked field vouches
            # for the next ones alike (when the type's marking does not depend on the payload).
            if (e.type in marked and CONTENT not in p and passed != (e.type, p.get(SEALED))
                    and _refuse_downgrade(e, p)):
                passed = (e.type, p.get(SEALED))
            if SEALED in p:
                todo.append(i)
                if BLOBS in p or CONTENT in p:
                    only_sealed = False
            elif BLOBS in p or CONTENT in p:
                todo.append(i)
                only_sealed = False
    if not todo:
        return events
    if only_sealed and reader is None:
        return _reveal_sealed(store, events, todo, key_rows)
    events = list(events)
    payloads = {i: events[i].payload for i in todo}
    for i, p in payloads.items():  # a header not in our shape is named before anything is read by it
        if CONTENT in p:
            if type(p[CONTENT]) is not str or not content.HEX.fullmatch(p[CONTENT]):
                _malformed(events[i], CONTENT)
        elif (problem := _header_problem(p)) is not None:
            _malformed(events[i], problem)
    whole = {p[CONTENT] for p in payloads.values() if CONTENT in p}
    if whole:
        got = content.store().get_many(whole)
        for i, p in payloads.items():
            if CONTENT in p:
                payloads[i] = p = json.loads(got[p[CONTENT]])
                if (problem := _header_problem(p)) is not None:
                    _malformed(events[i], problem)
                if events[i].type in marked:
                    _refuse_downgrade(events[i], p)
    subjects = {entry[1] for p in payloads.values() for entry in p.get(SEALED, ())}
    data_keys = keys.for_read(store, subjects, key_rows) if subjects else {}

    def verdict(event: StoredEvent, path: Path, subject: str) -> Any:
        """The field's key; None: forgotten; False: withheld from this reader."""
        key = data_keys.get(subject)
        if key is not None and reader is not None and not _allowed(reader, event.type, path, subject):
            return False
        return key

    # Blob fields: only the content a reader will see is fetched (a forgotten subject's was erased with its
    # key), all of the batch in one call.
    wanted = set()
    for i, p in payloads.items():
        if BLOBS not in p:
            continue
        sealed = {tuple(entry[0]): entry[1] for entry in p.get(SEALED, ())}
        for path in p[BLOBS]:
            path = tuple(path)
            if path not in sealed or verdict(events[i], path, sealed[path]):
                wanted.add(marking.get(p, path))
    got = content.store().get_many(wanted) if wanted else {}
    aads: dict[tuple, bytes] = {}  # a batch's fields mostly share type, path and subject
    for i, p in payloads.items():
        event = events[i]
        blobs = p.get(BLOBS)
        sealed = p.get(SEALED, ())
        if blobs:
            sealed_paths = {tuple(entry[0]) for entry in sealed}
            for path in map(tuple, blobs):
                ref = marking.get(p, path)
                if ref in got:
                    text = got[ref]
                    _set(p, path, text if path in sealed_paths else json.loads(text))
        header = _header_text(sealed) if any(len(entry) == 3 for entry in sealed) else ""
        for entry in sealed:
            path, subject = entry[0], entry[1]
            cached = (event.type, tuple(path), subject) if len(entry) == 2 else (event.stream_id, header,
                                                                                 event.type, tuple(path), subject)
            if reader is None and len(path) == 1:  # the common case (a system read of a top-level field), inline
                key, name = data_keys.get(subject), path[0]
                if key is None:
                    p[name] = FORGOTTEN
                    continue
                aad = aads.get(cached)
                if aad is None:
                    aad = aads[cached] = _entry_aad(event.stream_id, header, event.type, entry)
                p[name] = _open(key, event, (name,), aad, p.get(name))
                continue
            path = tuple(path)
            key = verdict(event, path, subject)
            if key is None:
                value: Any = FORGOTTEN
            elif key is False:
                value = WITHHELD
            else:
                aad = aads.get(cached)
                if aad is None:
                    aad = aads[cached] = _entry_aad(event.stream_id, header, event.type, entry)
                if len(path) == 1:
                    value = _open(key, event, path, aad, p.get(path[0]))
                    p[path[0]] = value
                    continue
                value = _open(key, event, path, aad, marking.get(p, path))
            _set(p, path, value)
        for name in (SEALED, BLOBS, CONTENT, SIZE):
            if name in p:
                del p[name]
        if p is not event.payload:  # content resolved into a new object; otherwise the event's own, changed in place
            events[i] = StoredEvent(event.stream_id, event.seq, event.type, p, event.recorded_at, event.id)
    return events


_NOTHING = object()


def _reveal_sealed(store, events: list[StoredEvent], todo: list[int], key_rows: dict | None) -> list[StoredEvent]:
    """`reveal` for the system (no disclosure) of events whose only header is "$sealed": each payload changed
    in place (parsed for this read only), no copy. The checks of the general path, in two passes: every
    header is checked and its subjects gathered before any key is looked up or any field read; then each
    field is opened (base64, its AES-GCM tag checked, its plaintext decoded) or marked FORGOTTEN.

    The events of a read mostly carry the same header (same fields, same subject): a header equal (==) to
    the one before is neither checked again nor planned again (JSON values equal to a list of [list of str,
    str] are of that shape), so what is left per field is the field's own decryption."""
    subjects: set[str] = set()
    headers = []  # each event's header, taken out of its payload; equal headers as one object
    checked: Any = _NOTHING  # equal to no JSON value (None is one: "$sealed": null is checked like any other)
    for i in todo:
        p = events[i].payload
        sealed = p.pop(SEALED)
        if sealed == checked:
            sealed = checked
        else:
            if type(sealed) is not list:
                _malformed(events[i], SEALED)
            for entry in sealed:
                if not _is_entry(entry):
                    _malformed(events[i], SEALED)
                subjects.add(entry[1])
            checked = sealed
        if SIZE in p:  # a resolved payload holds no second reference (_header_problem's order: SEALED first)
            _malformed(events[i], SIZE)
        headers.append(sealed)
    data_keys = keys.for_read(store, subjects, key_rows)
    a2b, nonce = binascii.a2b_base64, NONCE
    planned: Any = None
    plan_type = plan_stream = ""
    plan: list[tuple[Path, str | None, AESGCM | None, bytes]] = []
    for i, sealed in zip(todo, headers, strict=True):
        event = events[i]
        p = event.payload
        if sealed is not planned or event.type != plan_type or event.stream_id != plan_stream:
            header = _header_text(sealed)
            plan = [(tuple(entry[0]), entry[0][0] if len(entry[0]) == 1 else None, data_keys[entry[1]],
                     _entry_aad(event.stream_id, header, event.type, entry)) for entry in sealed]
            planned, plan_type, plan_stream = sealed, event.type, event.stream_id
        for path, name, key, aad in plan:
            text = p.get(name) if name is not None else marking.get(p, path)
            if key is None:
                value: Any = FORGOTTEN
            else:
                try:  # _open, inline: this is the per-field cost of a read
                    raw = a2b(text, strict_mode=True) if type(text) is str else b""
                    plain = key.decrypt(raw[:nonce], raw[nonce:], aad)
                except (InvalidTag, ValueError, binascii.Error):
                    _tampered(event, path)
                value = plain[1:].decode() if plain[:1] == b"s" else json.loads(plain[1:])
            if name is not None:
                p[name] = value
            else:
                _set(p, path, value)
    return events


def _is_entry(entry: Any) -> bool:
    """A header entry: [path, subject] (version 1) or [path, subject, 2] (version 2)."""
    return (type(entry) is list and (len(entry) == 2 or (len(entry) == 3 and type(entry[2]) is int
                                                           and entry[2] == VERSION))
            and type(entry[1]) is str and entry[1] != "" and _is_path(entry[0]))


def _is_path(value: Any) -> bool:
    if type(value) is list and len(value) == 1:  # the common case: a top-level field
        return type(value[0]) is str and value[0] != ""
    return type(value) is list and bool(value) and all(type(part) is str and part for part in value)


def _header_problem(p: Any) -> str | None:
    """The reserved key of a payload that is not in the shape our sealing writes, or None. A payload written
    before reserved keys were refused on every append, or changed in the table, is named, never half-read."""
    if type(p) is not dict:
        return CONTENT
    sealed = p.get(SEALED, [])
    if type(sealed) is not list or not all(_is_entry(entry) for entry in sealed):
        return SEALED
    blobs = p.get(BLOBS, [])
    if type(blobs) is not list or not all(_is_path(path) for path in blobs):
        return BLOBS
    if CONTENT in p or SIZE in p:  # a resolved payload holds no second reference
        return CONTENT if CONTENT in p else SIZE
    for path in blobs:
        ref = marking.get(p, tuple(path))
        if type(ref) is not str or not content.HEX.fullmatch(ref):
            return BLOBS
    return None


def _refuse_downgrade(event: StoredEvent, p: dict) -> bool:
    """SealDowngraded if a field this process marks sensitive for the event's type is in clear in the stored
    payload and not named by its header: one of ours would have been sealed (or written as FORGOTTEN).
    Editing the header cannot hide a version-2 field either way: the header is bound into every field.

    True when the header lists every field the type marks whatever the payload: another event of the type
    with an equal header needs no check."""
    if conf.get("LOOM_PRIVACY_ACCEPT_CLEAR"):
        return False  # the project reads events written before a field was marked (docs/privacy.md)
    fixed = marking.fixed_fields(event.type)
    fields = fixed if fixed is not None else marking.fields_for(event.type, p)
    sealed = p.get(SEALED)
    listed = ({tuple(entry[0]) for entry in sealed if type(entry) is list and entry and _is_path(entry[0])}
              if type(sealed) is list else set())
    complete = fixed is not None
    for f in fields:
        if f.subject is None or f.path in listed:
            continue
        complete = False
        value = marking.get(p, f.path)
        if value is None or value == FORGOTTEN:
            continue
        raise SealDowngraded(f"{event.stream_id}#{event.seq} field {'.'.join(f.path)}: {event.type} marks it "
                             "sensitive but the stored event holds it in clear, not in its $sealed header "
                             "(the header was edited, or the event was written before the field was marked)")
    return complete


def _malformed(event: StoredEvent, key: str) -> NoReturn:
    raise TamperedCiphertext(f"{event.stream_id}#{event.seq}: the payload's {key} is not in the shape Loom's sealing "
                             "writes (changed in the table, or written as plain data before reserved keys were "
                             "refused)")


def _set(payload: dict, path: Path, value: Any) -> None:
    """Set in place: a payload being revealed was parsed for this read only."""
    node = payload
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _open(key: AESGCM, event: StoredEvent, path: Path, aad: bytes, text: Any) -> Any:
    try:
        raw = binascii.a2b_base64(text, strict_mode=True) if type(text) is str else b""
        plain = key.decrypt(raw[:NONCE], raw[NONCE:], aad)
    except (InvalidTag, ValueError, binascii.Error):
        _tampered(event, path)
    return plain[1:].decode() if plain[:1] == b"s" else json.loads(plain[1:])


def _tampered(event: StoredEvent, path: Path) -> NoReturn:
    raise TamperedCiphertext(f"{event.stream_id}#{event.seq} field {'.'.join(path)}: the ciphertext fails its "
                             "AES-GCM tag (changed after it was written)") from None


def withhold(type_: str, payload: Any) -> Any:
    """`payload` with its marked fields replaced by WITHHELD (for copies kept beside the log, such as an
    execution header's input)."""
    if not isinstance(payload, dict) or type_ not in marking.MARKED:
        return payload
    for f in marking.fields_for(type_, payload):
        if f.subject is not None and marking.get(payload, f.path) is not None:
            payload = marking.copy_set(payload, f.path, WITHHELD)
    return payload


def sealed_fields(events: list[StoredEvent]) -> bool:
    """Whether any of these raw events carries sealed fields (tests and the admin use it)."""
    return any(isinstance(e.payload, dict) and SEALED in e.payload for e in events)
