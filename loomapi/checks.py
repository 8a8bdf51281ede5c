"""System checks of the HTTP API (ids loom.E201..., loom.W201...: loomapi's range of the library's loom.*
namespace; they were loomapi.E001 and loomapi.W001-W005 until the ids were unified, and a project that silences
a former id still silences it until 0.3): an API nobody can call, or one anybody can.

Deploy checks (`manage.py check --deploy`), so that a development shell without tokens is not
nagged on every command; loom_serve_api refuses to start without tokens anyway.
"""

from __future__ import annotations

from django.core.checks import Error, Warning, register

from journal import conf
from journal.aggregates.declarations import states
from journal.checks import honouring_former_ids, renamed
from loomapi.auth import TokenConfigError, token_entries

renamed({"loom.E201": ("loomapi.E001",), **{f"loom.W20{n}": (f"loomapi.W00{n}",) for n in range(1, 6)}})


@register()
@honouring_former_ids
def check_api_tokens(app_configs=None, **kwargs) -> list:
    """LOOM_API_TOKENS must be readable: plain tokens, or scoped entries (docs/http-api.md)."""
    try:
        token_entries()
    except TokenConfigError as exc:
        return [Error(str(exc), hint="See docs/http-api.md, 'Tokens and scopes'.", id="loom.E201")]
    return []


@register(deploy=True)
@honouring_former_ids
def check_api_auth(app_configs=None, **kwargs) -> list:
    auth = conf.get_safe("LOOM_API_AUTH", True)
    try:
        tokens = [entry.token for entry in token_entries()]
    except TokenConfigError:
        return []  # loom.E201 says why
    if auth and not tokens:
        return [Warning("LOOM_API_AUTH is on but LOOM_API_TOKENS is empty: every API request is refused (401)",
                        hint="Set LOOM_API_TOKENS to one or more long random tokens.", id="loom.W201")]
    if not auth:
        return [Warning("LOOM_API_AUTH is off: the HTTP API accepts unauthenticated requests",
                        hint="Only for local benchmarks; never in production.", id="loom.W202")]
    short = [t for t in tokens if len(t.decode()) < 16]
    if short:
        return [Warning(f"{len(short)} LOOM_API_TOKENS entr{'y is' if len(short) == 1 else 'ies are'} "
                        "shorter than 16 characters", hint="Use long random tokens (secrets.token_urlsafe()).",
                        id="loom.W203")]
    return []


@register(deploy=True)
@honouring_former_ids
def check_aggregate_namespaces(app_configs=None, **kwargs) -> list:
    """The API refuses a start whose id is in a declared aggregate state's stream namespace
    (views.refuse_aggregate_namespace), which it can do only for states with a prefix that it imports.
    (Any stream that exists and is not an execution is refused as well, whatever declared it.)"""

    modules = tuple(conf.get_safe("LOOM_AGGREGATE_MODULES", []) or ())
    found = []
    for state in states().values():
        if not state.prefix:
            found.append(Warning(
                f"aggregate state {state.name} has an empty stream prefix: every execution id is also one of its "
                "stream ids, and the HTTP API cannot refuse a start that would take an aggregate's stream",
                hint="Give the state a prefix (the default is '<name>-').", id="loom.W204"))
        module = getattr(state.schema, "__module__", "")
        if not any(module == m or module.startswith(m + ".") for m in modules):
            found.append(Warning(
                f"aggregate state {state.name} (schema in {module}) is not under LOOM_AGGREGATE_MODULES: a "
                "loom_serve_api process that does not import it cannot refuse execution ids in its stream namespace",
                hint="List the module that declares it in LOOM_AGGREGATE_MODULES.", id="loom.W205"))
    return found
