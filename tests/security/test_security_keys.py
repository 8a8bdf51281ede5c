"""A worker or API process never runs on a SECRET_KEY it generated for itself (issue 12, loomsite.E003).

django-q2 signs each queued task with SECRET_KEY; a worker whose key differs fails the signature and
deletes the task from the queue. With DEBUG off, `loom_worker`, `qcluster` and `serve_api` refuse the key
generated into var/secret_key unless ALLOW_DEV_SECRET_KEY opts in (the Makefile does); processes the tests
and the bench start are given their parent's key. Checked in real processes with a deployment's environment.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings as django_settings

from loomsite.checks import check_generated_key_in_workers
from tests.security.test_security import ROOT, _site_env, manage


@pytest.fixture
def site_env(tmp_path):
    def make(**values: str) -> dict[str, str]:
        env = _site_env(f"sqlite:///{tmp_path / 'site.sqlite3'}", **values)
        env.pop("ALLOW_DEV_SECRET_KEY", None)  # `make test` exports it; a production host has none
        env.update(values)
        return env

    return make


@pytest.mark.parametrize("command", [["loom_worker", "--id", "prod-worker"], ["qcluster"],
                                     ["serve_api", "--bind", "127.0.0.1:1", "--workers", "1"]])
def test_a_worker_or_api_without_secret_key_refuses_to_start(site_env, command):
    """No SECRET_KEY, DEBUG off, the default local ALLOWED_HOSTS (a worker serves no HTTP): the process exits
    at its system checks with loomsite.E003, saying what to set, instead of running on a key of its own."""
    proc = manage(*command, env=site_env(), timeout=120)
    assert proc.returncode != 0
    assert "loomsite.E003" in proc.stderr and "Set SECRET_KEY in the environment" in proc.stderr, proc.stderr


CHECKS = ("import sys; sys.argv = ['manage.py', {command!r}]; import django; django.setup(); "
          "from django.core.checks import run_checks; print(sorted(e.id for e in run_checks() if e.id))")


@pytest.mark.parametrize(("command", "values", "refused"), [
    ("loom_worker", {}, True),
    ("serve_api", {}, True),
    ("loom_serve_api", {}, True),                                  # the API's name (serve_api is its old one)
    ("loom_worker", {"ALLOW_DEV_SECRET_KEY": "true"}, False),      # the Makefile's opt-in
    ("loom_worker", {"DEBUG": "true"}, False),                     # a development machine
    ("loom_worker", {"SECRET_KEY": "a-key-given-" + "x" * 40}, False),  # the key every process is given
    ("migrate", {}, False),                                        # one-shot commands keep the generated key
    ("bench_throughput", {}, False),
])
def test_which_processes_refuse_the_generated_key(site_env, command, values, refused):
    """The rule read from a real environment: only a shared-key process, DEBUG off, key generated, no opt-in."""
    code = CHECKS.format(command=command)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=site_env(**values), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ("loomsite.E003" in proc.stdout) is refused, proc.stdout


def test_the_check_reads_the_running_command(settings, monkeypatch):
    settings.DEBUG = False
    settings.SECRET_KEY_GENERATED = True
    settings.ALLOW_DEV_SECRET_KEY = False
    monkeypatch.setattr(sys, "argv", [str(ROOT / "manage.py"), "qcluster"])
    assert [e.id for e in check_generated_key_in_workers()] == ["loomsite.E003"]
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/site-packages/django/__main__.py", "serve_api", "--bind", "x"])
    assert [e.id for e in check_generated_key_in_workers()] == ["loomsite.E003"]
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert check_generated_key_in_workers() == []


def test_children_of_the_tests_are_given_the_suites_key(child_env):
    """Workers a test spawns verify what the test signs: same key, given explicitly, so E003 accepts it."""
    assert child_env["SECRET_KEY"] == django_settings.SECRET_KEY


def test_make_opts_in_for_the_processes_it_starts():
    """`make test`, `make bench`, `make worker` and `make serve` work on a fresh clone with no setup; an
    explicit ALLOW_DEV_SECRET_KEY=false from the caller wins."""
    show = ["make", "-s", "--no-print-directory", "--eval", 'show-opt-in: ; @echo "$$ALLOW_DEV_SECRET_KEY"',
            "show-opt-in"]
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_DEV_SECRET_KEY"}
    assert subprocess.run(show, cwd=ROOT, env=env, capture_output=True, text=True).stdout.strip() == "true"
    env["ALLOW_DEV_SECRET_KEY"] = "false"
    assert subprocess.run(show, cwd=ROOT, env=env, capture_output=True, text=True).stdout.strip() == "false"


def test_a_given_key_is_never_marked_generated(site_env):
    key = secrets.token_urlsafe(50)
    code = "import django; django.setup(); from django.conf import settings as s; print(s.SECRET_KEY_GENERATED)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=site_env(SECRET_KEY=key), capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
