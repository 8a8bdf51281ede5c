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
# The runtime whose speed the benchmarks measure, and the benchmarks that measure it: a change to
# either changes what a figure means, so either changes the source hash.
MEASURED_PACKAGES = ("journal", "leases", "projections", "loomapi", "benchmarks")
SOURCE_SUFFIXES = (".py", ".sql")


def _git(*args: str, root: Path = ROOT) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def source_hash(root: Path = ROOT) -> str:
    """SHA-256 over the Python and SQL sources (paths and contents, sorted) of the runtime and of the
    benchmarks themselves: two runs with the same hash ran the same measuring and measured code."""
    digest = hashlib.sha256()
    for package in MEASURED_PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
            if "migrations" in path.parts or "__pycache__" in path.parts:
                continue
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def git_dirty(root: Path = ROOT) -> bool:
    """Whether the checkout differs from its commit: modified, staged, deleted or untracked files (a new,
    not yet added module changes what runs as much as an edit does). Ignored files do not count."""
    return bool(_git("status", "--porcelain", "--untracked-files=normal", root=root))


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
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": git_dirty(),
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
