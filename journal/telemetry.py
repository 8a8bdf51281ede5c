"""Telemetry into the operator's own tools: OpenTelemetry spans, Prometheus metrics, JSON log lines.

Off unless configured (LOOM_TRACES, LOOM_METRICS, LOOM_LOG_JSON; docs/observability.md). Every hook
here starts with a check of a module flag, so a call site costs one function call when telemetry is
off, and the libraries are imported only when it is on. The call sites are one line each:

- `Runner._drive` is wrapped by `traced_run` (a span per run of an execution: its attempt); a run driven from
  the loop (`Runner.adrive`: astart, aresume, a worker's async queue runs) by journal/flows/aio.py `traced`,
  which opens the same span (`run_span`) around it;
- `Runner.emit` calls `on_event` for every event a run records: step attempts (started, completed,
  failed with retry/timeout) and waits become child spans; settles and step durations become metrics;
- the API view wrapper, the queue dispatcher, the recovery sweep, the lease keeper and the coalescer
  call `request_span`/`dispatch_span`/`count`/`observe`.

Traces cross processes through the journal itself: the API records its request span's W3C ids in the
start's `$meta` (loomapi/views.py), and every run of the execution, on any worker, before or after a
recovery, reads them from the execution's first event and makes its span a child of the request's.
Nothing but ids, names, counts and statuses goes into a span or a label: no input, result, error text
or message topic (they may hold personal data, docs/privacy.md).

Metrics: counters and histograms live in the process (prometheus-client's multiprocess mode when
PROMETHEUS_MULTIPROC_DIR is set, so gunicorn's and django-q2's children add up); gauges that describe
the database (executions by status, queue depth, oldest pending age) are computed from it at scrape
time by `DatabaseCollector`, so every worker host reports the same truth.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

TRACING = False  # a tracer is installed (LOOM_TRACES)
METRICS = False  # metrics are collected (LOOM_METRICS)

_tracer: Any = None
_metrics: dict[str, Any] = {}
_lock = threading.Lock()
# The open spans of the run in this thread: {"run": span, "steps": {pos: span}}.
_run: contextvars.ContextVar[dict | None] = contextvars.ContextVar("loom_run_span", default=None)
_request: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("loom_request_span", default=None)
# Gauge sources the apps above the journal register (queues: depth and oldest pending age).
SOURCES: list[Callable[[], Iterable[tuple[str, str, dict[str, str], float]]]] = []


def add_gauge_source(source: Callable[[], Iterable[tuple[str, str, dict[str, str], float]]]) -> None:
    """Register a gauge source read at each scrape (an app's ready(): the queues' depth, projections' lag), once."""
    if source not in SOURCES:
        SOURCES.append(source)


log = logging.getLogger("loom.telemetry")


def configure() -> None:
    """Install what the settings ask for (called by the journal's ready(); again by tests)."""
    global TRACING, METRICS, _tracer
    from journal import conf

    with _lock:
        # A bad value is reported by the system check loom.E001, not at start-up: telemetry stays off then.
        mode = conf.get_safe("LOOM_TRACES", "off")
        try:
            _tracer = _make_tracer(mode) if mode != "off" else None
            METRICS = bool(conf.get_safe("LOOM_METRICS", False))
            if METRICS and not _metrics:
                _make_metrics()
        except ImportError as exc:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(f"LOOM_TRACES={mode!r} / LOOM_METRICS need {exc.name}: pip install "
                                       "'loom-django[telemetry]' (or [telemetry-otlp]; docs/observability.md)") from exc
        TRACING = _tracer is not None


def _make_tracer(mode: str):
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    from journal import conf

    if mode == "global":  # the host project's provider (opentelemetry.trace.set_tracer_provider)
        return trace.get_tracer("loom")
    provider = TracerProvider(resource=Resource.create({"service.name": conf.get("LOOM_TRACES_SERVICE")}))
    if mode == "jsonl":
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(conf.get("LOOM_TRACES_FILE"))))
    else:  # otlp: the exporter reads OTEL_EXPORTER_OTLP_* (endpoint, headers) from the environment
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider.get_tracer("loom")


class JsonLinesExporter:
    """Each ended span as one JSON line appended to a file (O_APPEND: several processes share one file).
    For tests and for shipping by a log agent; a span is written when it ends, so the run a SIGKILL cut
    short leaves no span of its own (its ended steps are there)."""

    def __init__(self, path: str):
        self.path = path

    def export(self, spans) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# -- traces ----------------------------------------------------------------------------------------

