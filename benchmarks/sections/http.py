"""The `http` section of bench_http: the real server on loopback, every response validated.

Cells: mode (fresh calls of calc.add; calls of calc.accumulate carrying caller-owned state) x
concurrency (clients, each on its own keep-alive connection) x a fixed number of requests.

- Warm-up: `--warmup` sequential fresh calls on one connection before the first cell; excluded
  from every figure (recorded as `warmup_excluded`).
- Cold starts: the first request each worker process serves after the warm-up is kept in the
  data; `cold_requests` counts them per cell (X-Loom-Worker names the worker).
- Validation: every response's arithmetic is checked (a + b; the accumulator's total and call
  count against the state the client carried). A wrong answer or any error fails the run after
  every cell has been recorded. Transient calls write nothing: the journal's row count is verified.
- Client: http.client (stdlib) with one persistent HTTP/1.1 connection per client thread; it is
  the thinnest well-kept client (no pool or async machinery to measure), and reconnects on its own
  if the server closes a connection. The clients share the machine's CPUs with the server.
- Shutdown is the abrupt-parent check: the server's parent is SIGKILLed and every worker must be
  gone within a bounded wait (recorded as the `abrupt-parent-cleanup` row).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import secrets
import signal
import threading
import time

from django.conf import settings
from django.urls import reverse

from benchmarks.arguments import non_negative_int, positive_int
from benchmarks.children import child_env
from benchmarks.recording import VerificationError
from journal.models import Event
from loomapi.process import children, free_port, kill_all, server_log, spawn_server, wait_gone, wait_ready

SECTION_MODES = ("fresh", "state")


def add_arguments(parser) -> None:
    parser.add_argument("--requests", type=positive_int, default=300, help="Requests per cell (default %(default)s).")
    parser.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 4, 8],
                        help="Client counts (default 1 4 8).")
    parser.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                        help="Server worker processes (default: CPU count, %(default)s).")
    parser.add_argument("--worker-class", choices=("gthread", "sync"), default="gthread",
                        help="serve_api --worker-class (default %(default)s).")
    parser.add_argument("--warmup", type=non_negative_int, default=20,
                        help="Sequential warm-up calls, excluded (default 20).")
    parser.add_argument("--mode", dest="modes", action="append", choices=SECTION_MODES,
                        help="fresh and/or state (default both).")


class Client:
    """One client: a keep-alive connection and, in state mode, the state it owns."""

    def __init__(self, port: int, token: str, seed: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.random = random.Random(seed)
        self.state = {"total": 0, "calls": 0}

    def post(self, path: str, body: dict) -> tuple[int, dict, int, float]:
        payload = json.dumps(body)
        began = time.perf_counter()
        self.conn.request("POST", path, body=payload, headers=self.headers)
        response = self.conn.getresponse()
        raw = response.read()
        elapsed_ms = (time.perf_counter() - began) * 1000
        return response.status, json.loads(raw), int(response.getheader("X-Loom-Worker") or 0), elapsed_ms

    def fresh(self, paths: dict) -> tuple[bool, int, float]:
        a, b = self.random.randrange(10**9), self.random.randrange(10**9)
        status, body, worker, ms = self.post(paths["fresh"], {"input": {"a": a, "b": b}})
        return status == 200 and body.get("status") == "completed" and body.get("result") == a + b, worker, ms

    def stateful(self, paths: dict) -> tuple[bool, int, float]:
        n = self.random.randrange(1000)
        expected = {"total": self.state["total"] + n, "calls": self.state["calls"] + 1}
        status, body, worker, ms = self.post(paths["state"], {"input": {"n": n}, "state": self.state})
        ok = status == 200 and body.get("result") == expected["total"] and body.get("state") == expected
        if ok:
            self.state = body["state"]  # the caller owns the state: the next call sends this one
        return ok, worker, ms

    def close(self) -> None:
        self.conn.close()


def run_cell(ctx, port: int, token: str, paths: dict, mode: str, concurrency: int, total: int,
             seen_workers: set[int]) -> dict:
    clients = [Client(port, token, seed=concurrency * 1000 + i) for i in range(concurrency)]
    remaining = [total]
    lock = threading.Lock()
    latencies: list[float] = []
    cold: list[float] = []
    failures: list[str] = []
    workers: set[int] = set()
    bar = ctx.progress(total, f"{mode} c={concurrency}")

    def drive(client: Client) -> None:
        call = client.fresh if mode == "fresh" else client.stateful
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            try:
                ok, worker, ms = call(paths)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                client.conn.close()  # http.client reconnects on the next request
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                bar.update(1)
                if not ok:
                    failures.append(f"wrong or failed response from worker {worker}")
                    continue
                latencies.append(ms)
                workers.add(worker)
                if worker not in seen_workers:
                    seen_workers.add(worker)
                    cold.append(ms)

    threads = [threading.Thread(target=drive, args=(c,)) for c in clients]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    bar.close()
    for client in clients:
        client.close()
    ctx.record(mode, {"concurrency": concurrency, "workers": ctx.options["workers"],
                      "worker_class": ctx.options["worker_class"]},
               throughput=len(latencies) / wall, unit="req/s", latencies_ms=latencies, count=len(latencies),
               errors=len(failures), validated=len(latencies), cold_requests=len(cold),
               cold_max_ms=max(cold) if cold else None, workers_seen=len(workers),
               warmup_excluded=ctx.options["warmup"], wall_s=wall, first_errors=failures[:5])
    return {"errors": len(failures)}


def run(ctx) -> None:
    options = ctx.options
    modes = options["modes"] or list(SECTION_MODES)
    token = secrets.token_urlsafe(24)
    port = free_port()
    # The server serves the database this run writes to (the connection's settings, not the environment's
    # DATABASE_URL: under a test runner or a second alias they differ), with this process's key (loomsite.E003).
    env = child_env(LOOM_API_AUTH="true", LOOM_API_TOKENS=token, LOOM_API_EXAMPLES="true",
                    SECRET_KEY=settings.SECRET_KEY)
    paths = {"fresh": reverse("loomapi:call", kwargs={"name": "calc.add"}),
             "state": reverse("loomapi:call", kwargs={"name": "calc.accumulate"})}
    rows_before = Event.objects.count()
    server = spawn_server(options["workers"], port, env, "--worker-class", options["worker_class"])
    workers: set[int] = set()
    errors = 0
    try:
        workers = wait_ready(server, port, reverse("loomapi:health"), options["workers"])
        ctx.log(f"serve_api pid {server.pid} on 127.0.0.1:{port} with workers {sorted(workers)}")
        seen: set[int] = set()
        warm = Client(port, token, seed=0)
        for _ in range(options["warmup"]):
            ok, worker, _ms = warm.fresh(paths)
            if not ok:
                raise VerificationError("http: a warm-up call returned a wrong or failed response")
            seen.add(worker)
        warm.close()
        ctx.log(f"warm-up: {options['warmup']} sequential calls excluded, served by {len(seen)} worker(s)")
        for mode in modes:
            for concurrency in options["concurrency"]:
                errors += run_cell(ctx, port, token, paths, mode, concurrency, options["requests"], seen)["errors"]
        workers |= children(server.pid)
        # Shut down the hard way: the check that no worker outlives a SIGKILLed parent.
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        began = time.perf_counter()
        left = wait_gone(workers, timeout=30)
        ctx.record("abrupt-parent-cleanup", {"workers": len(workers)}, count=len(workers) - len(left),
                   workers_left=len(left), exit_wait_ms=(time.perf_counter() - began) * 1000)
        if left:
            raise VerificationError(f"http: workers {sorted(left)} outlived their SIGKILLed parent:\n"
                                    f"{server_log(server)[-2000:]}")
    finally:
        kill_all({server.pid, *workers}, signal.SIGKILL)
        server.wait(timeout=10)
        server.log.close()
    ctx.verify("journal rows written by transient calls (none)", rows_before, Event.objects.count())
    if errors:
        raise VerificationError(f"http: {errors} request(s) failed or returned a wrong result (see first_errors)")
