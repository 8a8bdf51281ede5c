"""A minimal Django project that is not loomsite: proves the apps are reusable on their own."""

import os

SECRET_KEY = "embedded-test-only"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "tests.embedded.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_q",
    "journal",
    "leases",
    "projections",
    "benchmarks",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["EMBEDDED_DB"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
Q_CLUSTER = {"name": "embedded", "orm": "default"}
LOOM_MAX_PAYLOAD_BYTES = 4096
