"""The apps install into another Django project: migrate, check and append without loomsite; and a project
built from docs/embedding.md's snippets alone gets the worker, the admin pages and the API running."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMBEDDING_DOC = ROOT / "docs" / "embedding.md"
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


def _names_loomsite(source: str) -> bool:
    """True when code (not a docstring or comment) imports loomsite or names one of its modules."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "loomsite" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "loomsite":
            return True
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and "loomsite" in node.value):
            return True
    return False


def test_apps_do_not_import_loomsite():
    """Nothing in the reusable apps (the distribution) imports or names the demo site: it is not installed."""
    offenders = [
        str(path.relative_to(ROOT))
        for app in (*APPS, "loomapi")
        for path in (ROOT / app).rglob("*.py")
        if _names_loomsite(path.read_text())
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


# --- a new project that follows docs/embedding.md, and nothing else ------------------------------------------


def doc_block(heading: str) -> str:
    """The first ```python block under `heading` in docs/embedding.md: the test runs what the docs say."""
    text = EMBEDDING_DOC.read_text()
    section = text[text.index(f"\n{heading}\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under {heading!r}"
    return match.group(1)


def host_env() -> dict[str, str]:
    """The environment of a host project's shell: none of this repository's settings leak in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOOM_", "DJANGO_", "SECURE_", "AXES_"))
           and k not in {"DATABASE_URL", "PYTHONPATH", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except OSError:  # the server is not listening yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> str:
    """Stop a process this test started, with its children (its own session), and return its output."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.stdout.read() if proc.stdout else ""


ADMIN_SCRIPT = """
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
user = get_user_model().objects.create_superuser("ops", "ops@example.com", "a-long-passphrase-for-ops")
client = Client()
client.force_login(user)
index = client.get("/admin/")
assert index.status_code == 200, index.status_code
html = index.content.decode()
for app in ("journal", "leases", "projections", "benchmarks", "django_q"):
    assert f'href="/admin/{app}/"' in html, app
for url in ("/admin/journal/", "/admin/leases/", "/admin/projections/", "/bench/"):
    assert client.get(url).status_code == 200, url
assert "Loom schedules (flows on a cron)" in html  # ours, told apart from django-q2's "Scheduled tasks"
import sys
assert not any(m == "loomsite" or m.startswith("loomsite.") for m in sys.modules), "loomsite imported"
from django.conf import settings
print("TOKEN=" + settings.LOOM_API_TOKENS[0])
"""


def test_a_new_project_built_from_the_docs_runs_the_worker_admin_and_api(tmp_path):
    """startproject, append the settings snippet, write the urls snippet: migrate and check are clean,
    the admin index lists Loom's apps, serve_api answers, and loom_worker runs a durable start the API
    queued. No step beyond the docs, no environment from this repository."""
    env = host_env()
    # The apps of this checkout (the venv's editable install may point at another worktree of the repository)
    env["PYTHONPATH"] = str(ROOT)
    subprocess.run([sys.executable, "-m", "django", "startproject", "hostsite", str(tmp_path)], env=env,
                   check=True, capture_output=True, timeout=60)
    settings_py = tmp_path / "hostsite" / "settings.py"
    settings_py.write_text(settings_py.read_text() + "\n" + doc_block("## settings.py"))
    (tmp_path / "hostsite" / "urls.py").write_text(doc_block("## urls.py"))
    (tmp_path / "jobs.py").write_text(doc_block("## jobs.py"))  # next to manage.py, as the page says

    def manage(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=timeout)

    migrate = manage("migrate", "--noinput")
    assert migrate.returncode == 0, migrate.stderr
    check = manage("check")
    assert check.returncode == 0, check.stderr
    assert "System check identified no issues" in check.stdout, check.stdout + check.stderr
    admin = manage("shell", "-c", ADMIN_SCRIPT)
    assert admin.returncode == 0, admin.stderr
    token = admin.stdout.split("TOKEN=")[1].strip()

    port = free_port()
    base = f"http://127.0.0.1:{port}/api"
    popen = {"cwd": tmp_path, "env": env, "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True,
             "start_new_session": True}
    api = subprocess.Popen([sys.executable, "manage.py", "loom_serve_api", "--bind", f"127.0.0.1:{port}",
                            "--workers", "1"], **popen)
    worker = subprocess.Popen([sys.executable, "manage.py", "loom_worker"], **popen)
    try:
        wait_for(lambda: http("GET", f"{base}/health")[0] == 200, 60, "serve_api to answer /api/health")
        status, body = http("POST", f"{base}/flows/calc.add/call", token, {"input": {"a": 2, "b": 3}})
        assert (status, body.get("result")) == (200, 5), body
        status, body = http("POST", f"{base}/flows/calc.add/executions", token,
                            {"input": {"a": 20, "b": 22}, "execution_id": "embedded-start-1"})
        assert status in (200, 201, 202), body
        done = wait_for(lambda: (lambda r: r[1] if r[0] == 200 and r[1].get("status") == "completed" else None)(
            http("GET", f"{base}/executions/embedded-start-1", token)), 90, "the worker to run the queued start")
        assert done["result"] == 42
        assert http("GET", f"{base}/executions/embedded-start-1")[0] == 401  # no token, no answer
        # The docs' own flow (jobs.py), started through the API and listed by it
        status, body = http("POST", f"{base}/flows/jobs.greet/executions", token,
                            {"input": {"name": "ann"}, "execution_id": "embedded-greet"})
        assert status in (200, 201, 202), body
        greeted = wait_for(lambda: (lambda r: r[1] if r[1].get("status") == "completed" else None)(
            http("GET", f"{base}/executions/embedded-greet", token)), 90, "the worker to run jobs.greet")
        assert greeted["result"] == {"text": "hello ann"}
        status, listed = http("GET", f"{base}/executions?flow=jobs.greet", token)
        assert status == 200 and [r["execution_id"] for r in listed["executions"]] == ["embedded-greet"]
        # A Django @task (jobs.add), enqueued from the project's shell, run by the worker
        enqueued = manage("shell", "-c", "from jobs import add; print('ID=' + add.enqueue(2, 3).id)")
        assert enqueued.returncode == 0, enqueued.stderr
        task_id = enqueued.stdout.split("ID=")[1].strip()

        def task_done():
            shown = manage("loom", "executions", "show", task_id, "--json")
            view = json.loads(shown.stdout) if shown.returncode == 0 else {}
            return view if view.get("status") == "completed" else None

        assert wait_for(task_done, 90, "the worker to run the task")["result"] == 5
        # The schedule of jobs.py, written to the table by the worker at its start
        schedules = wait_for(lambda: (lambda out: out if "nightly-greeting" in out else None)(
            manage("loom", "schedules", "--json").stdout), 60, "the worker to write the code schedule")
        assert any(row["name"] == "nightly-greeting" and row["flow"] == "jobs.greet"
                   for row in json.loads(schedules))
        refused = urllib.request.Request(f"{base}/health", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError) as bad_host:  # (startproject's DEBUG shows Django's page)
            urllib.request.urlopen(refused, timeout=10)
        assert bad_host.value.code == 400
    finally:
        api_out, worker_out = stop(api), stop(worker)
    assert api.returncode is not None and worker.returncode is not None, (api_out, worker_out)
    # The worker's documented INFO lines show (docs/embedding.md's LOGGING; docs/workers.md "Logs")
    assert "queue dispatcher of" in worker_out and "over database(s) default" in worker_out, worker_out
    assert "start execution=embedded-greet flow=jobs.greet" in worker_out or "execution=embedded-greet" in worker_out, \
        worker_out


@pytest.mark.parametrize("heading", ["## settings.py", "## urls.py"])
def test_the_embedding_snippets_name_nothing_from_the_demo_site(heading):
    """The docs' snippets stand alone: no loomsite, no environment variables."""
    block = doc_block(heading)
    assert "loomsite" not in block
    assert "os.environ" not in block and "import environ" not in block


def test_the_distribution_leaves_the_demo_site_and_its_extras_out():
    """`pip install loom-django` brings the apps and what they import: not loomsite, its environment loader
    and login throttling, the debug toolbar or the Redis client (extras); the metadata has a license and a
    readme; build output is ignored by git."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = project["project"]
    required = {re.split(r"[<>=\[; ]", dep, maxsplit=1)[0].lower() for dep in meta["dependencies"]}
    assert required.isdisjoint({"redis", "django-debug-toolbar", "django-environ", "django-axes"}), required
    assert {"redis", "site", "dev", "test"} <= set(meta["optional-dependencies"])
    # make venv installs .[test]: it must bring the site, Redis client and toolbar the suite uses.
    itself = [dep for dep in meta["optional-dependencies"]["test"] if dep.startswith("loom-django[")]
    assert itself and {"site", "redis", "dev"} <= set(itself[0].split("[")[1].rstrip("]").split(","))
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(p.startswith("loomsite") for p in packages)
    assert {f"{app}*" for app in (*APPS, "loomapi")} <= set(packages)
    assert meta["license"] and meta["readme"] == "README.md" and (ROOT / "LICENSE").exists()
    assert "/build/" in (ROOT / ".gitignore").read_text().split()
