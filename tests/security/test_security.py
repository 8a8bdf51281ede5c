"""Safe to deploy (issue 12): secrets never leave the process in clear, result pages are staff-only by
default, the demo site's SECRET_KEY rule and its checks, security settings from the environment, and
hostile query strings answered with 400.

Checks and commands run in real child processes with the environment a deployment would give them.
"""

from __future__ import annotations

import io
import os
import secrets
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from benchmarks.models import BenchRun
from benchmarks.recording import RECORDED_SETTINGS, REDACTED, Recorder, redacted_command_line, scrub_settings
from journal import conf
from journal.redaction import is_secret
from loomsite import secret_key

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-" + "s3cret" * 6
PUBLISHED_KEY = "loom-insecure-development-key-change-me-in-production-0123456789"


def record(options: dict | None = None) -> BenchRun:
    with Recorder("bench_throughput", options or {"ops": 5}) as rec:
        rec.add("append", "per-event", {"concurrency": 1}, throughput=10.0, unit="events/s", p50_ms=1.0, count=5)
    return rec.run


@pytest.fixture
def staff(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("staff", is_staff=True))
    return client


# --- secrets in recorded runs and in loom_settings ------------------------------------------------------


@pytest.mark.django_db
def test_a_recorded_run_holds_no_api_token_and_its_pages_show_none(staff, settings):
    """LOOM_API_TOKENS, a secret-looking option and the command line are redacted in the stored run, in the
    run's JSON export and on its page; tuning settings stay in clear."""
    settings.LOOM_API_TOKENS = [TOKEN]
    settings.LOOM_LEASE_TTL = 12.5
    run = record({"ops": 5, "api_token": TOKEN, "client": {"password": TOKEN, "retries": 2}})
    run.refresh_from_db()
    assert run.settings["loom"]["LOOM_API_TOKENS"] == REDACTED
    assert run.settings["loom"]["LOOM_LEASE_TTL"] == 12.5
    assert run.settings["options"] == {"ops": 5, "api_token": REDACTED, "client": {"password": REDACTED, "retries": 2}}
    assert TOKEN not in str(run.settings)
    for name in ("benchmarks:run_json", "benchmarks:run_detail", "benchmarks:run_csv"):
        response = staff.get(reverse(name, args=[run.pk]))
        assert response.status_code == 200
        assert TOKEN not in response.content.decode()


@pytest.mark.django_db
def test_a_setting_not_on_the_allow_list_is_recorded_redacted(settings, monkeypatch):
    """A LOOM_* setting added later is not recorded in clear until someone puts it on the allow-list."""
    monkeypatch.setitem(conf.SETTINGS, "LOOM_SOMETHING_NEW", conf.Setting("LOOM_SOMETHING_NEW", str, "", "test"))
    settings.LOOM_SOMETHING_NEW = "private-value"
    run = record()
    assert run.settings["loom"]["LOOM_SOMETHING_NEW"] == REDACTED


def test_the_allow_list_holds_no_secret_looking_name():
    assert [name for name in RECORDED_SETTINGS if is_secret(name)] == []
    assert is_secret("LOOM_API_TOKENS") and is_secret("SECRET_KEY") and is_secret("LOOM_Q_REDIS_URL")
    assert not is_secret("LOOM_API_AUTH") and not is_secret("LOOM_DRAIN_LEASE_SECONDS")


def test_secret_options_are_redacted_from_the_command_line():
    assert (redacted_command_line("manage.py bench_http --token abc --ops 5 --api-key=xyz --password= --quiet")
            == f"manage.py bench_http --token {REDACTED} --ops 5 --api-key={REDACTED} --password={REDACTED} --quiet")


