"""Telemetry in this process (journal/telemetry.py): spans in the OTel SDK's in-memory exporter, the metrics
page read as Prometheus text, JSON log lines; with the API's scopes, privacy and the queues. The real
processes (serve_api, loom_worker, a SIGKILL, a real Prometheus) are tests/journal/test_telemetry_processes.py."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from journal import telemetry
from journal.flows import start
from journal.models import Execution
from queues import run_due
from queues.models import QueueEntry
from tests.fixtures import privacy_fixtures as fx
from tests.fixtures import telemetry_flows  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "telemetry-token-0123456789"
SCOPED = {"token": "telemetry-scoped-0123456789", "name": "scoped", "flows": ["telemetry.double"]}
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    """Runs here start the process's lease keeper (PostgreSQL): stopped before the test database goes."""
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def spans(monkeypatch, settings):
    """Tracing on, into an in-memory exporter (the SDK's), metrics on."""
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [TOKEN, SCOPED]
    settings.LOOM_METRICS = True
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "_tracer", provider.get_tracer("test"))
    monkeypatch.setattr(telemetry, "TRACING", True)
    yield exporter
    provider.shutdown()


def api_start(client, flow: str, body: dict, token: str = TOKEN, traceparent: str | None = None):
    headers = {"Authorization": f"Bearer {token}"}
    if traceparent:
        headers["traceparent"] = traceparent
    return client.post(f"/api/flows/{flow}/executions", data=json.dumps(body), content_type="application/json",
                       headers=headers)


def metrics(client, token: str | None = TOKEN) -> dict[tuple[str, tuple], float]:
    response = client.get("/api/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    assert response.status_code == 200, response.content
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}


