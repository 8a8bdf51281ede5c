"""The apps install into another Django project: migrate, check and append without loomsite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("journal", "leases", "projections", "benchmarks")

EMBEDDED_SCRIPT = """
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
assert "loomsite" not in settings.ROOT_URLCONF
call_command("migrate", verbosity=0)
call_command("check", fail_level="ERROR")
from journal.envelopes import Envelope
from journal.models import Event
token, _ = Event.objects.open_stream("embedded-1", Envelope("Started", {"ok": True}))
Event.objects.append("embedded-1", Envelope("Done"), fence_token=token)
assert [e.type for e in Event.objects.read("embedded-1")] == ["Started", "Done"]
import sys
assert not any(name == "loomsite" or name.startswith("loomsite.") for name in sys.modules), "loomsite imported"
print("embedded-ok")
"""


def test_apps_do_not_import_loomsite():
    """Nothing in the reusable apps names the hosting project."""
    offenders = [
        str(path.relative_to(ROOT))
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if "loomsite" in path.read_text()
    ]
    assert offenders == []


def test_apps_migrate_and_work_in_a_minimal_project(tmp_path):
    """A second settings module (tests/embedded) migrates, passes checks and appends."""
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env.update({"DJANGO_SETTINGS_MODULE": "tests.embedded.settings", "EMBEDDED_DB": str(tmp_path / "e.sqlite3"),
                "PYTHONPATH": str(ROOT)})
    proc = subprocess.run([sys.executable, "-c", EMBEDDED_SCRIPT], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "embedded-ok" in proc.stdout
