"""The pg_auto_failover formation of `scripts/ha-servers` (docs/scaling.md "High availability"), driven from
Python: which node is primary, and a failover the hard way, as the loss of the primary's machine: its
pg_autoctl keeper and then its postmaster SIGKILLed (a keeper left alive would restart PostgreSQL in place and
no failover would happen), the monitor promoting the synchronous standby, and the lost node started again to
rejoin as the new standby (pg_rewind), so that a second failover can follow.

Used by the fault suite's `failover` scenario and tests/leases/test_failover.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ha-servers"
DIR = Path(os.environ.get("HA_DIR", "/var/lib/postgresql/loom-ha"))
MONITOR_PORT = int(os.environ.get("HA_MONITOR_PORT", "5541"))
NODE_PORTS = tuple(int(p) for p in os.environ.get("HA_NODE_PORTS", "5542 5543").split())


def uri(dbname: str) -> str:
    """The client DSN of the formation: libpq multi-host, connecting to whichever node accepts writes."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in NODE_PORTS)
    return f"postgres://postgres@{hosts}/{dbname}?target_session_attrs=read-write"


def _monitor(sql: str) -> list[tuple]:
    with psycopg.connect(host="127.0.0.1", port=MONITOR_PORT, user="postgres", dbname="pg_auto_failover",
                         connect_timeout=3, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def states() -> dict[int, tuple[str, str]]:
    """Each node's port -> (reported state, goal state), as the monitor sees them."""
    return {port: (reported, goal) for port, reported, goal in _monitor(
        "SELECT nodeport, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeport")}


def problem() -> str | None:
    """Why the formation cannot be failed over here, or None (it is up: a primary and a secondary)."""
    if os.geteuid() != 0:
        return "must run as root to kill and restart the formation's nodes (scripts/ha-servers)"
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl is not installed (postgresql-15-auto-failover; scripts/ensure-packages)"
    try:
        now = states()
    except psycopg.Error as exc:
        return f"the HA formation's monitor on {MONITOR_PORT} is not running (scripts/ha-servers start): {exc}"
    deadline = time.monotonic() + 90  # a node still rejoining after a failover (pg_rewind, catching up)
    while sorted(s for s, _ in now.values()) != ["primary", "secondary"]:
        if time.monotonic() > deadline:
            return f"the HA formation is not a primary and a secondary (scripts/ha-servers status): {now}"
        time.sleep(0.5)
        now = states()
    return None


def primary_port() -> int:
    return next(port for port, (reported, _) in states().items() if reported == "primary")


def _node(port: int) -> str:
    return f"node{NODE_PORTS.index(port) + 1}"


def _wait(predicate, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except psycopg.Error:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"HA formation: timed out after {timeout:.0f} s waiting for {what}: {states()}")


@dataclass
class Failover:
    old: int  # the killed primary's port
    new: int  # the promoted standby's port
    promoted_seconds: float  # from the SIGKILL until the standby accepts writes
    killed_at: float  # time.monotonic() of the SIGKILL
    rejoined_seconds: float = 0.0  # from the restart of the old node until it is a secondary in sync again
    rejoin_started: float = 0.0


def _writable(port: int) -> bool:
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2,
                         autocommit=True) as conn:
        return conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()[0]


def kill_primary() -> Failover:
    """SIGKILL the primary's keeper and postmaster; return once the standby is promoted and accepts writes."""
    old = primary_port()
    new = next(p for p in NODE_PORTS if p != old)
    name = _node(old)
    # pg_autoctl's pid file: its supervisor on the first line, then "<pid> <service>" for each child it runs.
    lines = (Path("/tmp/pg_autoctl") / str(DIR).lstrip("/") / name / "pg_autoctl.pid").read_text().splitlines()
    keeper = [int(lines[0])] + [int(w[0]) for w in map(str.split, lines[1:])
                                if len(w) == 2 and w[0].isdigit() and not w[1][0].isdigit()]
    postmaster = int((DIR / name / "postmaster.pid").read_text().split()[0])
    t0 = time.monotonic()
    for pid in [*keeper, postmaster]:  # the keeper first: alive, it would restart PostgreSQL in place
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait(lambda: _writable(new), f"the standby on {new} to be promoted", 90)
    return Failover(old, new, round(time.monotonic() - t0, 2), t0)


def rejoin(failover: Failover, wait: bool = True) -> subprocess.Popen | None:
    """Start the lost node again (scripts/ha-servers start is idempotent) and, with `wait`, wait until it is the
    secondary; without, return the running script for `rejoined` (the load goes on meanwhile)."""
    failover.rejoin_started = time.monotonic()
    proc = subprocess.Popen([str(SCRIPT), "start"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    rejoined(failover, proc)
    return None


def rejoined(failover: Failover, proc: subprocess.Popen) -> None:
    """Wait for the lost node's restart (`rejoin(..., wait=False)`) until it is a secondary in sync again."""
    _, err = proc.communicate(timeout=240)
    if proc.returncode:
        raise RuntimeError(f"scripts/ha-servers start failed: {err.strip()[-500:]}")
    _wait(lambda: states().get(failover.old, ("", ""))[0] == "secondary"
          and states().get(failover.new, ("", ""))[0] == "primary", f"node {failover.old} to rejoin", 180)
    failover.rejoined_seconds = round(time.monotonic() - failover.rejoin_started, 2)
