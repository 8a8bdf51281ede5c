"""Finding a server's worker processes by pid (Linux /proc), for the orphan test and bench_http."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from loomapi.gunicorn_conf import set_parent_death_signal


def children(pid: int) -> set[int]:
    """Pids whose parent is `pid` (read from /proc/<pid>/stat)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 is the ppid; the command name (field 2) may hold spaces, so split after its ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Poll until none of `pids` is alive or `timeout` seconds passed; the pids still alive."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    return left


def kill_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def free_port() -> int:
    """A loopback port nobody listens on right now (the server binds it a moment later)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_server(workers: int, port: int, env: dict[str, str], *extra: str):
    """Start `loom_serve_api` in a child process; it gets SIGTERM if we die (no server outlives its caller)."""
    import signal
    import subprocess
    import sys
    import tempfile

    # The server's log goes to a file, not a pipe: an unread pipe would fill and block the server.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (outlives this call: the server owns it)
    command = [sys.executable, "-m", "django", "loom_serve_api", "--bind", f"127.0.0.1:{port}",
               "--workers", str(workers), *extra]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM))
    server.log = log
    return server


def server_log(server) -> str:
    server.log.seek(0)
    return server.log.read()


def wait_ready(server, port: int, path: str, workers: int, timeout: float = 60.0) -> set[int]:
    """Poll until `path` answers 200 and `workers` worker processes exist; their pids."""
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"serve_api exited with {server.returncode}:\n{server_log(server)}")
        pids = children(server.pid)
        if len(pids) >= workers:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    conn.close()
                    return pids
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"serve_api on port {port} not ready with {workers} workers after {timeout:.0f} s")
