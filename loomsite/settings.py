"""Settings for the Loom project: everything comes from the environment (django-environ).

`DATABASE_URL` defaults to a SQLite file in the project folder, the embedded default;
`DATABASE_URL=postgres://127.0.0.1:5432/loom` switches to PostgreSQL. The library's own
settings (`LOOM_*`) are documented with their defaults in `journal/conf.py`.
"""

import math
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="loom-insecure-development-key-change-me-in-production-0123456789")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "journal",
    "leases",
    "projections",
    "benchmarks",
    "loomapi",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "loomsite.urls"
WSGI_APPLICATION = "loomsite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database() -> dict:
    """The default database from DATABASE_URL, with the options each backend needs."""
    db = env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'loom.sqlite3'}")
    db.setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=0))
    db["CONN_HEALTH_CHECKS"] = True
    options = db.setdefault("OPTIONS", {})
    if db["ENGINE"] == "django.db.backends.postgresql":
        # Server-side binding: psycopg prepares the journal's fixed statements once per connection.
        options.setdefault("server_side_binding", env.bool("LOOM_PG_SERVER_SIDE_BINDING", default=True))
    if db["ENGINE"] == "django.db.backends.sqlite3":
        # IMMEDIATE: every transaction takes the write lock at BEGIN, so the journal's
        # check-then-insert runs under the lock (no upgrade deadlocks, no lost guard).
        options.setdefault("transaction_mode", "IMMEDIATE")
        options.setdefault("timeout", 30)
        # WAL lets readers run beside the single writer.
        options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
        name = Path(db["NAME"])
        name.parent.mkdir(parents=True, exist_ok=True)
        # A file (not :memory:) so that threads and child processes of the tests share it.
        db.setdefault("TEST", {}).setdefault("NAME", str(name.with_name(f"test_{name.name}")))
    return db


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
}

# django-q2: the ORM broker on the same database by default; Redis when LOOM_Q_REDIS_URL is set.
_redis_url = env.str("LOOM_Q_REDIS_URL", default="")
Q_CLUSTER = {
    "name": "loom",
    "workers": env.int("LOOM_Q_WORKERS", default=2),
    # A queued start taken by a worker that died is re-delivered after `retry` seconds: about one
    # lease TTL (Loom's queued starts are idempotent: leases/tasks.py, check loom.W112). `timeout`
    # stays below retry for other tasks; Loom's own tasks set none (their leases bound them).
    "timeout": math.ceil(env.float("LOOM_LEASE_TTL", default=30.0)),
    "retry": math.ceil(env.float("LOOM_LEASE_TTL", default=30.0)) + 5,
    "max_attempts": 1,
    "catch_up": False,
    "label": "Background tasks",
}
if _redis_url:
    Q_CLUSTER["redis"] = _redis_url
else:
    Q_CLUSTER["orm"] = "default"

# Loom settings: every LOOM_* variable in the environment becomes a setting of that name,
# typed by the defaults declared in journal/conf.py (see docs/configuration.md).
for _key, _value in env.ENVIRON.items():
    if _key.startswith("LOOM_") and not _key.startswith("LOOM_Q_"):
        globals()[_key] = _value

if DEBUG:
    try:
        import debug_toolbar  # noqa: F401
    except ImportError:  # pragma: no cover - optional in production installs
        pass
    else:
        INSTALLED_APPS.append("debug_toolbar")
        MIDDLEWARE.insert(0, "debug_toolbar.middleware.DebugToolbarMiddleware")
        INTERNAL_IPS = ["127.0.0.1"]
        DEBUG_TOOLBAR_CONFIG = {"IS_RUNNING_TESTS": False}
