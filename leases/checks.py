"""System checks of the leases app (ids loom.E1xx / loom.W1xx)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register

from journal import conf
from leases.budget import planned_connections

# The Q_CLUSTER keys that name a django-q2 broker (django_q/conf.py); without one django-q2
# silently falls back to Redis on localhost, and `loom_worker` crashes where there is none.
BROKER_KEYS = ("orm", "redis", "django_redis", "sqs", "iron_mq", "mongo", "broker_class")
SNIPPET = 'Q_CLUSTER = {"name": "loom", "orm": "default", "timeout": 30, "retry": 40}'


@register()
def check_lease_settings(app_configs=None, **kwargs) -> list:
    problems = []
    ttl = conf.get_safe("LOOM_LEASE_TTL", None)
    grace = conf.get_safe("LOOM_LEASE_LAZY_GRACE", None)
    if ttl is not None and grace is not None and grace >= ttl:
        problems.append(Error(
            f"LOOM_LEASE_LAZY_GRACE ({grace}) is not shorter than LOOM_LEASE_TTL ({ttl})",
            hint="A lazy run must take its lease well within a TTL; leave the grace unset (TTL/3).",
            id="loom.E101"))
    return problems


def broker_problem() -> str | None:
    """Why django-q2 has no usable broker in these settings, or None (loom.E110/E111; also
    checked by `loom_worker` before it starts, in case checks are skipped)."""
    cluster = getattr(settings, "Q_CLUSTER", None)
    if not isinstance(cluster, dict):
        return "Q_CLUSTER is not set: django-q2 would fall back to Redis on localhost"
    named = [key for key in BROKER_KEYS if cluster.get(key)]
    if not named:
        return "Q_CLUSTER names no broker: django-q2 would fall back to Redis on localhost"
    alias = cluster.get("orm")
    if named == ["orm"] and alias not in settings.DATABASES:
        return f"Q_CLUSTER['orm'] is {alias!r}, which is not a database alias in DATABASES"
    return None


@register()
def check_broker(app_configs=None, **kwargs) -> list:
    """Queued starts (leases.tasks.enqueue_start) and loom_worker need a django-q2 broker; and a
    start taken by a worker that died is re-delivered only after Q_CLUSTER's `retry`."""
    problem = broker_problem()
    if problem is not None:
        return [Error(problem, hint=f"Use the database as the queue (no Redis needed): {SNIPPET} in your "
                                    "settings (or name another django-q2 broker).", id="loom.E110")]
    cluster = settings.Q_CLUSTER
    found = []
    retry, timeout = cluster.get("retry", 60), cluster.get("timeout")
    ttl = conf.get_safe("LOOM_LEASE_TTL", None)
    if ttl is not None and isinstance(retry, int | float) and retry > ttl + max(ttl, 10):
        found.append(Warning(
            f"Q_CLUSTER['retry'] ({retry} s) is longer than LOOM_LEASE_TTL ({ttl} s) plus max(TTL, 10 s): a queued "
            "start taken by a worker that died waits that long before another worker takes it",
            hint="Set retry to about LOOM_LEASE_TTL plus a few seconds (Loom's queued starts are idempotent, so "
                 "an early re-delivery is harmless), and timeout below retry for your own tasks.",
            id="loom.W112"))
    if isinstance(timeout, int | float) and isinstance(retry, int | float) and timeout >= retry:
        found.append(Warning(
            f"Q_CLUSTER['timeout'] ({timeout} s) is not shorter than its 'retry' ({retry} s): django-q2 re-delivers "
            "a task still running after retry, so a task may run twice",
            hint="Set timeout below retry (Loom's own tasks set no timeout and are safe to re-deliver).",
            id="loom.W113"))
    if cluster.get("redis") or cluster.get("django_redis"):
        found.append(Warning(
            "Q_CLUSTER uses Redis: django-q2 takes a task from Redis with BLPOP and never acknowledges it, so a "
            "queued start taken by a worker that dies before it begins is lost (at-most-once delivery; 'retry' "
            "does not apply)",
            hint="Use the ORM broker (Q_CLUSTER['orm']) for at-least-once queued starts; see docs/workers.md.",
            id="loom.W114"))
    attempts = cluster.get("max_attempts", 0)
    if isinstance(attempts, int) and attempts > 0:
        found.append(Warning(
            f"Q_CLUSTER['max_attempts'] is {attempts}: django-q2 acknowledges a task once it failed that often, so "
            "a queued start that failed before it began (a database restart, a worker without the flow) is lost",
            hint="Set max_attempts to 0 (no limit): a start that raised is delivered again after 'retry'.",
            id="loom.W115"))
    return found


MAX_CONNECTIONS = ("SELECT current_setting('max_connections')::int"
                   " - current_setting('superuser_reserved_connections')::int")


@register("database")
def check_connection_budget(app_configs=None, databases=None, **kwargs) -> list:
    """loom.W130: the planned workers (LOOM_PLANNED_*) would open more sessions than the server allows.

    A database check: Django runs it only when asked (`manage.py check --database default`, as `migrate` does),
    never at every start-up. It reads the server's limit with one statement that touches no table
    (current_setting: cheap, and safe on a primary or a replica), only when something is planned."""
    from django.db import connections

    problems = []
    planned = planned_connections()
    if planned is None:
        return problems
    for alias in databases or []:
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        with connection.cursor() as cursor:
            cursor.execute(MAX_CONNECTIONS)
            limit = cursor.fetchone()[0]
        if planned > limit:
            problems.append(Warning(
                f"the planned deployment opens up to {planned} sessions on database {alias!r}, which allows "
                f"{limit} (max_connections less superuser_reserved_connections)",
                hint="Fewer or smaller workers (LOOM_QUEUE_THREADS, LOOM_WAIT_BATCH, LOOM_RECOVERY_BATCH), a higher "
                     "max_connections, or a pool in front (docs/workers.md \"Connections\").",
                id="loom.W130"))
    return problems
