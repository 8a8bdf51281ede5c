"""Telemetry of real processes: serve_api (two gunicorn workers) and loom_worker processes write spans as JSON
lines (LOOM_TRACES=jsonl) and answer /metrics (multiprocess mode); a worker is SIGKILLed inside a step and
another recovers the run; a real Prometheus (Debian's package) scrapes the API and the surviving worker and is
asked, over its HTTP API, for the queue depth and the completed counts, which must be the database's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from journal.flows import start
from journal.models import Execution
from loomapi.process import free_port, kill_all, server_log, spawn_server, wait_ready
from queues.models import QueueEntry
from tests.conftest import ROOT
from tests.fixtures import telemetry_flows  # noqa: F401  (registers the flows)

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason="needs /usr/bin/prometheus (scripts/ensure-packages)"),
]

TOKEN = "telemetry-process-token-0123456789"
CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def wait_until(predicate, what: str, timeout: float = 60.0, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{what}: a child exited early ({proc.returncode}):\n{proc.log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.1)


def worker(env: dict, name: str, tmp: Path, *extra: str) -> subprocess.Popen:
    multiproc = tmp / f"prom-{name}"
    multiproc.mkdir()
    log = tmp / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", name, *extra],
                            env={**env, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def api(port: int, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                                              **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read()), dict(response.headers)


def promql(port: int, query: str) -> float | None:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            data = json.loads(response.read())
    except OSError:
        return None
    result = data["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_a_trace_and_the_metrics_survive_a_sigkill_and_match_the_database(child_env, tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    env = {**child_env, "LOOM_API_TOKENS": TOKEN, "LOOM_API_AUTH": "true",
           "LOOM_FLOW_MODULES": "tests.fixtures.telemetry_flows", "LOOM_TRACES": "jsonl",
           "LOOM_TRACES_FILE": str(spans_file), "LOOM_METRICS": "true",
           "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
           "LOOM_RECOVERY_EVERY": "0.2", "LOOM_LEASE_MODE": "lazy", "LOOM_QUEUE_POLL": "0.2"}
    (tmp_path / "prom-api").mkdir()
    api_port, worker_port, prom_port = free_port(), free_port(), free_port()
    server = spawn_server(2, api_port, {**env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom-api")})
    procs: list[subprocess.Popen] = []
    prometheus = None
    try:
        wait_ready(server, api_port, "/api/health", workers=2)
        first = worker(env, "tel-a", tmp_path)
        procs.append(first)
        (tmp_path / "hold").write_text("")
        status, _, headers = api(api_port, "/api/flows/telemetry.flaky/executions",
                                 {"input": {"dir": str(tmp_path)}, "execution_id": "tel-kill"},
                                 {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        assert status == 202
        request_span = headers["traceparent"].split("-")[2]
        wait_until(lambda: (tmp_path / f"in-hold-{first.pid}").exists(), "worker A inside the held step", procs=procs)
        os.killpg(first.pid, signal.SIGKILL)  # inside a step: no settle, no release, no span end
        first.wait(timeout=10)
        procs.remove(first)
        (tmp_path / "hold").unlink()
        second = worker(env, "tel-b", tmp_path, "--metrics-port", str(worker_port))
        procs.append(second)
        wait_until(lambda: Execution.objects.filter(pk="tel-kill", status="completed").exists(),
                   "worker B recovers and completes the run", procs=procs)

        for n in range(5):
            assert api(api_port, "/api/flows/telemetry.double/executions", {"input": {"n": n}})[0] == 202
        for n in range(3):  # pending on the default queue, not due for an hour: the depth Prometheus reads
            start("telemetry.double", {"n": n}, f"tel-later-{n}", queue="default", delay=3600)
        wait_until(lambda: Execution.objects.filter(flow="telemetry.double", status="completed").count() == 5,
                   "worker B runs the five doubles", procs=procs)

        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {"job_name": "worker", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
                {"job_name": "api", "metrics_path": "/api/metrics", "authorization": {"credentials": TOKEN},
                 "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}]},
            ]}))
        log = (tmp_path / "prometheus.log").open("w")
        prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        depth = QueueEntry.objects.filter(queue_id="default", state="pending").count()
        done = Execution.objects.filter(flow="telemetry.double", status="completed").count()
        assert (depth, done) == (3, 5)
        wanted = {
            'loom_queue_depth{job="worker",queue="default"}': depth,
            'loom_queue_depth{job="api",queue="default"}': depth,
            'sum(loom_executions_settled_total{job="worker",flow="telemetry.double",status="completed"})': done,
            'loom_executions{job="api",flow="telemetry.double",status="completed"}': done,
            'loom_executions{job="worker",flow="telemetry.flaky",status="completed"}': 1,
            # the API's two gunicorn workers added up (multiprocess mode): six starts answered 202
            'sum(loom_api_requests_total{job="api",route="start_execution",status="202"})': 6,
            'sum(loom_recoveries_total{job="worker",flow="telemetry.flaky"})': 1,
        }
        seen: dict[str, float | None] = {}

        def all_seen() -> bool:
            seen.update({query: promql(prom_port, query) for query in wanted})
            return seen == {query: float(value) for query, value in wanted.items()}

        try:
            wait_until(all_seen, "Prometheus reports the database's figures", timeout=60, procs=[*procs])
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen}") from None
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        kill_all({server.pid}, signal.SIGTERM)
        server.wait(timeout=30)
        server_text = server_log(server)
        server.log.close()

    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    mine = [s for s in spans if s["attributes"].get("loom.execution_id") == "tel-kill"]
    assert {s["context"]["trace_id"] for s in mine} == {"0x" + CALLER_TRACE}, server_text  # ONE trace
    (request,) = [s for s in mine if s["name"] == "loom.api POST"]
    assert (request["parent_id"], request["context"]["span_id"]) == ("0x" + CALLER_SPAN, "0x" + request_span)
    flaky = sorted((s for s in mine if s["name"] == "loom.step flaky"), key=lambda s: s["attributes"]["loom.attempt"])
    attempts = [(s["attributes"]["loom.attempt"], s["attributes"].get("loom.retry")) for s in flaky]
    assert attempts == [(1, True), (2, None)]
    runs = [s for s in mine if s["name"] == "loom.run telemetry.flaky"]
    # Worker A's run span never ended (SIGKILL): what crossed is its ended step spans, written as they ended,
    # and the ids in the journal; the recovery's run on worker B is a child of the same request span.
    (recovered,) = runs
    assert recovered["attributes"]["loom.recovered"] is True
    assert recovered["parent_id"] == "0x" + request_span
    assert recovered["attributes"]["loom.status"] == "completed"
    assert flaky[0]["parent_id"] != recovered["context"]["span_id"]  # A's attempts hang under A's (lost) run
    (hold,) = [s for s in mine if s["name"] == "loom.step hold"]
    assert hold["parent_id"] == recovered["context"]["span_id"]
    assert Execution.objects.get(pk="tel-kill").recoveries == 1

