"""Settings of the demo site: everything comes from the environment (django-environ).

Only this demo site reads environment variables; a project that embeds the apps sets the same
`LOOM_*` names in its own Django settings (docs/embedding.md). `DATABASE_URL` defaults to a SQLite
file in the project folder, the embedded default; `DATABASE_URL=postgres://127.0.0.1:5432/loom`
switches to PostgreSQL. The library's own settings (`LOOM_*`) are documented with their defaults in
`journal/conf.py`; the security settings and the SECRET_KEY rule in docs/security.md.
"""

import importlib.util
import math
from pathlib import Path

import environ

from loomsite import secret_key

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
# From the environment; a local site (DEBUG, or ALLOWED_HOSTS naming only this machine) falls back to a
# key generated into var/secret_key on first use. The rule and why: loomsite/secret_key.py.
SECRET_KEY = secret_key.choose(env.str("SECRET_KEY", default=""), BASE_DIR / "var" / "secret_key",
                               debug=DEBUG, allowed_hosts=ALLOWED_HOSTS)
# Whether that key was generated here rather than given. With DEBUG off, `loom_worker`, `qcluster` and
# `loom_serve_api` refuse a generated key (loomsite.E003) unless ALLOW_DEV_SECRET_KEY opts in (the Makefile
# does): a worker on another host would sign and verify tasks with a key of its own (loomsite/checks.py).
SECRET_KEY_GENERATED = not env.str("SECRET_KEY", default="")
ALLOW_DEV_SECRET_KEY = env.bool("ALLOW_DEV_SECRET_KEY", default=False)

# HTTPS behind a proxy, from the environment so that `check --deploy` can be made clean without editing
# this file (docs/security.md lists a production environment).
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = env.list("SECURE_REDIRECT_EXEMPT", default=[])
_proxy_ssl_header = env.list("SECURE_PROXY_SSL_HEADER", default=[])  # e.g. HTTP_X_FORWARDED_PROTO,https
SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header) if _proxy_ssl_header else None
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
# Sessions live in the browser's cookie, signed with SECRET_KEY, not in django_session: a database role that
# may only SELECT finds no live session key there to replay as the admin (docs/security.md, check loom.W040).
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=12 * 3600)  # a signed cookie is valid until it expires
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

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
    "queues",
    "projections",
    "benchmarks",
    "loomapi",
    "axes",
    "loomsite.apps.LoomsiteConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "loomsite.middleware.HostileQueryMiddleware",
    # Last, as django-axes asks: locks out a client after repeated failed admin logins.
    "axes.middleware.AxesMiddleware",
]

# Admin login throttling (django-axes): 5 failures for one username from one address lock that pair out
# for an hour; attempts are stored in the database (admin: Axes), so every web process sees them.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("AXES_COOLOFF_TIME", default=1.0)  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Axes keys on REMOTE_ADDR: behind a reverse proxy that is the proxy's address, so the lock-out is per
# username (docs/security.md says what that means and what to do at the proxy).

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


