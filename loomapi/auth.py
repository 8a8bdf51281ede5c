"""Bearer-token authentication and scopes of the HTTP API (the admin and result pages keep Django's auth).

`Authorization: Bearer <token>` must carry one of LOOM_API_TOKENS. LOOM_API_AUTH=false turns the
check off; that is meant for a local benchmark only, and loom_serve_api says so loudly when it happens.

LOOM_API_TOKENS entries (docs/http-api.md "Tokens and scopes"):

- a plain string: the token, with full access (every flow, every execution); this is the old format,
  so a plain list of tokens keeps working;
- an object `{"token": "...", "name": "ci", "flows": ["calc.*"], "read": "own"}`: the token may start
  and call only the flows matching one of `flows` (shell-style patterns, default `["*"]`), and with
  `"read": "own"` may read (and retry) only the executions it started itself (default `"all"`).
  `name` identifies the token in the executions it starts and in the logs (default: `token-` and
  the first 12 hex digits of the token's SHA-256, never the token itself).

From the environment, LOOM_API_TOKENS is either comma-separated plain tokens or, when it starts
with `[`, a JSON array of such entries.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
from dataclasses import dataclass

from django.conf import settings

from journal import conf
from journal.flows.errors import UnknownFlow
from journal.flows.registry import exposed
from journal.privacy import Reader
from loomapi.errors import Unauthorized, UnknownFlowError

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="loom"'}
_ENTRY_KEYS = {"token", "name", "flows", "read", "roles"}


class TokenConfigError(ValueError):
    """LOOM_API_TOKENS holds an entry this module cannot read (reported by the system check loom.E201)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's name and what it may do."""

    name: str
    flows: tuple[str, ...] = ("*",)
    read_all: bool = True
    roles: tuple[str, ...] = ()  # disclosure roles (docs/privacy.md): sensitive fields this token may read

    def reader(self):
        """The disclosure reader of this token: its name (the owner of its own data) and roles; None (the
        system, everything) only for ANONYMOUS, when LOOM_API_AUTH is off."""

        return None if self is ANONYMOUS else Reader(self.name, frozenset(self.roles))

    def may_use(self, flow: str) -> bool:
        """Start, call (and read) `flow`: one of this token's patterns matches it, and it is not an
        internal flow (`loom.*`) that LOOM_EXPOSED_INTERNAL_FLOWS leaves out; no pattern (not `*`, not
        `loom.*`) reaches one of those, which run code by path (journal/flows/registry.py `exposed`)."""
        return exposed(flow) and any(fnmatch.fnmatchcase(flow, pattern) for pattern in self.flows)

    def may_read(self, started_by: str | None, flow: str) -> bool:
        """Read (and retry) an execution: only of a flow this token may use, and, with "read": "own",
        only one it started."""
        return self.may_use(flow) and (self.read_all or started_by == self.name)


ANONYMOUS = Principal("anonymous")
"""The caller when LOOM_API_AUTH is off: full access (local benchmarks only)."""


@dataclass(frozen=True, slots=True)
class TokenEntry:
    token: bytes
    principal: Principal


def token_name(token: str) -> str:
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def _entry(raw: object) -> TokenEntry:
    if isinstance(raw, str):
        return TokenEntry(raw.encode(), Principal(token_name(raw)))
    if not isinstance(raw, dict):
        raise TokenConfigError(f"a LOOM_API_TOKENS entry is a string or an object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise TokenConfigError(f"unknown key(s) {unknown} in a LOOM_API_TOKENS entry; allowed: {sorted(_ENTRY_KEYS)}")
    token = raw.get("token")
    if not isinstance(token, str) or not token:
        raise TokenConfigError("a LOOM_API_TOKENS entry object needs a non-empty string 'token'")
    flows = raw.get("flows", ["*"])
    if isinstance(flows, str) or not isinstance(flows, list) or not all(isinstance(f, str) for f in flows):
        raise TokenConfigError("'flows' of a LOOM_API_TOKENS entry is a list of flow-name patterns")
    read = raw.get("read", "all")
    if read not in ("all", "own"):
        raise TokenConfigError(f"'read' of a LOOM_API_TOKENS entry is 'all' or 'own', not {read!r}")
    name = raw.get("name", token_name(token))
    if not isinstance(name, str) or not name:
        raise TokenConfigError("'name' of a LOOM_API_TOKENS entry is a non-empty string")
    roles = raw.get("roles", [])
    if isinstance(roles, str) or not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise TokenConfigError("'roles' of a LOOM_API_TOKENS entry is a list of role names")
    return TokenEntry(token.encode(), Principal(name, tuple(flows), read == "all", tuple(roles)))


def token_entries() -> list[TokenEntry]:
    """LOOM_API_TOKENS, read (TokenConfigError on an entry that cannot be)."""
    raw = getattr(settings, "LOOM_API_TOKENS", [])
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = json.loads(text)
            except ValueError as exc:
                raise TokenConfigError(f"LOOM_API_TOKENS starts with '[' but is not a JSON array: {exc}") from None
        else:
            raw = conf.get("LOOM_API_TOKENS")  # comma-separated plain tokens
    if isinstance(raw, dict) or not isinstance(raw, (list, tuple)):
        raise TokenConfigError("LOOM_API_TOKENS is a list of tokens (strings or objects)")
    entries = [_entry(item) for item in raw]
    names = [entry.principal.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # "read": "own" matches executions by the starter's name: two tokens would share them
        raise TokenConfigError(f"LOOM_API_TOKENS names {twice} more than once; each token needs its own name")
    return entries


def authenticate(request) -> Principal:
    """The caller's principal; Unauthorized (401) if the request may not use the API."""
    if not conf.get("LOOM_API_AUTH"):
        return ANONYMOUS
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    offered = token.strip().encode()
    # compare_digest against every configured token (no early exit): the time taken does not
    # reveal how much of a token matched.
    found = None
    for entry in token_entries():
        if hmac.compare_digest(offered, entry.token) and found is None:
            found = entry.principal
    if found is None:
        raise Unauthorized("bearer token not accepted", headers=_CHALLENGE)
    return found


def require_flow(principal: Principal, flow: str) -> None:
    """404 unknown_flow unless the token may start or call `flow`: the very answer of a flow that is not
    registered (status, code and message), so that a token cannot tell a flow outside its scope, or an
    internal one, from a name nobody registered (no enumeration of flow names)."""
    if not principal.may_use(flow):
        raise UnknownFlowError(str(UnknownFlow(flow)))
