"""Which settings are secrets, and how a secret is shown: never in clear.

Used wherever settings leave the process in a readable form: the settings recorded with each benchmark
run (benchmarks/recording.py) and `manage.py loom_settings`. A name is secret when it looks like one
(token, secret, key, password, credential, or a URL/DSN that may carry a password), so a setting added
later is covered without anyone remembering to list it.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

# Whole words of the upper-case setting name: LOOM_API_TOKENS, SECRET_KEY, LOOM_Q_REDIS_URL, DB_PASSWORD...
SECRET_NAME = re.compile(
    r"(^|_)(TOKENS?|SECRETS?|KEYS?|PASSWORDS?|PASSWD|PASS|PWD|CREDENTIALS?|PRIVATE|SIGNATURE|SALT|AUTH_HEADER|"
    r"COOKIE|SESSION_ID|URL|URI|DSN|API_KEY|ACCESS_KEY)($|_)",
    re.IGNORECASE,
)


def is_secret(name: str) -> bool:
    """True when the setting's name says it may hold a secret (dashes count as underscores: `--api-token`)."""
    return bool(SECRET_NAME.search(name.strip("-").replace("-", "_")))


def redact(value: Any) -> Any:
    """A secret's value as it may be shown: empty stays empty (that is not a secret, and it says "unset"),
    anything else becomes REDACTED."""
    if value is None or value == "" or value == [] or value == ():
        return value
    return REDACTED


def shown(name: str, value: Any) -> Any:
    """The value of setting `name` as it may be printed or stored."""
    return redact(value) if is_secret(name) else value


def redact_tree(value: Any) -> Any:
    """A JSON-like value with the value under every secret-looking key redacted, at any depth."""
    if isinstance(value, dict):
        return {k: redact(v) if is_secret(str(k)) else redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v) for v in value]
    return value
