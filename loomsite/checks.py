"""System checks of the demo site (ids loomsite.*): keys that must never sign anything in production.

loomsite.E001 runs with every command, so `loom_worker`, `serve_api` and `migrate` refuse to start with
the key that shipped in the repository; loomsite.E002 is a deploy check (`check --deploy`), because the
generated per-checkout key is what `make bench` and `make test` use on purpose.

loomsite.E003 refuses a generated key in the processes that share the broker or serve others
(`loom_worker`, `qcluster`, `serve_api`) when DEBUG is off, unless ALLOW_DEV_SECRET_KEY opts in. Such a
process started on another host or container without SECRET_KEY would generate a key of its own: every
task signed by the web process or the API fails its signature in that worker, and django-q2 deletes it
from the queue (its pusher answers BadSignature with `broker.fail`). The Makefile opts in, and processes
started by the tests and the bench are given the parent's key (SECRET_KEY in their environment).
"""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.checks import Error, register

from loomsite.secret_key import is_dev_key, is_public_key

HINT = ("Set SECRET_KEY in the environment to a long random value, the same in every web and worker process "
        "(docs/security.md).")


@register()
def check_public_secret_key(app_configs=None, **kwargs) -> list:
    if not settings.DEBUG and is_public_key(settings.SECRET_KEY):
        return [Error("SECRET_KEY is the development key published with Loom's source: anyone can forge "
                      "sessions and signed django-q2 tasks (code execution in loom_worker)", hint=HINT,
                      id="loomsite.E001")]
    return []


@register(deploy=True)
def check_generated_secret_key(app_configs=None, **kwargs) -> list:
    if not settings.DEBUG and is_dev_key(settings.SECRET_KEY):
        return [Error("SECRET_KEY is the generated development key of this checkout (var/secret_key), not "
                      "one managed for the deployment", hint=HINT, id="loomsite.E002")]
    return []


# The commands that exchange signed tasks through the broker, or serve requests to other machines. A system
# check is not told which command runs it, so the command line is read (`manage.py X` and `-m django X`).
SHARED_KEY_COMMANDS = frozenset({"loom_worker", "qcluster", "loom_serve_api", "serve_api"})  # serve_api: the old name


def running_command(argv: list[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    return argv[1] if len(argv) > 1 else ""


@register()
def check_generated_key_in_workers(app_configs=None, **kwargs) -> list:
    generated = getattr(settings, "SECRET_KEY_GENERATED", False)
    allowed = getattr(settings, "ALLOW_DEV_SECRET_KEY", False)
    if running_command() in SHARED_KEY_COMMANDS and not settings.DEBUG and generated and not allowed:
        return [Error(f"SECRET_KEY is not set in the environment: `{running_command()}` would sign and verify "
                      "django-q2 tasks with the development key generated for this checkout (var/secret_key). A "
                      "worker whose key differs from the process that queued a task deletes that task unrun",
                      hint="Set SECRET_KEY in the environment to the value every web, API and worker process uses "
                           "(docs/security.md). On a development machine, DEBUG=true or ALLOW_DEV_SECRET_KEY=true "
                           "(make worker sets it) uses the generated key.",
                      id="loomsite.E003")]
    return []