def _database(url: str | None = None) -> dict:
    """The default database from DATABASE_URL (or a shard's from its URL), with the options each backend needs."""
    if url is None:
        db = env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'loom.sqlite3'}")
    else:
        db = env.db_url_config(url)
    db.setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=0))
    db["CONN_HEALTH_CHECKS"] = True
    options = db.setdefault("OPTIONS", {})
    if db["ENGINE"] == "django.db.backends.postgresql":
        # Server-side binding: psycopg prepares the journal's fixed statements once per connection.
        options.setdefault("server_side_binding", env.bool("LOOM_PG_SERVER_SIDE_BINDING", default=True))
        # A server that drops packets (a shard behind a dead route) fails a connect in 10 s, not the kernel's
        # two minutes: a worker starting while a shard is unreachable starts, and retries it (docs/scaling.md).
        options.setdefault("connect_timeout", env.int("PG_CONNECT_TIMEOUT", default=10))
        # Django's own psycopg pool (Django >= 5.1; docs/workers.md "Connections"): PG_POOL="<max>" or "<min>:<max>"
        # sessions per process, shared by its threads (a thread waits up to PG_POOL_TIMEOUT s for one). A pool
        # hands sessions back itself: persistent connections (CONN_MAX_AGE) are off with it (Django refuses both).
        pool = env.str("PG_POOL", default="")
        if pool:
            low, _, high = pool.partition(":")
            options["pool"] = {"min_size": int(low) if high else 0, "max_size": int(high or low),
                               "timeout": env.float("PG_POOL_TIMEOUT", default=10.0)}
            db["CONN_MAX_AGE"] = 0
        # Behind PgBouncer in transaction pooling (POOLER_PORTS="6432:5432": pooler port -> server port): no
        # server-side cursors and no named prepared statements (Django's marker, read by journal.store.postgres
        # may_prepare), and LISTEN on the server itself (LOOM_DIRECT, projections/listener.py). docs/scaling.md.
        pooled = dict(p.split(":", 1) for p in env.list("POOLER_PORTS", default=[]) if ":" in p)
        direct = pooled.get(str(db.get("PORT")))
        if direct:
            db["DISABLE_SERVER_SIDE_CURSORS"] = True
            db["LOOM_DIRECT"] = {"HOST": db.get("HOST"), "PORT": int(direct)}
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
# Shards (docs/scaling.md): SHARD_DATABASE_URLS="shard1=postgres://...:5433/loom;shard2=..." adds database
# aliases; LOOM_SHARDS (e.g. "default,shard1") says which of them hold streams, in placement order.
for _entry in env.str("SHARD_DATABASE_URLS", default="").split(";"):
    if "=" in _entry:
        _alias, _url = _entry.split("=", 1)
        DATABASES[_alias.strip()] = _database(_url.strip())
# Sends the journal's, leases' and projections' queries to the shard of the stream at hand; without
# LOOM_SHARDS it has no opinion (everything on the default database).
DATABASE_ROUTERS = ["journal.shards.ShardRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
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
if env.bool("LOOM_LOG_JSON", default=False):  # JSON log lines with the spans' trace ids (docs/observability.md)
    LOGGING["formatters"] = {"json": {"()": "journal.telemetry.JsonFormatter"}}
    LOGGING["handlers"]["console"]["formatter"] = "json"

# django-q2: the ORM broker on the same database by default; Redis when LOOM_Q_REDIS_URL is set.
_redis_url = env.str("LOOM_Q_REDIS_URL", default="")
# Django's Tasks framework (django.tasks on Django 6, the django-tasks backport on 5.2): tasks are durable
# executions on Loom's queues, run by loom_worker (queues/tasks.py, docs/queues.md).
TASKS = {"default": {"BACKEND": "queues.tasks.LoomBackend", "QUEUES": ["default"]}}
if importlib.util.find_spec("django_tasks_db") is not None:
    # The reference database backend, the peer of `bench_queues` (optional extra; docs/queues.md).
    INSTALLED_APPS.append("django_tasks_db")
    TASKS["dbpeer"] = {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []}

Q_CLUSTER = {
    "name": "loom",
    "workers": env.int("LOOM_Q_WORKERS", default=2),
    # A queued start taken by a worker that died is re-delivered after `retry` seconds: about one
    # lease TTL (Loom's queued starts are idempotent: leases/tasks.py, check loom.W112). `timeout`
    # stays below retry for other tasks; Loom's own tasks set none (their leases bound them).
    "timeout": math.ceil(env.float("LOOM_LEASE_TTL", default=30.0)),
    "retry": math.ceil(env.float("LOOM_LEASE_TTL", default=30.0)) + 5,
    "max_attempts": 0,  # never acknowledge a failed task: a start that failed before it began is re-delivered
    "catch_up": False,
    "label": "Background tasks",
}
if _redis_url:
    Q_CLUSTER["redis"] = _redis_url
else:
    Q_CLUSTER["orm"] = "default"

# Loom settings: every LOOM_* variable in the environment becomes a setting of that name,
# typed by the defaults declared in journal/conf.py (see docs/configuration.md). Only this demo
# site does this: an embedding project writes LOOM_* settings in its own settings module.
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
