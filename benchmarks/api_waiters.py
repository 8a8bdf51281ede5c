"""Waiting API callers under the two servers: `loom_serve_api` (gunicorn, loomapi's buffering gthread worker) and
gunicorn's ASGI worker (`-k asgi` on `django.core.asgi:get_asgi_application()`: Django's ASGI handler in front of
the same views, for this project's settings; a site's own asgi.py such as loomsite/asgi.py does the same).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/loom_w15c_bench python manage.py shell \
        -c "from benchmarks.api_waiters import main; main(40, repeats=2)"

N callers, each on its own connection, read one flow event with `GET /api/executions/<id>/events/ready?timeout=20`
(the event read's wait: the same per-process slots as a start's `?wait=`, loomapi/views.py `waiter`); once all
were sent and the server had 3 s to take them, a message wakes the flow, which publishes the wall-clock time just
before its set_event commits. Reported per server: callers, how many the server made wait (the others were answered
at once, `X-Loom-Wait: not waited`), its one worker process's threads (/proc/<pid>/task) and the server's database
sessions (pg_stat_activity, less this process's) when idle (after one warm request) and at most while they waited, and
the wake-up p50/p99 of those that waited (from the publish to the whole response read). One worker process each;
`--threads` of the gthread server as given. The servers run in turn, `repeats` times, interleaved.
docs/http-api.md "ASGI or gunicorn's gthread worker" records a run and the decision taken from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.db import connection

from benchmarks.async_waiters import FLOW, _release
from journal.flows import start

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server(kind: str, port: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "LOOM_API_AUTH": "false", "LOOM_FLOW_MODULES": "benchmarks.async_waiters",
           "ALLOW_DEV_SECRET_KEY": "true"}  # DJANGO_SETTINGS_MODULE: this project's, inherited
    if kind == "gthread":
        command = [sys.executable, "manage.py", "loom_serve_api", "--workers", "1", "--threads", str(threads),
                   "--bind", f"127.0.0.1:{port}", "--skip-checks"]
    else:
        command = [sys.executable, "-m", "gunicorn", "-k", "asgi", "-w", "1", "-b", f"127.0.0.1:{port}",
                   "--worker-connections", "4000", "--timeout", "60",
                   "django.core.asgi:get_asgi_application()"]  # Django's ASGI handler for the inherited settings
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def _get(port: int, path: str) -> tuple[dict[str, str], bytes, float]:
    """One request on its own connection (closed after): its headers, body and when it was read whole."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    at = time.time()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _unchunk(body)
    return headers, body, at


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out, body = out + rest[:n], rest[n + 2:]
    return out


def _ready(port: int, proc: subprocess.Popen) -> int:
    """Until the server answers /api/health: its worker's pid (X-Loom-Worker)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read().decode()[-2000:]}")
        with contextlib.suppress(OSError):
            headers, _, _ = asyncio.run(_get(port, "/api/health"))
            if "x-loom-worker" in headers:
                return int(headers["x-loom-worker"])
        time.sleep(0.2)
    raise RuntimeError("the server did not answer /api/health within 60 s")


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _watch(pid: int, peak: dict, stop: threading.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            peak["threads"] = max(peak["threads"], _threads(pid))
        peak["sessions"] = max(peak["sessions"], _sessions() - peak["before"])
        stop.wait(0.05)
    connection.close()


def run(kind: str, callers: int, threads: int) -> dict:
    port = _free_port()
    before = _sessions()  # this database's sessions before the server started (this process's own)
    proc = _server(kind, port, threads)
    try:
        pid = _ready(port, proc)
        eid = start(FLOW, {}).execution_id
        asyncio.run(_get(port, f"/api/executions/{eid}/events/ready"))  # a warm request: the worker's sessions
        time.sleep(0.5)
        base = {"threads": _threads(pid), "sessions": _sessions() - before}
        peak, stop = {**base, "before": before}, threading.Event()
        watcher = threading.Thread(target=_watch, args=(pid, peak, stop), daemon=True)
        watcher.start()

        async def scenario() -> list:
            path = f"/api/executions/{eid}/events/ready?timeout=20"
            tasks = [asyncio.ensure_future(_get(port, path)) for _ in range(callers)]
            await asyncio.sleep(3.0)  # every request sent and taken (or answered at once)
            await asyncio.get_running_loop().run_in_executor(None, _release, eid)
            return await asyncio.gather(*tasks)

        answers = asyncio.run(scenario())
        stop.set()
        watcher.join()
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        if proc.poll() is None:
            proc.kill()
    wakes, not_waited, failed = [], 0, 0
    for headers, body, at in answers:
        try:
            answer = json.loads(body)
        except ValueError:
            failed += 1
            continue
        if "x-loom-wait" in headers:
            not_waited += 1
        elif answer.get("set"):
            wakes.append(at - answer["value"])
        else:
            failed += 1
    wakes.sort()
    row = {"server": kind if kind == "asgi" else f"gthread --threads {threads}", "callers": callers,
           "waited": len(wakes), "not_waited": not_waited, "failed": failed,
           "threads_idle": base["threads"], "threads_peak": peak["threads"],
           "sessions_idle": base["sessions"], "sessions_peak": peak["sessions"],
           "p50_ms": round(statistics.median(wakes) * 1000, 1) if wakes else None,
           "p99_ms": round(wakes[max(0, int(len(wakes) * 0.99) - 1)] * 1000, 1) if wakes else None}
    print(row, flush=True)
    return row


def slow_clients(kind: str, stalled: int = 20, threads: int = 8, after: float = 15.0) -> dict:
    """The slow-client protection, as a fact per server: `stalled` connections send half a request head and
    stall; then a normal request is timed, and after `after` seconds each stalled connection is checked: closed
    by the server (with a 408 or without a word) or still open, holding its slot."""
    port = _free_port()
    proc = _server(kind, port, threads)
    socks = []
    try:
        pid = _ready(port, proc)
        idle = _threads(pid)
        for _ in range(stalled):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(sock)
        time.sleep(1.0)
        began = time.monotonic()
        asyncio.run(_get(port, "/api/health"))
        answered_ms = round((time.monotonic() - began) * 1000, 1)
        held = _threads(pid)
        time.sleep(after)
        closed = timed_out = 0
        for sock in socks:
            sock.settimeout(0.5)
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue  # still open, nothing said
            except OSError:
                data = b""
            closed += 1
            timed_out += data.startswith(b"HTTP/1.1 408")
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        if proc.poll() is None:
            proc.kill()
    row = {"server": kind if kind == "asgi" else f"gthread --threads {threads}", "stalled": stalled,
           "health_answered_ms": answered_ms, "threads_idle": idle, "threads_with_stalled": held,
           f"closed_after_{after:g}s": closed, "answered_408": timed_out}
    print(row, flush=True)
    return row


def main(callers: int = 40, threads: int = 8, repeats: int = 2, stalled: int = 20) -> list[dict]:
    if connection.vendor != "postgresql":
        raise SystemExit("benchmarks.api_waiters needs PostgreSQL (its sessions are counted in pg_stat_activity)")
    rows = []
    for _ in range(repeats):
        for kind in ("gthread", "asgi"):
            rows.append(run(kind, callers, threads))
    for kind in ("gthread", "asgi"):
        rows.append(slow_clients(kind, stalled, threads))
    return rows