def test_one_trace_from_the_api_start_through_the_queue_to_every_step_attempt(client, spans, tmp_path):
    response = api_start(client, "telemetry.flaky", {"input": {"dir": str(tmp_path)}, "execution_id": "tel-1"},
                         traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    assert response.status_code == 202, response.content
    answered = response["traceparent"].split("-")
    assert answered[1] == CALLER_TRACE
    assert run_due() == ["completed"]
    finished = spans.get_finished_spans()
    by_name: dict[str, list] = {}
    for one in finished:
        by_name.setdefault(one.name, []).append(one)
    assert {one.context.trace_id for one in finished} == {int(CALLER_TRACE, 16)}  # ONE trace
    (api,) = by_name["loom.api POST"]
    assert api.parent.span_id == int(CALLER_SPAN, 16)  # the caller's span is its parent
    assert format(api.context.span_id, "016x") == answered[2]  # the span the API answered (and put in $meta)
    assert api.attributes["loom.execution_id"] == "tel-1"
    assert api.attributes["http.response.status_code"] == 202
    (dispatch,) = by_name["loom.queue.dispatch"]
    assert dispatch.parent.span_id == api.context.span_id  # from the entry's $meta: another thread, or process
    (run,) = by_name["loom.run telemetry.flaky"]
    assert run.parent.span_id == dispatch.context.span_id
    assert (run.attributes["loom.execution_id"], run.attributes["loom.status"]) == ("tel-1", "completed")
    assert run.attributes["loom.fence"] >= 1 and run.attributes["loom.flow_version"] == 1
    attempts = sorted(by_name["loom.step flaky"], key=lambda s: s.attributes["loom.attempt"])
    assert [(s.attributes["loom.attempt"], s.attributes.get("loom.retry"), s.status.is_ok) for s in attempts] == [
        (1, True, False), (2, None, True)]
    assert {s.parent.span_id for s in [*attempts, *by_name["loom.step hold"]]} == {run.context.span_id}
    # The metrics of the same run: one completed settle, step attempts by outcome.
    seen = metrics(client)
    assert seen[("loom_executions_settled_total", (("flow", "telemetry.flaky"), ("status", "completed")))] == 1
    assert seen[("loom_step_duration_seconds_count", (("flow", "telemetry.flaky"), ("outcome", "retry")))] >= 1
    assert seen[("loom_executions", (("alias", "default"), ("flow", "telemetry.flaky"), ("status", "completed")))] \
        == Execution.objects.filter(flow="telemetry.flaky", status="completed").count() == 1


def test_metrics_page_reads_queue_depth_from_the_database_and_only_a_full_token_reads_it(client, spans, settings):
    for n in range(3):
        start("telemetry.double", {"n": n}, f"tel-q{n}", queue="default", delay=3600)  # pending, not due
    start("telemetry.double", {"n": 9}, "tel-now", queue="default")
    late = timezone.now() - timedelta(minutes=10)
    start("telemetry.double", {"n": 8}, "tel-late", queue="default", start_at=late)  # due 10 minutes ago
    seen = metrics(client)
    depth = QueueEntry.objects.filter(state="pending", queue_id="default").count()
    assert depth == 5
    assert seen[("loom_queue_depth", (("alias", "default"), ("queue", "default")))] == depth
    assert seen[("loom_queue_ready", (("alias", "default"), ("queue", "default")))] == 2
    assert seen[("loom_executions", (("alias", "default"), ("flow", "telemetry.double"), ("status", "queued")))] == 5
    oldest = QueueEntry.objects.get(execution_id="tel-late").run_after
    assert oldest <= late + timedelta(seconds=1)
    # the oldest due entry's age: at least the 10 minutes it was due before the scrape
    assert seen[("loom_queue_oldest_pending_age_seconds", (("alias", "default"), ("queue", "default")))] >= 599
    # A token limited to some flows could learn every flow's name and volume from the labels: it gets the
    # answer an unknown route gets; no token is refused as everywhere in the API.
    assert client.get("/api/metrics", headers={"Authorization": f"Bearer {SCOPED['token']}"}).status_code == 404
    assert client.get("/api/metrics").status_code == 401
    settings.LOOM_METRICS_AUTH = False  # bound where only Prometheus reaches it
    assert client.get("/api/metrics").status_code == 200
    settings.LOOM_METRICS = False
    assert client.get("/api/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404


def lag_samples(queue: str = "default") -> dict[str, float]:
    """The dispatch-lag histogram's count, sum and two buckets for one queue, from prometheus-client's registry
    (0 for a series not observed yet)."""
    from prometheus_client import REGISTRY

    name, labels = "loom_queue_dispatch_lag_seconds", {"queue": queue}
    return {"count": REGISTRY.get_sample_value(f"{name}_count", labels) or 0.0,
            "sum": REGISTRY.get_sample_value(f"{name}_sum", labels) or 0.0,
            **{le: REGISTRY.get_sample_value(f"{name}_bucket", {**labels, "le": le}) or 0.0
               for le in ("300.0", "+Inf")}}


def test_dispatch_lag_is_observed_per_queue_from_the_due_time_to_the_claim(settings):
    """An entry due 10 minutes ago and one enqueued without a delay, run by the dispatcher: two observations,
    the late one's at least its 10 minutes (above the 300 s bucket), computed by the claim from the row's
    run_after and started_at (one clock)."""
    settings.LOOM_METRICS = True
    before = lag_samples()
    late = timezone.now() - timedelta(minutes=10)
    start("telemetry.double", {"n": 1}, "tel-lag-late", queue="default", start_at=late)
    start("telemetry.double", {"n": 2}, "tel-lag-now", queue="default")
    assert sorted(run_due()) == ["completed", "completed"]
    after = lag_samples()
    assert after["count"] - before["count"] == 2 == after["+Inf"] - before["+Inf"]
    assert after["sum"] - before["sum"] >= 599  # the late entry's 10 minutes (less a second of clock rounding)
    assert after["300.0"] - before["300.0"] <= 1  # the late one is not in the <= 300 s bucket
    entry = QueueEntry.objects.get(execution_id="tel-lag-late")
    assert (entry.started_at - entry.run_after).total_seconds() >= 599  # what the claim measured


def test_dispatch_lag_is_not_observed_with_metrics_off(settings):
    settings.LOOM_METRICS = True  # the histogram exists in this process ...
    settings.LOOM_METRICS = False  # ... and the hook is off
    assert telemetry.METRICS is False and "dispatch_lag" in telemetry._metrics
    before = lag_samples()
    start("telemetry.double", {"n": 3}, "tel-lag-off", queue="default",
          start_at=timezone.now() - timedelta(minutes=10))
    assert run_due() == ["completed"]
    assert lag_samples() == before


def test_no_sealed_personal_data_in_spans_metrics_or_json_logs(client, spans, settings, caplog):
    """A flow whose input and step hold a sealed email, and one whose failures quote it: the email is in no
    span attribute, metric label or JSON log line (spans carry ids, names, counts and statuses only)."""
    settings.LOOM_KEYS = [fx.KEY_A]
    email = "ada.sealed@example.org"
    formatter = telemetry.JsonFormatter()
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(formatter.format(record))
    logging.getLogger("loom").addHandler(handler)
    try:
        for name, eid in (("test.privacy.signup", "tel-p1"), ("test.privacy.fails", "tel-p2")):
            response = api_start(client, name, {"input": {"customer_id": "c-7", "email": email}, "execution_id": eid})
            assert response.status_code == 202, response.content
        assert sorted(run_due()) == ["completed", "failed"]
    finally:
        logging.getLogger("loom").removeHandler(handler)
    finished = spans.get_finished_spans()
    assert {s.name for s in finished} >= {"loom.run test.privacy.fails", "loom.step privacy.mail",
                                          "loom.step privacy.greet"}
    exported = "\n".join(s.to_json() for s in finished)
    assert email not in exported and "ada.sealed" not in exported
    page = client.get("/api/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()
    assert "test.privacy.fails" in page and email not in page
    assert lines and all(json.loads(line)["logger"].startswith("loom") for line in lines)
    traced = [json.loads(line) for line in lines if "trace_id" in json.loads(line)]
    assert traced and {one["trace_id"] for one in traced} <= {format(s.context.trace_id, "032x") for s in finished}
    assert email not in "\n".join(lines)
    # ... while the journal does hold the failure (sealed): what is withheld here is withheld on purpose.
    assert Execution.objects.get(pk="tel-p2").status == "failed"


def test_off_by_default_nothing_installed(settings):
    """Unconfigured: no tracer, no metrics; the hooks return at their first line."""
    telemetry.configure()
    assert (telemetry.TRACING, telemetry.METRICS, telemetry._tracer) == (False, False, None)


def test_every_metric_is_documented_and_the_dashboard_asks_only_for_those():
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    if not telemetry._metrics:
        telemetry._make_metrics()
    suffix = {"Counter": "_total", "Histogram": "", "Gauge": ""}
    names = {m._name + suffix[type(m).__name__] for m in telemetry._metrics.values()}
    names |= {"loom_executions", "loom_queue_depth", "loom_queue_ready", "loom_queue_running",
              "loom_queue_oldest_pending_age_seconds", "loom_scrape_time", "loom_projection_lag_events",
              "loom_projection_blocked", "loom_scrape_database_ok"}
    table = set(re.findall(r"^\| `(loom_[a-z_]+)` \|", (docs / "observability.md").read_text(), re.M))
    assert table == names
    dashboard = json.loads((docs / "grafana" / "loom-dashboard.json").read_text())
    asked = {re.sub(r"_(bucket|sum|count)$", "", name) for panel in dashboard["panels"]
             for target in panel["targets"] for name in re.findall(r"loom_[a-z_]+", target["expr"])}
    assert asked <= names and len(dashboard["panels"]) >= 10


def test_projection_lag_is_read_from_the_subscriptions_and_a_drain_cycle_is_a_span(client, spans):
    from journal.envelopes import Envelope
    from journal.models import Event
    from projections.correlate import correlate
    from projections.declarations import registry
    from projections.models import Subscription
    from projections.service import drain
    from tests.projections.test_projections_helpers import applied, create_table, declare_counter

    registry.clear()
    create_table()
    try:
        declare_counter("tel_counter")
        for stream, n in (("tel-a", 3), ("tel-b", 2)):
            Event.objects.append(stream, [Envelope("Tick", {"i": i}) for i in range(n)])
        assert correlate(registry) > 0  # the subscriptions know of the events: nothing handled yet
        behind = sum(s.tip - s.at for s in Subscription.objects.filter(consumer="tel_counter"))
        assert behind == 5
        lag = ("loom_projection_lag_events", (("alias", "default"), ("consumer", "tel_counter")))
        assert metrics(client)[lag] == behind
        assert drain().handled == 5 and len(applied()) == 5
        assert metrics(client)[lag] == 0
        (cycle,) = [s for s in spans.get_finished_spans() if s.name == "loom.drain default"]
        assert (cycle.attributes["loom.handled"], cycle.attributes["loom.failed"]) == (5, 0)
        assert metrics(client)[("loom_drain_batch_events_sum", (("lane", "default"),))] == 5
    finally:
        registry.clear()


def test_a_wait_is_a_span_and_a_parked_run_ends_its_span_waiting(spans):
    assert start("telemetry.sleeps", {}, "tel-sleeps").status == "waiting"
    finished = spans.get_finished_spans()
    (run,) = [s for s in finished if s.name == "loom.run telemetry.sleeps"]
    waits = sorted((s for s in finished if s.name == "loom.wait sleep"), key=lambda s: s.attributes["loom.pos"])
    assert [(s.attributes["loom.pos"], s.attributes.get("loom.parked")) for s in waits] == [(0, None), (1, True)]
    assert {s.parent.span_id for s in waits} == {run.context.span_id}
    assert run.attributes["loom.status"] == "waiting" and run.parent is None  # started here, not by a request


def test_a_bad_value_is_the_system_checks_and_leaves_telemetry_off(settings):
    from django.core.checks import run_checks

    settings.LOOM_TRACES = "zipkin"
    assert (telemetry.TRACING, telemetry._tracer) == (False, None)
    assert any("LOOM_TRACES" in m.msg for m in run_checks() if m.id == "loom.E001")
