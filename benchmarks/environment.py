"""What a recorded run must say about where it ran: commit, dirty flag, source hash, versions."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

import django
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
# The runtime whose speed the benchmarks measure; a change here changes the source hash.
RUNTIME_PACKAGES = ("journal", "leases", "projections", "loomapi")


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def source_hash() -> str:
    """SHA-256 over the runtime's Python and SQL sources (paths and contents), sorted."""
    digest = hashlib.sha256()
    for package in RUNTIME_PACKAGES:
        base = ROOT / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "migrations" in path.parts or "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def database_version(alias: str = "default") -> str:
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            return f"PostgreSQL {cursor.fetchone()[0]}"
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
            return f"SQLite {cursor.fetchone()[0]}"
    return connection.vendor


def describe(alias: str = "default") -> dict:
    """The environment fields of a BenchRun."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status),
        "source_hash": source_hash(),
        "db_vendor": connections[alias].vendor,
        "db_version": database_version(alias),
        "python_version": platform.python_version(),
        "django_version": django.get_version(),
        "cpu_count": os.cpu_count() or 0,
        "machine": f"{platform.node()} {platform.machine()} {platform.system()} {platform.release()}",
    }


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
