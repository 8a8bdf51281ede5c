"""The layout rules: one owner per table (issue 14); imports point down, through each app's face, and a
function-local import says why (issue 32, below).

Outside tests, migrations and docs, a table's name (so its SQL) appears only under the app that owns
it: `journal_*` under journal/, `leases_*` under leases/, `projections_*` under projections/. Another
app reaches those tables through the owner's store methods or its named hooks (docs/architecture.md,
"How the parts fit"). Admin URL names such as "admin:journal_execution_change" are not table names
(the word boundary stops at `_change`), and `reverse(...)` lines are skipped besides.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parent.parent
OWNERS = ("journal", "leases", "projections", "queues")


def _tables() -> dict[str, str]:
    """Every table of the owning apps' models, with the app its name says owns it."""
    tables = {}
    for label in OWNERS:
        for model in apps.get_app_config(label).get_models():
            owner = model._meta.db_table.split("_", 1)[0]
            if owner in OWNERS:
                tables[model._meta.db_table] = owner
    return tables


def _grep(pattern: str) -> list[str]:
    result = subprocess.run(
        ["git", "grep", "--untracked", "-nwE", pattern, "--", ".", ":!tests", ":!*/migrations/*", ":!docs", ":!*.md"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.stdout.splitlines()


def violations(lines: list[str], tables: dict[str, str]) -> list[str]:
    """The grep lines that name a table outside its owner's folder (reverse() URL lines excepted)."""
    found = []
    for line in lines:
        path, _, text = line.partition(":")
        if "reverse(" in text:
            continue
        for table in re.findall(r"\b(" + "|".join(map(re.escape, tables)) + r")\b", text):
            if not path.startswith(tables[table] + "/"):
                found.append(line)
                break
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_every_table_is_named_only_under_its_owning_app():
    """A statement on journal_*, leases_* or projections_* tables lives in that app (its store);
    others call the store. The grep of the issue's done-when check, kept true."""
    tables = _tables()
    assert {"journal_event", "journal_fence", "leases_lease", "projections_subscription"} <= set(tables)
    lines = _grep("|".join(map(re.escape, tables)))
    assert any(line.startswith("journal/store/") for line in lines), "the grep found nothing: is it broken?"
    assert violations(lines, tables) == []


def test_the_layout_check_catches_a_table_named_outside_its_app():
    """The rule itself: a bench's raw SQL on journal_event is a violation; the owner's SQL and an
    admin URL name are not."""
    tables = {"journal_event": "journal", "leases_lease": "leases"}
    lines = [
        'benchmarks/streams.py:14:        cursor.execute("SELECT count(*) FROM journal_event")',
        'journal/store/base.py:9:COUNT_EVENTS = "SELECT count(*) FROM journal_event"',
        'leases/admin.py:58:            url = reverse("admin:journal_event_change", args=[1])',
        'projections/store/postgres.py:3:    DELETE FROM leases_lease',
    ]
    assert violations(lines, tables) == [lines[0], lines[3]]


# --- The floor plan of issue 32: imports point down, through each app's face ---------------------------
#
# Floors (docs/architecture.md, "Apps and their faces"): an app imports only from the floors below it
# and never a sibling on its own floor. Each app's face is the tuple FACE_MODULES in its __init__.py:
# the modules users and sibling apps may import; every other module is its app's inside. An import
# inside a function hides the real graph, so a function-local import of a Loom module is in an
# AppConfig's ready(), or carries LOCAL_MARK (Django's app registry: a models module, or a module
# importing one, that cannot load before apps are ready; or an optional app looked up at call time), or
# is one of the legacy ones counted per file in LOCAL_LEFT, which may only shrink.

import ast  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

FLOORS = {"journal": 0, "leases": 1, "queues": 2, "projections": 2, "loomapi": 3, "benchmarks": 4}
LOOM = (*FLOORS, "loomsite")
LOCAL_MARK = "# app registry"

# (importing module, imported module): why the arrow stays for now. Each entry is a debt with a plan
# (docs/architecture.md, "What is left of the floor plan").
UPWARD_ALLOWED = {
    ("journal.tasks", "queues.tasks"): "the deprecated path of users' TASKS setting "
                                       "(journal.tasks.LoomBackend); the backend lives in queues/tasks.py",
    ("leases.schedules", "queues"): "a cron tick is a queued start; moves to journal.flows.start(queue=) "
                                    "once that path takes the tick's using= and meta",
    ("leases.schedules", "queues.declarations"): "the same (a schedule's queue must be declared)",
    ("leases.schedules", "queues.models"): "the same",
    ("leases.schedules", "queues.exceptions"): "the same (a refused start)",
    ("leases.schedule_ops", "queues"): "run-now and backfill are queued starts, as a cron tick is (the same plan)",
    ("leases.tasks", "queues"): "the old-scheme django-q2 start tasks route into queues.enqueue (deprecated "
                                "path, docs/queues.md); the queue backstop",
}

# Apps that may import the insides of the apps below them, and why.
SEES_INSIDES = {"benchmarks": "a bench measures the parts it times (the coalescer, a lease keeper, a drain), "
                              "as the tests do; no user imports through it"}

# (importing module, imported module): an import of another app's inside, and why it stays for now.
INSIDE_ALLOWED: dict[tuple[str, str], str] = {
    ("leases.tasks", "journal.privacy.marking"): "the old-scheme start tasks' forgotten-input check; goes with them",
    ("loomapi.views", "leases.tasks"): "the old-scheme start reservations (deprecated, docs/queues.md); go with them",
}

# The legacy function-local Loom imports without LOCAL_MARK, per file (at most; issue 32 counted 263 across
# apps, these count the same-app ones too). Lower a count when you remove one; mark an import whose reason is
# the app registry; a new file has none. Recorded with the test's own walk: see local_faults().
LOCAL_LEFT: dict[str, int] = {
    "benchmarks/faults/base.py": 3, "benchmarks/faults/checks.py": 1, "benchmarks/faults/children.py": 15,
    "benchmarks/faults/exit_on_cap_one.py": 2, "benchmarks/faults/fixtures.py": 1,
    "benchmarks/faults/kill_mid_step.py": 1, "benchmarks/sections/aggregates.py": 2,
    "benchmarks/sections/append.py": 4, "benchmarks/sections/coalesced.py": 1, "journal/admin.py": 18,
    "journal/admin_filters.py": 3, "journal/backends.py": 1, "journal/checks.py": 7, "journal/cli.py": 23,
    "journal/coalesce.py": 4, "journal/conf.py": 1, "journal/ids.py": 1, "journal/managers.py": 5,
    "journal/privacy/__init__.py": 1,
    "journal/privacy/forget.py": 4, "journal/shards.py": 4, "journal/store/postgres.py": 2,
    "journal/store/sqlite.py": 2, "leases/management/commands/loom_worker.py": 1,
    "leases/schedules.py": 2, "queues/__init__.py": 1, "queues/declarations.py": 1,
    "queues/service.py": 1, "queues/tasks.py": 2,
}

# Wave 14's other branches were written beside the rule (in parallel with it, not after it): their function-local
# imports, counted at the merge, per file. The same rule holds: a count may only shrink, and these are the first to
# pay (most are models imported at call time, which want LOCAL_MARK, or a store a module could import at its top).
LOCAL_LEFT.update({
    "benchmarks/async_waiters.py": 5, "benchmarks/command.py": 1, "benchmarks/faults/failover.py": 3,
    "journal/admin.py": 22, "journal/admin_base.py": 1, "journal/cli.py": 23, "journal/conf.py": 2,
    "journal/flows/aio.py": 15, "journal/retention.py": 4, "journal/telemetry.py": 8,
    "leases/drain.py": 1, "leases/management/commands/loom_worker.py": 1, "leases/schedule_ops.py": 1,
})


@dataclass(frozen=True, slots=True)
class Import:
    path: str  # the importing file, relative to the root
    line: int
    importer: str  # the importing module
    target: str  # the imported module
    local: bool  # inside a function
    marked: bool  # carries LOCAL_MARK

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_of(path: str, source: str, is_module=_is_module) -> list[Import]:
    """Every import of a Loom module in one file (relative imports resolved; `from pkg import mod` names
    the module mod)."""
    importer = _module_name(Path(path))
    package = importer if path.endswith("__init__.py") else importer.rpartition(".")[0]
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[Import] = []

    def visit(node: ast.AST, local: bool | str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = local or getattr(child, "name", "<lambda>")
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                subs = [f"{module}.{alias.name}" for alias in child.names if is_module(f"{module}.{alias.name}")]
                targets = subs if len(subs) == len(child.names) else [module, *subs]
            for target in targets:
                if target.split(".")[0] in LOOM:
                    near = lines[child.lineno - 2: child.end_lineno]
                    found.append(Import(path, child.lineno, importer, target, bool(local),
                                        local == "ready" or any(LOCAL_MARK in text for text in near)))
            visit(child, inner)

    visit(tree, False)
    return found


def faces() -> dict[str, frozenset[str]]:
    """Each app's face: its package and the modules of FACE_MODULES in its __init__.py."""
    return {app: frozenset((app, *getattr(importlib.import_module(app), "FACE_MODULES", ()))) for app in FLOORS}


def arrow_faults(found: list[Import], face: dict[str, frozenset[str]],
                 upward_allowed: dict | None = None, inside_allowed: dict | None = None) -> list[str]:
    """The imports that point up or sideways, or into another app's inside (allowlisted ones excepted)."""
    upward_allowed = UPWARD_ALLOWED if upward_allowed is None else upward_allowed
    inside_allowed = INSIDE_ALLOWED if inside_allowed is None else inside_allowed
    faults = []
    for one in found:
        source, target = one.importer.split(".")[0], one.target.split(".")[0]
        if source == target or source not in FLOORS:
            continue
        pair = (one.importer, one.target)
        if target == "loomsite" or FLOORS[target] >= FLOORS[source]:
            if pair not in upward_allowed:
                faults.append(f"{one.where}: points up or sideways ({source} imports only the floors below it)")
        elif one.target not in face[target] and pair not in inside_allowed and source not in SEES_INSIDES:
            faults.append(f"{one.where}: not in {target}'s face (FACE_MODULES in {target}/__init__.py)")
    return faults


def local_faults(found: list[Import], left: dict[str, int]) -> list[str]:
    """Files with more unmarked function-local Loom imports than LOCAL_LEFT allows them."""
    counts: dict[str, list[Import]] = {}
    for one in found:
        if one.local and not one.marked:
            counts.setdefault(one.path, []).append(one)
    return [f"{path}: {len(ones)} function-local Loom imports without '{LOCAL_MARK}' (at most {left.get(path, 0)}): "
            + ", ".join(f"line {one.line} {one.target}" for one in ones)
            for path, ones in sorted(counts.items()) if len(ones) > left.get(path, 0)]


@functools.cache
def _tree_imports() -> tuple[Import, ...]:
    """Every import of the apps' files, walked once per test session (the three checks share it)."""
    found = []
    for app in LOOM:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "migrations" in relative.parts:
                continue
            found += imports_of(str(relative), path.read_text(encoding="utf-8"))
    return tuple(found)


def test_imports_point_down_and_through_the_faces():
    """No app imports one on its own floor or above it, nor another app's inside (docs/architecture.md)."""
    found = _tree_imports()
    assert any(one.target == "journal.flows" for one in found), "the walk found no imports: is it broken?"
    assert arrow_faults(list(found), faces()) == []


def test_the_allowlists_hold_only_arrows_that_exist():
    """An allowlisted arrow that the code no longer draws goes from the list (the debt was paid)."""
    drawn = {(one.importer, one.target) for one in _tree_imports()}
    assert sorted(set(UPWARD_ALLOWED) - drawn) == []
    assert sorted(set(INSIDE_ALLOWED) - drawn) == []


def test_function_local_imports_carry_their_reason():
    """A Loom module imported inside a function says why (LOCAL_MARK), or is a counted legacy one."""
    assert local_faults(list(_tree_imports()), LOCAL_LEFT) == []


def test_every_face_module_exists():
    for app, modules in faces().items():
        assert [name for name in modules if not _is_module(name)] == [], app


def test_the_arrow_check_catches_upward_sideways_inside_and_local_imports():
    """The rules themselves, on made-up files: an upward import, a sideways one, an import of another
    app's inside and an unmarked local import are faults; a downward import of a face, an allowlisted
    arrow and a marked local import are not."""
    def parse(path, text):
        return imports_of(path, text, is_module=lambda name: name in {"journal.flows", "journal.store"})

    found = (parse("journal/flows/x.py", "from queues import enqueue\n")
             + parse("queues/x.py", "from projections.models import Subscription\n")
             + parse("leases/x.py", "from journal.flows.writer import header_status\n")
             + parse("leases/y.py", "from journal import flows\nfrom ..z import w\n")
             + parse("queues/y.py", "from leases import worker\n"))
    face = {"journal": frozenset({"journal", "journal.flows"}), "leases": frozenset({"leases"}),
            "queues": frozenset({"queues"}), "projections": frozenset({"projections"}),
            "loomapi": frozenset({"loomapi"}), "benchmarks": frozenset({"benchmarks"})}
    faults = arrow_faults(found, face, upward_allowed={("queues.y", "leases"): "made up"}, inside_allowed={})
    assert [fault.split(":")[0] for fault in faults] == ["journal/flows/x.py", "queues/x.py", "leases/x.py"]
    local = parse("queues/z.py", "def f():\n    from journal import flows\n\n"
                                 "def g():\n    from journal.models import Execution  # app registry\n\n"
                                 "def ready(self):\n    from journal import store\n")
    assert [(one.local, one.marked) for one in local] == [(True, False), (True, True), (True, True)]
    assert len(local_faults(local, {})) == 1 and local_faults(local, {"queues/z.py": 1}) == []


def names_in_strings(path: str, source: str, is_module=_is_module) -> list[Import]:
    """The Loom modules a file names in a string (not a docstring): an import by dotted path (import_module,
    import_string, a setting's default, a subprocess's `-m`) is an import the AST walk of imports does not see.
    A string counts when it names a module, or an attribute of a module below an app's package (`pkg.mod.Name`);
    `app.model` labels (`leases.schedule`) are not module paths."""
    importer = _module_name(Path(path))
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text) or text.split(".")[0] not in LOOM:
                continue
            parent = text.rpartition(".")[0]
            if is_module(text) or (parent.count(".") >= 1 and is_module(parent)):
                found.append(Import(path, node.lineno, importer, text if is_module(text) else parent, False, False))
    return found


def test_no_app_names_a_module_above_it_in_a_string():
    """The floors hold for imports by dotted path too: loomapi reaches nothing of benchmarks, even through
    import_module() or a setting's default (the last thing loomapi imported from benchmarks moved out, bench_http
    went to benchmarks/); the journal names no module of leases or queues, and so on up."""
    found = []
    for app in FLOORS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "migrations" not in relative.parts:
                found += names_in_strings(str(relative), path.read_text(encoding="utf-8"))
    assert any(one.target == "journal.shards" for one in found), "no dotted path found (the router's): broken?"
    upward = [one.where for one in found if one.importer.split(".")[0] != one.target.split(".")[0]
              and (one.target.split(".")[0] == "loomsite"
                   or FLOORS[one.target.split(".")[0]] >= FLOORS[one.importer.split(".")[0]])
              and (one.importer, one.target) not in UPWARD_ALLOWED]
    assert upward == []


def test_the_string_rule_catches_a_dotted_path_to_benchmarks_from_loomapi():
    """The rule itself, on made-up files: loomapi naming a benchmarks module in a string (or importing it) is
    a fault; a docstring naming it and a model label are not."""
    def is_module(name: str) -> bool:
        return name in {"benchmarks", "benchmarks.sections", "benchmarks.sections.http", "leases"}

    source = ('"""Measured by benchmarks.sections.http."""\nfrom importlib import import_module\n'
              'SECTION = import_module("benchmarks.sections.http")\nRUNNER = "benchmarks.sections.http.run"\n'
              'LABEL = "leases.schedule"\n')
    found = names_in_strings("loomapi/x.py", source, is_module=is_module)
    assert sorted((one.line, one.target) for one in found) == [(3, "benchmarks.sections.http"),
                                                         (4, "benchmarks.sections.http")]
    imported = imports_of("loomapi/y.py", "from benchmarks.sections import http\n", is_module=is_module)
    face = {app: frozenset({app}) for app in FLOORS}
    assert [fault.split(":")[0] for fault in arrow_faults(imported, face, {}, {})] == ["loomapi/y.py"]