@pytest.mark.django_db
def test_runs_recorded_before_the_allow_list_are_scrubbed_by_pages_and_migration(staff):
    """Old runs stored tokens in clear: the pages redact them on the way out and migration 0002 rewrites them."""
    run = record()
    leaked = {"options": {"ops": 5}, "loom": {"LOOM_API_TOKENS": [TOKEN], "LOOM_LEASE_TTL": 30.0}}
    BenchRun.objects.filter(pk=run.pk).update(settings=leaked, argv=f"manage.py bench_http --token {TOKEN}")
    assert TOKEN not in staff.get(reverse("benchmarks:run_json", args=[run.pk])).content.decode()
    assert TOKEN not in staff.get(reverse("benchmarks:run_detail", args=[run.pk])).content.decode()

    migration = __import__("benchmarks.migrations.0002_redact_recorded_secrets", fromlist=["redact_runs"])
    migration.redact_runs(apps, SimpleNamespace(connection=connection))
    run.refresh_from_db()
    assert run.settings == scrub_settings(leaked)
    assert run.settings["loom"] == {"LOOM_API_TOKENS": REDACTED, "LOOM_LEASE_TTL": 30.0}
    assert TOKEN not in run.argv


def test_loom_settings_does_not_print_secrets(settings):
    """`manage.py loom_settings` shows that tokens are set, never what they are."""
    settings.LOOM_API_TOKENS = [TOKEN]
    out = io.StringIO()
    call_command("loom_settings", stdout=out)
    text = out.getvalue()
    assert TOKEN not in text
    assert f"LOOM_API_TOKENS = {REDACTED!r}" in text
    assert "LOOM_LEASE_MODE = 'lazy'" in text


# --- result pages: staff only by default -----------------------------------------------------------------


@pytest.mark.django_db
def test_result_pages_are_staff_only_by_default(client, settings, django_user_model):
    """Without LOOM_RESULTS_PUBLIC, anonymous users are sent to the login page, staff see the pages."""
    if hasattr(settings, "LOOM_RESULTS_PUBLIC"):
        del settings.LOOM_RESULTS_PUBLIC
    run = record()
    response = client.get(reverse("benchmarks:run_json", args=[run.pk]))
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    client.force_login(django_user_model.objects.create_user("staff2", is_staff=True))
    assert client.get(reverse("benchmarks:run_json", args=[run.pk])).status_code == 200


# --- hostile query strings ----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["vendor=%00", "command=%00", "command=a%00b"])
def test_a_nul_in_a_result_filter_is_a_400(staff, query):
    """PostgreSQL refuses NUL in text; the list answers 400 instead of a 500 (on SQLite too)."""
    response = staff.get(f"{reverse('benchmarks:run_list')}?{query}")
    assert response.status_code == 400


@pytest.mark.django_db
@pytest.mark.parametrize("query", [
    "command=%00",                                              # NUL in a list filter
    "q=%00",                                                    # NUL in the search box
    "started_at__year=9999",                                    # the date hierarchy asks for year 10000
    "started_at__year=9999&started_at__month=12",
    "started_at__year=99999999999",                             # beyond a C int
])
def test_hostile_admin_list_filters_are_a_400(admin_client, query):
    """The site's middleware turns NUL and overflowing filters on any admin list into a 400, not a 500."""
    record()
    response = admin_client.get(f"{reverse('admin:benchmarks_benchrun_changelist')}?{query}")
    assert response.status_code == 400


@pytest.mark.django_db
def test_a_nul_in_an_api_query_string_is_a_json_400(client):
    response = client.get("/api/health?x=%00")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


# --- the SECRET_KEY rule ------------------------------------------------------------------------------------