def _parent_of(execution_id: str, meta: dict | None = None):
    """The OTel context of the request that started the execution (`meta`, else the $meta of its first
    event), or None (a child of the span running here, if any)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    current = trace.get_current_span().get_span_context()
    if current.is_valid:
        return None  # in a request or a dispatch span already: a child of it
    if meta is None:
        from journal.models import Event

        try:
            first = Event.objects.read(execution_id, limit=1)
        except Exception:
            return None
        meta = (first[0].payload or {}).get("$meta") if first else None
    if not isinstance(meta, dict):
        return None
    try:
        remote = SpanContext(int(meta["trace_id"], 16), int(meta["span_id"], 16), is_remote=True,
                             trace_flags=TraceFlags(TraceFlags.SAMPLED))
    except (KeyError, TypeError, ValueError):
        return None
    return trace.set_span_in_context(NonRecordingSpan(remote))


def traced_run(drive: Callable) -> Callable:
    """Wraps Runner.drive: a span `loom.run <flow>` per run of an execution, its steps and waits inside."""

    @functools.wraps(drive)
    def wrapper(runner, flow, value):
        if not TRACING and not METRICS:
            return drive(runner, flow, value)
        return _traced(drive, runner, flow, value)

    return wrapper


def count_run(runner, flow) -> None:
    """A run begins: the runs counter (run_span's first act, for either way a run is driven)."""
    if METRICS:
        _metrics["runs"].labels(flow.name, "recovery" if runner.recovered is not None else "run").inc()


def _traced(drive: Callable, runner, flow, value):
    parent = run_parent(runner) if TRACING else None
    with run_span(runner, flow, parent) as settled:
        return settled(drive(runner, flow, value))


def run_parent(runner):
    """The OTel context a run's span is a child of: the request that started it (a fresh start's `$meta`, else
    its first event's, READ here), or None (a child of the span running here). It may touch the database: a run
    driven from the loop calls it in a pool thread (journal/flows/aio.py `traced`)."""
    from journal.flows import events as ev

    run, pending = runner.run, runner.pending
    meta = None
    if run.token is None and pending and pending[0].type == ev.EXECUTION_STARTED:  # a fresh start: no read
        meta = pending[0].payload.get("$meta") or {}
    return _parent_of(run.execution_id, meta)


@contextmanager
def run_span(runner, flow, parent) -> Iterator[Callable]:
    """Around one run (Runner._drive in its thread, Runner.adrive on the loop): counted, and with tracing on its
    span `loom.run <flow>` (a child of `parent`: run_parent) made current, so the steps' and waits' spans that
    `on_event` opens are its children. Yields `settled(outcome) -> outcome`, which records the run's status.
    The span state lives in context variables: a loop-driven run's pool calls run in copies of its task's
    context, so they see the same span and the same open steps as a thread's calls do."""
    run = runner.run
    count_run(runner, flow)
    if not TRACING:
        yield lambda outcome: outcome
        return
    from opentelemetry import context, trace

    attributes = {"loom.execution_id": run.execution_id, "loom.flow": flow.name,
                  "loom.flow_version": int(getattr(run, "version", None) or getattr(flow, "version", 1) or 1),
                  "loom.fence": -1 if run.token is None else int(run.token),
                  "loom.recovered": runner.recovered is not None, "loom.worker": _worker()}
    span = _tracer.start_span(f"loom.run {flow.name}", context=parent, attributes=attributes)
    token = context.attach(trace.set_span_in_context(span))
    state = {"run": span, "steps": {}}
    previous = _run.set(state)

    def settled(outcome):
        span.set_attribute("loom.status", outcome.status)
        if run.token is not None:
            span.set_attribute("loom.fence", int(run.token))
        if outcome.status == "failed":
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        return outcome

    try:
        yield settled
    except BaseException as exc:
        span.set_attribute("loom.status", "halted")
        span.set_attribute("loom.halt", type(exc).__name__)
        raise
    finally:
        for open_span in state["steps"].values():  # a wait that parked, a step the run stopped in
            open_span.set_attribute("loom.parked" if open_span.name.startswith("loom.wait") else "loom.cut", True)
            open_span.end()
        _run.reset(previous)
        context.detach(token)
        span.end()


def on_event(runner, type_: str, payload: dict) -> None:
    """An event a run records: open or close the step's span; count settles and step durations."""
    if not TRACING and not METRICS:
        return
    from journal.flows import events as ev

    if METRICS:
        flow = runner.state.flow or runner.run.flow
        if type_ in (ev.EXECUTION_COMPLETED, ev.EXECUTION_FAILED):
            _metrics["settled"].labels(flow, "completed" if type_ == ev.EXECUTION_COMPLETED else "failed").inc()
        elif type_ in (ev.STEP_COMPLETED, ev.STEP_FAILED) and payload.get("ms") is not None:
            outcome = "completed" if type_ == ev.STEP_COMPLETED else ("retry" if payload.get("retry") else "failed")
            _metrics["step_seconds"].labels(flow, outcome).observe(payload["ms"] / 1000.0)
    state = _run.get() if TRACING else None
    if state is None:
        return
    pos = payload.get("pos")
    steps = state["steps"]
    if type_ == ev.STEP_STARTED:
        steps[pos] = _tracer.start_span(f"loom.step {payload.get('step')}", attributes={
            "loom.step": str(payload.get("step")), "loom.pos": int(pos), "loom.attempt": int(payload.get("attempt", 1)),
            "loom.execution_id": runner.run.execution_id})
    elif type_ == ev.WAIT_STARTED:
        steps[pos] = _tracer.start_span(f"loom.wait {payload.get('kind')}", attributes={
            "loom.wait": str(payload.get("kind")), "loom.pos": int(pos), "loom.execution_id": runner.run.execution_id})
    elif type_ in (ev.STEP_COMPLETED, ev.STEP_FAILED):
        span = steps.pop(pos, None)
        if span is None:
            return
        if type_ == ev.STEP_FAILED:
            from opentelemetry import trace

            span.set_attribute("loom.retry", bool(payload.get("retry")))
            span.set_attribute("loom.timeout", bool(payload.get("timeout")))
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end()


def traced_dispatch(run_claimed: Callable) -> Callable:
    """Wraps queues.service.run_claimed(claimed, using): the claimed entry's run inside `dispatch_span`, and
    its dispatch lag (the claim's `lag`: due to claimed, on the database's clock) in the queue's histogram."""

    @functools.wraps(run_claimed)
    def wrapper(claimed, using=None):
        if not TRACING and not METRICS:
            return run_claimed(claimed, using)
        if METRICS and claimed.lag is not None:
            _metrics["dispatch_lag"].labels(claimed.queue).observe(max(0.0, claimed.lag))
        with dispatch_span(claimed.execution_id, claimed.flow, claimed.meta):
            return run_claimed(claimed, using)

    return wrapper


_READ = object()  # dispatch_span's parent when the caller did not resolve it: resolved there (it may read)


def dispatch_parent(execution_id: str, meta: dict | None):
    """The OTel context a dispatch span is a child of (the entry's `$meta`, else the execution's first event's,
    READ here): an entry run from the loop resolves it in a pool thread (queues/loop.py)."""
    return _parent_of(execution_id, meta or None)


@contextmanager
def dispatch_span(execution_id: str, flow: str, meta: dict | None, parent: Any = _READ) -> Iterator[None]:
    """Around a claimed queue entry's run in the dispatcher: a span `loom.queue.dispatch`, a child of the
    start's request (the entry's `$meta`; `parent`: dispatch_parent's answer, when the caller resolved it), the
    run's span inside it."""
    if METRICS:
        _metrics["dispatched"].labels(flow).inc()
    if not TRACING:
        yield
        return
    from opentelemetry import context, trace

    if parent is _READ:
        parent = dispatch_parent(execution_id, meta)
    span = _tracer.start_span("loom.queue.dispatch", context=parent, attributes={
        "loom.execution_id": execution_id, "loom.flow": flow, "loom.worker": _worker()})
    token = context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        context.detach(token)
        span.end()


def traced_drain(cycle: Callable) -> Callable:
    """Wraps a drain controller's cycle: a span `loom.drain <lane>` when it claimed work, and the number of
    events it handed to consumers."""

    @functools.wraps(cycle)
    def wrapper(controller):
        if not TRACING and not METRICS:
            return cycle(controller)
        lane, began = controller.lane.name, time.time_ns()
        result = cycle(controller)
        if result.claimed:
            if METRICS:
                _metrics["drain"].labels(lane).observe(result.handled)
            if TRACING:
                _tracer.start_span(f"loom.drain {lane}", start_time=began, attributes={
                    "loom.lane": lane, "loom.alias": controller.alias, "loom.claimed": result.claimed,
                    "loom.handled": result.handled, "loom.failed": result.failed}).end()
        return result

    return wrapper


def request_begin(trace_id: str, parent_id: str | None, method: str, path: str) -> tuple[str, str] | None:
    """An API request's span, a child of the caller's `traceparent` (if any); its (trace id, span id) in
    hex, which the API then answers and records in `$meta`. None when tracing is off."""
    if not TRACING:
        return None
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    parent = None
    if parent_id:
        parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            int(trace_id, 16), int(parent_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
    span = _tracer.start_span(f"loom.api {method}", context=parent, kind=trace.SpanKind.SERVER,
                              attributes={"http.request.method": method, "http.route": path})
    token = context.attach(trace.set_span_in_context(span))
    _request.set((span, token))
    ids = span.get_span_context()
    return format(ids.trace_id, "032x"), format(ids.span_id, "016x")


def annotate(**attributes: Any) -> None:
    """Attributes of the running API request's span (the execution it started, its flow)."""
    if TRACING:
        current = _request.get()
        if current is not None:
            for key, value in attributes.items():
                current[0].set_attribute(f"loom.{key}", value)


def request_end(status: int, route: str) -> None:
    """The end of an API request: its span ends, and it is counted by status."""
    if METRICS:
        _metrics["api"].labels(route, str(status)).inc()
    current = _request.get() if TRACING else None
    if current is None:
        return
    from opentelemetry import context, trace

    span, token = current
    _request.set(None)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(trace.Status(trace.StatusCode.ERROR))
    context.detach(token)
    span.end()


def current_ids() -> tuple[str, str] | None:
    """The (trace id, span id) of the span running in this thread, for log lines."""
    if not TRACING:
        return None
    from opentelemetry import trace

    ids = trace.get_current_span().get_span_context()
    if not ids.is_valid:
        return None
    return format(ids.trace_id, "032x"), format(ids.span_id, "016x")


def _worker() -> str:
    from journal.identity import node_identity

    try:
        return str(node_identity())
    except Exception:
        return f"pid:{os.getpid()}"


# -- metrics ---------------------------------------------------------------------------------------

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# A dispatch lag: milliseconds when the dispatchers keep up (a NOTIFY wakes them), up to the claim
# timeout's re-offer or a backlog's hours when they do not.
_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def _make_metrics() -> None:
    from prometheus_client import Counter, Histogram

    _metrics.update(
        runs=Counter("loom_runs", "Runs of executions begun in this process (kind: run, recovery)", ["flow", "kind"]),
        settled=Counter("loom_executions_settled", "Executions this process settled, by flow and status",
                        ["flow", "status"]),
        step_seconds=Histogram("loom_step_duration_seconds", "Duration of step attempts, by flow and outcome "
                               "(completed, retry, failed)", ["flow", "outcome"], buckets=_BUCKETS),
        dispatched=Counter("loom_queue_dispatched", "Queue entries this process claimed and ran", ["flow"]),
        dispatch_lag=Histogram("loom_queue_dispatch_lag_seconds", "Seconds from a queue entry's due time (run_after; "
                               "its enqueue when undelayed) to its claim, on the database's clock, per queue",
                               ["queue"], buckets=_LAG_BUCKETS),
        api=Counter("loom_api_requests", "HTTP API requests answered, by route and status", ["route", "status"]),
        takeovers=Counter("loom_lease_takeovers", "Executions the recovery sweep took over (handed_back: a lease a "
                          "stopping worker handed back, no recovery attempt)", ["handed_back"]),
        recoveries=Counter("loom_recoveries", "Recovered runs begun in this process", ["flow"]),
        stuck=Counter("loom_recovery_gave_up", "Executions the recovery sweep marked stuck", []),
        renewals=Counter("loom_lease_renewals", "Leases renewed by this process's keeper", []),
        batch=Histogram("loom_coalescer_batch_size", "Requests merged into one statement by the coalescer",
                        ["kind"], buckets=(1, 2, 4, 8, 16, 32, 64, 128)),
        drain=Histogram("loom_drain_batch_events", "Events handed to consumers per drain cycle", ["lane"],
                        buckets=(0, 1, 5, 10, 50, 100, 500, 1000)),
    )


def count(name: str, amount: float = 1, **labels: str) -> None:
    """Add to a counter (a no-op when metrics are off)."""
    if METRICS and amount:
        metric = _metrics[name]
        (metric.labels(**labels) if labels else metric).inc(amount)


def takeovers(taken: int, handed_back: int, stuck: int) -> None:
    """One recovery sweep's takeovers (handed back: no recovery attempt) and the executions it gave up on."""
    if METRICS:
        count("takeovers", taken - handed_back, handed_back="false")
        count("takeovers", handed_back, handed_back="true")
        count("stuck", stuck)


def observe(name: str, value: float, **labels: str) -> None:
    """Observe a histogram value (a no-op when metrics are off)."""
    if METRICS:
        metric = _metrics[name]
        (metric.labels(**labels) if labels else metric).observe(value)


class DatabaseCollector:
    """Gauges read from the database at scrape time: executions by shard, flow and status (stuck included),
    and what the apps above register in SOURCES (queue depth, oldest pending age)."""

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, GaugeMetricFamily] = {}

        def add(name: str, doc: str, labels: dict[str, str], value: float) -> None:
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, doc, labels=list(labels))
            family.add_metric(list(labels.values()), value)

        ok: dict[str, float] = {}  # loom_scrape_database_ok by alias: 0 if any source failed to read it

        def take(name: str, doc: str, labels: dict[str, str], value: float) -> None:
            if name == DATABASE_OK[0]:
                ok[labels["alias"]] = min(value, ok.get(labels["alias"], 1))
            else:
                add(name, doc, labels, value)

        for name, doc, labels, value in executions_by_status():
            take(name, doc, labels, value)
        for source in SOURCES:
            try:
                for name, doc, labels, value in source():
                    take(name, doc, labels, value)
            except Exception:  # a source failed as a whole: which alias it missed is unknown, so every one is 0
                log.warning("a metrics source failed", exc_info=True)
                ok = dict.fromkeys(ok, 0)
        for alias, value in ok.items():
            add(*DATABASE_OK, {"alias": alias}, value)
        families["loom_scrape_time"] = GaugeMetricFamily("loom_scrape_time", "When this scrape read the database "
                                                         "(unix seconds)", value=time.time())
        yield from families.values()

    def describe(self):
        return []


