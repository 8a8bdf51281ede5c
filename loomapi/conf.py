"""The settings the HTTP API owns, registered with the journal's registry (journal/conf.py).

Imported by `LoomApiConfig.ready()`; read them with `conf.get(name)` from either module.
"""

from __future__ import annotations

from journal.conf import Setting, get, get_safe, register

__all__ = ["get", "get_safe"]

register(
    "loomapi",
    Setting("LOOM_API_TOKENS", list, [],
            "Bearer tokens accepted by the HTTP API: plain (full access) or scoped entries (docs/http-api.md)."),
    Setting("LOOM_API_AUTH", bool, True, "Require a token on the HTTP API (disable only for local benchmarks)."),
    Setting("LOOM_API_MAX_BODY_BYTES", int, 1_048_576, "Largest request body the HTTP API accepts.", 1),
    Setting("LOOM_API_EXAMPLES", bool, True, "Register loomapi's example flows (calc.add, calc.accumulate)."),
    Setting("LOOM_API_CALL_TIMEOUT", float, 30.0,
            "Seconds a transient API call may run before a 504 (its worker retires); unset: no bound.", 0.001,
            optional=True),
    Setting("LOOM_API_MAX_WAIT", float, 30.0, "Longest `wait=` (seconds) a durable start may ask for.", 0.0),
)
