"""Issue #28, "docs that are not enough on their own": what a new user reads works as written."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from leases.management.commands.loom_worker import console_unless_configured

ROOT = Path(__file__).resolve().parents[2]


def test_the_worker_gives_its_logs_a_console_only_when_nothing_is_configured():
    loom, root = logging.Logger("loom-test"), logging.Logger("root-test")
    assert console_unless_configured(loom, root) is True  # a project without LOGGING: the INFO lines show
    assert [type(h) for h in loom.handlers] == [logging.StreamHandler]
    assert console_unless_configured(loom, root) is False  # never twice
    configured, rooted = logging.Logger("loom-test-2"), logging.Logger("root-test-2")
    rooted.addHandler(logging.NullHandler())
    assert console_unless_configured(configured, rooted) is False and configured.handlers == []


def test_the_readmes_make_api_line_runs_serve_api_with_the_dev_key_allowed():
    """README: `make api API_TOKEN=...` in a clone (a dry run: the recipe it would run)."""
    readme = (ROOT / "README.md").read_text()
    assert "make api API_TOKEN=" in readme
    dry = subprocess.run(["make", "-n", "api", "API_TOKEN=change-me-to-a-long-secret"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert 'LOOM_API_TOKENS="change-me-to-a-long-secret"' in dry.stdout and "serve_api --workers 2" in dry.stdout
    assert "export ALLOW_DEV_SECRET_KEY ?= true" in (ROOT / "Makefile").read_text()  # the clone's dev key


def test_the_docs_name_what_a_new_user_meets():
    cli = (ROOT / "docs" / "cli.md").read_text()
    assert "queued, running, waiting, suspended, stuck, completed, failed, cancelled" in cli
    assert "--search" in cli and "--until" in cli
    embedding = (ROOT / "docs" / "embedding.md").read_text()
    assert '"loom-django[tasks]"' in embedding and "LOGGING = {" in embedding and '"queues",' in embedding
    assert "`.env` file" in (ROOT / "README.md").read_text()
    assert "X-Loom-Wait" in (ROOT / "docs" / "http-api.md").read_text()
