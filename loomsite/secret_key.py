"""Where the demo site's SECRET_KEY comes from, and which keys must never sign anything in production.

The rule (docs/security.md):

- `SECRET_KEY` in the environment always wins.
- Without it, loomsite uses a development key generated on first use into `var/secret_key` (mode 0600,
  git-ignored, random per checkout), but only while the site is local: DEBUG is on, or ALLOWED_HOSTS
  names nothing but this machine (the default). That keeps `make bench` and `make test` working on a
  fresh clone with no setup. A site that answers a real host name without `SECRET_KEY` refuses to start.
- `manage.py check --deploy` refuses a generated key when DEBUG is off (loomsite.E002), and every
  command (the worker included) refuses the key loomsite used to ship in clear (loomsite.E001).
- `loom_worker`, `qcluster` and `loom_serve_api` refuse a generated key when DEBUG is off, unless
  ALLOW_DEV_SECRET_KEY opts in (loomsite.E003): a worker with a key of its own deletes the tasks it
  cannot verify.

Why it matters beyond sessions: django-q2 signs its pickled task payloads with SECRET_KEY, so whoever
knows the key and can write to the broker can run code in `loom_worker`.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

# Every generated key starts with this, so a check can recognise one wherever it ends up. Django's own
# deploy check (security.W009) also flags the "django-insecure-" prefix.
DEV_KEY_PREFIX = "django-insecure-loom-dev-"
# Keys that were published with the source: whoever reads the repository can sign with them.
PUBLIC_KEYS = frozenset({"loom-insecure-development-key-change-me-in-production-0123456789"})
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1", "testserver"})


def is_dev_key(key: str) -> bool:
    return key.startswith(DEV_KEY_PREFIX)


def is_public_key(key: str) -> bool:
    return key in PUBLIC_KEYS


def is_local(allowed_hosts: list[str]) -> bool:
    """True when ALLOWED_HOSTS names only this machine (nothing reachable under a public name)."""
    return all(host in LOCAL_HOSTS for host in allowed_hosts)


def choose(from_env: str, key_file: Path, *, debug: bool, allowed_hosts: list[str]) -> str:
    """The SECRET_KEY to use: the environment's, else the generated development key when the site is local."""
    if from_env:
        return from_env
    if not (debug or is_local(allowed_hosts)):
        raise ImproperlyConfigured(
            "SECRET_KEY is not set in the environment and ALLOWED_HOSTS names a public host with DEBUG off. "
            "loomsite reads settings from environment variables: set SECRET_KEY to a long random value "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))'), the same in every web and worker "
            "process. The generated development key is only used by a local site (see docs/security.md)."
        )
    return dev_key(key_file)


def dev_key(key_file: Path) -> str:
    """Read the generated development key, creating it on first use.

    Processes started together (the test suite's children, a worker and the bench) may race to create
    it: the key is written to a private temporary file and linked into place, which fails if another
    process won, so every process ends up reading the same complete key.
    """
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        pass
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=key_file.parent, prefix=f".{key_file.name}.")  # mode 0600
    tmp = Path(name)
    with os.fdopen(fd, "w") as handle:
        handle.write(DEV_KEY_PREFIX + secrets.token_urlsafe(48) + "\n")
    try:
        os.link(tmp, key_file)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return key_file.read_text().strip()