DATABASE_OK = ("loom_scrape_database_ok", "1 when this scrape read the database alias, 0 when it could not (its "
               "gauges are then absent from the scrape)")


def database_failed(alias: str) -> tuple[str, str, dict[str, str], float]:
    """What a gauge source yields for an alias it could not read (its gauges left out): the scrape's
    loom_scrape_database_ok for that alias becomes 0 even if the executions were read."""
    return (*DATABASE_OK, {"alias": alias}, 0)


def executions_by_status() -> Iterator[tuple[str, str, dict[str, str], float]]:
    from journal.shards import shards
    from journal.store import store_for

    for alias in shards():
        try:
            rows = store_for(alias).count_executions_by_status()
        except Exception:
            log.warning("executions by status on %s failed", alias, exc_info=True)
            yield (*DATABASE_OK, {"alias": alias}, 0)  # said, not only missing: its gauges are absent
            continue
        yield (*DATABASE_OK, {"alias": alias}, 1)
        for flow, status, n in rows:
            yield ("loom_executions", "Executions in the database by shard, flow and status (running, waiting, "
                   "queued, completed, failed, stuck, ...)", {"alias": alias, "flow": flow, "status": status}, n)


def exposition() -> tuple[bytes, str]:
    """The metrics page in Prometheus text format: this process's (or all processes' of the multiprocess
    directory) counters and histograms, and the database's gauges."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    database = CollectorRegistry()
    database.register(DatabaseCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        processes = CollectorRegistry()
        multiprocess.MultiProcessCollector(processes)  # every process's files in the directory, added up
    else:
        processes = REGISTRY  # this process's metrics (and prometheus-client's process and GC collectors)
    return generate_latest(processes) + generate_latest(database), CONTENT_TYPE_LATEST


def serve_metrics(port: int, host: str = "127.0.0.1"):
    """An HTTP server in a daemon thread answering /metrics (loom_worker --metrics-port)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from django.db import connections

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            try:
                body, content_type = exposition()
            finally:
                connections.close_all()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="loom-metrics", daemon=True).start()
    return server


# -- logs ------------------------------------------------------------------------------------------

class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message, and the trace and span ids of the span
    running (or of the API request: loomapi's TraceLogFilter sets `trace_id`/`span_id`)."""

    def format(self, record: logging.LogRecord) -> str:
        ids = current_ids()
        trace_id, span_id = ids if ids else (getattr(record, "trace_id", "-"), getattr(record, "span_id", "-"))
        line = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
                "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                "pid": record.process}
        if trace_id and trace_id != "-":
            line["trace_id"], line["span_id"] = trace_id, span_id
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


JsonFormatter.converter = time.gmtime


def _reconfigure(*, setting: str, **kwargs) -> None:
    if setting in ("LOOM_TRACES", "LOOM_TRACES_FILE", "LOOM_METRICS"):
        configure()


def _connect() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(_reconfigure, dispatch_uid="loom-telemetry")


_connect()
