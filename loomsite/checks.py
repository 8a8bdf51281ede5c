"""System checks of the demo site (ids loomsite.*): keys that must never sign anything in production.

loomsite.E001 runs with every command, so `loom_worker`, `serve_api` and `migrate` refuse to start with
the key that shipped in the repository; loomsite.E002 is a deploy check (`check --deploy`), because the
generated per-checkout key is what `make bench` and `make test` use on purpose.
"""

from __future__ import annotations

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