def test_a_local_site_without_secret_key_uses_one_generated_private_key(tmp_path):
    """First use writes a random key (mode 0600); every later process, and racing ones, read the same key."""
    key_file = tmp_path / "var" / "secret_key"
    keys: list[str] = []
    threads = [threading.Thread(target=lambda: keys.append(secret_key.dev_key(key_file))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and secret_key.is_dev_key(keys[0]) and len(keys[0]) > 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["secret_key"]  # no temporary left
    assert secret_key.choose("", key_file, debug=False, allowed_hosts=["localhost", "127.0.0.1"]) == keys[0]
    assert secret_key.choose("from-env", key_file, debug=False, allowed_hosts=["loom.example.com"]) == "from-env"
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY is not set"):
        secret_key.choose("", key_file, debug=False, allowed_hosts=["loom.example.com"])


def test_the_test_suite_runs_on_a_generated_key_not_the_published_one():
    assert django_settings.SECRET_KEY != PUBLISHED_KEY
    assert os.environ.get("SECRET_KEY") or secret_key.is_dev_key(django_settings.SECRET_KEY)


@pytest.fixture
def site_env(tmp_path):
    """The environment of a fresh loomsite process, nothing from the caller's site: checks only, so a
    throw-away SQLite file (the test database may be locked by the test's own transaction)."""

    def make(**values: str) -> dict[str, str]:
        return _site_env(f"sqlite:///{tmp_path / 'site.sqlite3'}", **values)

    return make


def _site_env(url: str, **values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOOM_", "SECURE_", "AXES_")) and k not in {
               "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
               "CSRF_TRUSTED_ORIGINS"}}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="loomsite.settings", PYTHONPATH=str(ROOT))
    env.update(values)
    return env


def manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_public_site_without_secret_key_refuses_to_start(site_env):
    proc = manage("check", env=site_env(ALLOWED_HOSTS="loom.example.com"))
    assert proc.returncode != 0
    assert "SECRET_KEY is not set in the environment" in proc.stderr


def test_the_published_key_stops_every_command_the_worker_included(site_env):
    """loomsite.E001 is an ordinary check: `loom_worker` refuses to start with the key from the repository."""
    proc = manage("loom_worker", env=site_env(SECRET_KEY=PUBLISHED_KEY), timeout=120)
    assert proc.returncode != 0
    assert "loomsite.E001" in proc.stderr


def test_check_deploy_refuses_the_generated_key(site_env):
    proc = manage("check", "--deploy", env=site_env())
    assert proc.returncode != 0
    assert "loomsite.E002" in proc.stderr


PRODUCTION = {
    "DEBUG": "false",
    "ALLOWED_HOSTS": "loom.example.com",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "CSRF_TRUSTED_ORIGINS": "https://loom.example.com",
}


def test_check_deploy_is_clean_with_the_documented_production_environment(site_env):
    """Everything docs/security.md lists comes from the environment: `check --deploy` passes with no issue."""
    doc = (ROOT / "docs" / "security.md").read_text()
    assert all(f"{name}=" in doc for name in PRODUCTION), "docs/security.md lists the production environment"
    env = site_env(**PRODUCTION, SECRET_KEY=secrets.token_urlsafe(50), LOOM_API_TOKENS=secrets.token_urlsafe(32))
    proc = manage("check", "--deploy", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "System check identified no issues" in proc.stdout, proc.stdout + proc.stderr


def test_https_settings_come_from_the_environment(site_env):
    env = site_env(**PRODUCTION, SECRET_KEY=secrets.token_urlsafe(50))
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.SECURE_PROXY_SSL_HEADER, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_TRUSTED_ORIGINS)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["('HTTP_X_FORWARDED_PROTO',", "'https')", "31536000", "True",
                                   "['https://loom.example.com']"], proc.stderr


# --- logins and passwords ----------------------------------------------------------------------------------------


def test_weak_passwords_are_refused():
    for weak in ("password123", "12345678901234", "short"):
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password(secrets.token_urlsafe(16))


@pytest.mark.django_db
def test_repeated_failed_admin_logins_lock_the_client_out(client, django_user_model):
    """django-axes: after AXES_FAILURE_LIMIT failures even the right password is refused for that client."""
    django_user_model.objects.create_user("ann", password="a-Long-enough-passphrase", is_staff=True)
    url = reverse("admin:login")
    statuses = [client.post(url, {"username": "ann", "password": "wrong"}).status_code
                for _ in range(django_settings.AXES_FAILURE_LIMIT)]
    assert statuses == [200] * (django_settings.AXES_FAILURE_LIMIT - 1) + [429]
    response = client.post(url, {"username": "ann", "password": "a-Long-enough-passphrase"})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
