"""Django's own Tasks backend tests (tests/tasks/ of the Django release in use) against LoomBackend.

The files are not in the wheels and are never committed: scripts/conformance-sources fetches the sdist from PyPI
into var/conformance/ (this module runs it when they are missing, and skips naming the script if that fails).
They are copied into var/conformance/adapted/ with these changes only, all about how results are awaited:
the backends they name become tests/fixtures/conformance_backend.py's (ImmediateBackend -> AwaitingLoomBackend,
which runs the task as a worker does before answering; DummyBackend -> QueuedLoomBackend), SimpleTestCase
becomes TestCase (a durable backend reads and writes the database), and `from . import tasks` names the copied
package. On Django 5.2 the tests/tasks/ of Django 6.0 (the release the django-tasks backport follows) run
against the backport's names (django_tasks, InvalidTaskError, InvalidTaskBackendError).

Cases that cannot hold for a durable backend are expected failures, each with its reason, listed in
docs/queues.md ("Conformance"); an expected failure that starts passing fails the run.
django-tasks-db's worker cases are not run from its sdist: see docs/queues.md for why and where their
behaviour is tested instead.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

import django
import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "var" / "conformance"
try:
    import django.tasks

    BACKPORT, SOURCE, TAG = False, CACHE / f"django-{django.get_version()}" / "tasks", "dj" + django.get_version()
except ImportError:
    BACKPORT, SOURCE, TAG = True, CACHE / "django-for-backport" / "tasks", "backport"
PACKAGE = "tasks"  # the package name of Django's tests (test_module_path asserts "tasks.tasks.noop_task")
FILES = ("tasks.py", "test_tasks.py", "test_immediate_backend.py", "test_dummy_backend.py")

SYNC_IN_ASYNC = ("calls a synchronous method that reads the database (get_result, refresh, Dummy's results) inside "
                 "an async test: a database backend cannot answer there (SynchronousOnlyOperation, as for "
                 "django-tasks-db); async code calls aget_result/arefresh, which these cases also check")
# Cases that do not apply to a durable backend (the reasons are in docs/queues.md, "Conformance").
NOT_APPLICABLE = {
    "TaskTestCase.test_using_correct_backend": "asserts the class is DummyBackend",
    "ImmediateBackendTestCase.test_using_correct_backend": "asserts the class is ImmediateBackend and OPTIONS {}",
    "DummyBackendTestCase.test_using_correct_backend": "asserts the class is DummyBackend",
    "ImmediateBackendTestCase.test_cannot_pass_run_after": "LoomBackend supports run_after (Immediate cannot)",
    "ImmediateBackendTestCase.test_cannot_get_result": "LoomBackend supports get_result (Immediate cannot)",
    "ImmediateBackendTestCase.test_cannot_refresh_result": "LoomBackend supports refresh (Immediate cannot)",
    "ImmediateBackendTestCase.test_throws_keyboard_interrupt":
        "Immediate re-raises KeyboardInterrupt in the caller; a worker records it as a failed attempt "
        "(django-tasks-db's db_worker does the same)",
    "TaskTestCase.test_get_backend": "asserts the class is DummyBackend",
    "TaskTestCase.test_enqueue_task_async": SYNC_IN_ASYNC,
    "TaskTestCase.test_get_missing_result": SYNC_IN_ASYNC,
    "TaskTestCase.test_refresh_result": SYNC_IN_ASYNC,
    "DummyBackendTestCase.test_enqueue_task_async": SYNC_IN_ASYNC,
    "DummyBackendTestCase.test_get_missing_result": SYNC_IN_ASYNC,
    "DummyBackendTestCase.test_clear": "Dummy's in-memory list; LoomBackend's results are rows",
    "DummyBackendTestCase.test_refresh_result": "mutates Dummy's in-memory result; a durable result is a row",
    "DummyBackendTestCase.test_refresh_result_async": "mutates Dummy's in-memory result; a durable result is a row",
}

if BACKPORT:  # the backport's own wording differs from the Django release whose tests these are
    NOT_APPLICABLE["DummyBackendTestCase.test_validate_disallowed_async_task"] = (
        "the django-tasks backport words it 'async tasks' (Django 6: 'async Tasks'); the refusal itself holds")


def _sources() -> Path | None:
    if not SOURCE.is_dir():
        subprocess.run([str(ROOT / "scripts" / "conformance-sources"), sys.executable], check=False, timeout=600,
                       capture_output=True)
    return SOURCE if SOURCE.is_dir() else None


def _adapt(text: str) -> str:
    text = text.replace("django.tasks.backends.immediate.ImmediateBackend",
                        "tests.fixtures.conformance_backend.AwaitingLoomBackend")
    text = text.replace("django.tasks.backends.dummy.DummyBackend",
                        "tests.fixtures.conformance_backend.QueuedLoomBackend")
    text = re.sub(r"\bSimpleTestCase\b", "TestCase", text)
    text = re.sub(r"\n    available_apps = \[\]\n", "\n", text)  # the tests' databases need Loom's apps
    if BACKPORT:
        text = text.replace("django.tasks", "django_tasks").replace("django.utils.json", "django_tasks.utils")
        text = re.sub(r"\bInvalidTaskBackend\b", "InvalidTaskBackendError", text)
        text = re.sub(r"\bInvalidTask\b", "InvalidTaskError", text)
    return text


def _expected_failure(method, reason: str):
    """The case as an expected failure (an async case run as Django runs it: async_to_sync)."""
    from asgiref.sync import async_to_sync

    if inspect.iscoroutinefunction(method):
        def case(self):
            async_to_sync(method)(self)
    else:
        def case(self):
            method(self)
    case.__doc__ = f"not applicable to a durable backend: {reason}"
    return unittest.expectedFailure(case)


def _load() -> list[type]:
    source = _sources()
    if source is None:
        pytest.skip(f"Django's tests/tasks/ not in {SOURCE}: run scripts/conformance-sources {sys.executable}",
                    allow_module_level=True)
    target = CACHE / "adapted" / TAG / PACKAGE
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / "__init__.py").write_text("")
    for name in FILES:
        if (source / name).exists():
            (target / name).write_text(_adapt((source / name).read_text()))
    if str(target.parent) not in sys.path:
        sys.path.insert(0, str(target.parent))
    classes = []
    for name in FILES[1:]:
        if not (target / name).exists():
            continue
        module = importlib.import_module(f"{PACKAGE}.{name[:-3]}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, unittest.TestCase) and value.__module__ == module.__name__:
                for case, reason in NOT_APPLICABLE.items():
                    owner, method = case.split(".")
                    if owner == value.__name__ and hasattr(value, method):
                        setattr(value, method, _expected_failure(getattr(value, method), reason))
                classes.append(value)
    return classes


for _case in _load():
    globals()[f"{_case.__module__.rsplit('.', 1)[-1]}__{_case.__name__}"] = _case
del _case
