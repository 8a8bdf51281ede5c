"""Child processes of the fault suite: how they are started, watched, signalled and read back.

Every child's stdout and stderr go to files in the round's directory (never pipes: a child that
writes more than a pipe holds while nobody reads would block), so what a killed child said before
it died is still there to compare with the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from benchmarks.children import database_url

ROOT = Path(__file__).resolve().parent.parent.parent
CHILD = "import django; django.setup()\nfrom benchmarks.faults.children import main\nmain()\n"

# Short timings, so that a round takes seconds: leases expire after 2 s, sweeps every 0.3 s,
# drains claim 5 events per stream (well below what producers write: the skip of a lagging
# consumer shows) and hold their claims 2 s.
CHILD_SETTINGS = {
    "LOOM_LEASE_TTL": "2.0", "LOOM_LEASE_RENEW_EVERY": "0.4", "LOOM_LEASE_LAZY_GRACE": "0.2",
    "LOOM_RECOVERY_EVERY": "0.3", "LOOM_LEASE_MODE": "lazy",
    "LOOM_DRAIN_LEASE_SECONDS": "2", "LOOM_DRAIN_POLL_MS": "100", "LOOM_DRAIN_BATCH": "5",
    "LOOM_DRAIN_STREAMS": "10", "LOOM_DRAIN_RETRY_DELAY": "0.1", "LOOM_CORRELATE_HORIZON_SECONDS": "0.5",
    "LOOM_FLOW_MODULES": "benchmarks.faults.fixtures",
    "LOOM_PROJECTION_MODULES": "benchmarks.faults.declarations",
    "LOOM_Q_WORKERS": "2", "PYTHONFAULTHANDLER": "1",
}
TTL = float(CHILD_SETTINGS["LOOM_LEASE_TTL"])


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: this process's database and settings module, the suite's timings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "FAULTS_"))}
    env.update(CHILD_SETTINGS)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE or os.environ["DJANGO_SETTINGS_MODULE"]
    env["PYTHONPATH"] = str(ROOT)
    env["SECRET_KEY"] = settings.SECRET_KEY  # the children verify the tasks this process signs (loomsite.E003)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Child:
    """One child process and the files its output goes to."""

    name: str
    proc: subprocess.Popen
    out: Path
    err: Path
    group: bool = False  # leads its own process group (loom_worker with its django-q2 cluster)
    killed: bool = field(default=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def lines(self) -> list[list[str]]:
        """What it said so far, split into words: whole lines only (a child still writing, or killed
        mid-write, can leave a last line without its newline, which is not read as said)."""
        text = self.out.read_text()
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        return [line.split() for line in text.splitlines() if line.strip()]

    def said(self, word: str) -> list[list[str]]:
        return [parts for parts in self.lines() if parts and parts[0] == word]

    def tail(self, chars: int = 2000) -> str:
        return self.err.read_text()[-chars:] if self.err.exists() else ""

    def kill(self) -> None:
        """SIGKILL the process (only it: its children, if any, are left to fend for themselves)."""
        self.killed = True
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def ready(self, timeout: float = 120) -> bool:
        """Wait for a loom_worker to say it runs (its signal handlers are in place from then on)."""
        return wait_until(lambda: " running " in self.out.read_text(), f"{self.name} to start", timeout, [self])

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM once it runs; it must stop by itself within `timeout` s (then SIGABRT: its stacks)."""
        self.ready()
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: the stacks go to its stderr
            self.proc.wait(30)
            raise AssertionError(f"{self.name} did not finish within {timeout:.0f} s:\n{self.tail()}") from None

    def ensure_dead(self) -> None:
        """Clean-up: SIGCONT (in case it is stopped) then SIGKILL it and, if it leads one, its group."""
        for sig in (signal.SIGCONT, signal.SIGKILL):
            if self.group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, sig)
            elif self.alive():
                self.proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


class Pool:
    """The children of one round: started into `folder`, all killed on exit whatever happened."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.children: list[Child] = []
        folder.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        for child in self.children:
            child.ensure_dead()

    def _popen(self, name: str, argv: list[str], env: dict[str, str], group: bool) -> Child:
        out, err = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=fo, stderr=fe, text=True,
                                    start_new_session=group)
        child = Child(name, proc, out, err, group)
        self.children.append(child)
        return child

    def role(self, name: str, role: str, args: dict, env: dict[str, str]) -> Child:
        """A child running one role of benchmarks/faults/children.py."""
        return self._popen(name, [sys.executable, "-c", CHILD, role, json.dumps(args)], env, False)

    def worker(self, name: str, worker_id: str, env: dict[str, str], cluster: bool = False) -> Child:
        """`manage.py loom_worker` (leases, recovery, drains; with django-q2's cluster if asked), in its
        own process group, so that whatever it leaves behind can be found and cleaned up."""
        argv = [sys.executable, "manage.py", "loom_worker", "--id", worker_id]
        if not cluster:
            argv.append("--no-cluster")
        return self._popen(name, argv, env, True)

    def path(self, name: str) -> Path:
        return self.folder / name


def wait_until(predicate: Callable[[], object], what: str, timeout: float, children: list[Child] = ()) -> bool:
    """Poll `predicate` until true or `timeout` s; a child that dies meanwhile with an error fails the
    round (a child expected to die is not passed in). Returns whether the predicate held."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        for child in children:
            code = child.proc.poll()
            if code not in (None, 0):
                raise AssertionError(f"{what}: {child.name} exited with {code}:\n{child.tail()}")
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (zombies excluded): what a killed leader left running."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            found.append(int(entry.name))
    return found
