"""A host project with only some of the Loom apps installed (STANDALONE_APPS, comma-separated; the journal
always): proves each app's admin and settings stand alone when another app is missing."""

import os

SECRET_KEY = "standalone-test-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "tests.standalone.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "journal",
    *[app for app in os.environ.get("STANDALONE_APPS", "").split(",") if app],
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
        "NAME": os.environ["STANDALONE_DB"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
Q_CLUSTER = {"name": "standalone", "orm": "default"}
