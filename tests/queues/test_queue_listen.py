"""The queue dispatcher LISTENs on PostgreSQL (LOOM_QUEUE_CHANNEL): an enqueue wakes idle dispatchers
at once, every dispatcher it wakes still respects the queue's cap, and a listener whose session is
terminated reconnects. The polls are set to 30 s here, so a dispatcher that only polled would start
nothing within the tests' bounds. Real QueueService instances (threads, their own sessions) in this
process; the next-due contract of the stores runs on both backends.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection

from journal.flows import registry
from journal.models import Execution
from queues import declare_queue, enqueue
from queues.declarations import forget
from queues.service import QueueService
from queues.store import store_for
from tests.fixtures import queue_flows  # noqa: F401  (registers the flows)

SLOW_POLL = 30.0  # seconds: far beyond BOUND, so only a notification can start an entry in time
BOUND = 10.0  # seconds an entry enqueued to an idle, listening dispatcher may take to complete here


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    """Runs here start the process's lease keeper thread; stop it at the end of the module."""
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def queue(request):
    name = "l-" + request.node.name[:60]
    yield name
    forget(name)


@pytest.fixture
def channel(settings) -> str:
    """Polls far too slow to matter, and a channel of this test's own (its listener's session is found
    by its LISTEN statement)."""
    settings.LOOM_QUEUE_POLL = SLOW_POLL
    settings.LOOM_QUEUE_IDLE_POLL = SLOW_POLL
    settings.LOOM_QUEUE_CHANNEL = name = f"loom_q_{uuid.uuid4().hex[:12]}"
    return name


@pytest.fixture
def services():
    """Start QueueServices; every one is stopped (its listener's session closed) at the end."""
    started: list[QueueService] = []

    def start(worker_id: str) -> QueueService:
        service = QueueService()
        service.start(SimpleNamespace(worker_id=worker_id))
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop(5)


def listeners(channel: str) -> list[int]:
    """The backends LISTENing on `channel` (their last statement is the LISTEN)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
                       [f'LISTEN "{channel}"'])
        return sorted(r[0] for r in cursor.fetchall())


def wait_for_listeners(channel: str, count: int, other_than: tuple[int, ...] = ()) -> list[int]:
    """Wait (up to 5 s) until `count` sessions listen on `channel` (none of `other_than`), then give the
    dispatchers a moment to finish the pass their subscription woke: they are idle when this returns."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = [p for p in listeners(channel) if p not in other_than]
        if len(pids) >= count:
            break
        time.sleep(0.05)
    time.sleep(0.5)
    return [p for p in listeners(channel) if p not in other_than]


def wait_completed(execution_ids: list[str], within: float, sample=None) -> list[str]:
    """The ids that completed within `within` seconds, calling `sample()` every 10 ms meanwhile."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if sample is not None:
            sample()
        done = list(Execution.objects.filter(pk__in=execution_ids, status="completed").values_list("pk", flat=True))
        if len(done) == len(execution_ids):
            return sorted(done)
        time.sleep(0.01)
    return sorted(Execution.objects.filter(pk__in=execution_ids, status="completed").values_list("pk", flat=True))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the dispatcher's threads have their own sessions
def test_an_idle_dispatcher_starts_an_entry_enqueued_after_it_went_idle(queue, channel, services):
    declare_queue(queue, concurrency=2)
    services("listen-one")
    wait_for_listeners(channel, 1)  # and idle: its first pass found nothing
    eid = enqueue("queues.test.double", {"n": 21}, queue=queue).execution_id
    assert wait_completed([eid], BOUND) == [eid]  # polling alone would start it 30 s after the dispatcher's last pass
    assert Execution.objects.get(pk=eid).result == 42


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_notification_wakes_every_dispatcher_and_the_cap_still_holds(queue, channel, services):
    declare_queue(queue, concurrency=1)
    first, second = services("listen-a"), services("listen-b")
    assert len(wait_for_listeners(channel, 2)) == 2
    passes = (first.passes, second.passes)
    eids = [enqueue("queues.test.nap", {"seconds": 0.5}, queue=queue).execution_id for _ in range(2)]
    running: list[int] = []

    def sample() -> None:
        running.append(Execution.objects.filter(pk__in=eids, status="running").count())

    assert wait_completed(eids, 2 * BOUND, sample) == sorted(eids)
    assert first.passes > passes[0] and second.passes > passes[1]  # both were woken, neither polled
    assert max(running) == 1  # never both at once: the cap of 1 held across the two dispatchers
    assert first.claimed + second.claimed == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_terminated_listener_reconnects_and_later_enqueues_still_wake_it(queue, channel, services):
    declare_queue(queue, concurrency=2)
    services("listen-term")
    [old] = wait_for_listeners(channel, 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [old])
    new = wait_for_listeners(channel, 1, other_than=(old,))
    assert len(new) == 1 and old not in listeners(channel)
    eid = enqueue("queues.test.double", {"n": 2}, queue=queue).execution_id
    assert wait_completed([eid], BOUND) == [eid]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stopped_dispatcher_leaves_no_session_of_its_runner_threads(queue, settings):
    """Each runner thread keeps its connection from one run to the next; stop() ends them: no session a
    runner ran a flow on is still connected once the service has stopped (only the test's own and what
    other parts of this process hold, the lease keeper's say, remain)."""
    settings.LOOM_QUEUE_THREADS = 2
    settings.LOOM_QUEUE_POLL = 0.05
    declare_queue(queue, concurrency=2)
    service = QueueService()
    service.start(SimpleNamespace(worker_id="sessions"))
    try:
        eids = [enqueue("queues.test.session", {}, queue=queue).execution_id for _ in range(4)]
        assert wait_completed(eids, 2 * BOUND) == sorted(eids)
    finally:
        service.stop(5)
    ran_on = set(Execution.objects.filter(pk__in=eids).values_list("result", flat=True))
    # A runner still finishing its last run's bookkeeping when stop() came closes its session as it ends,
    # and a closed session's backend leaves pg_stat_activity a moment after: wait for that, boundedly.
    deadline = time.monotonic() + BOUND
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] not in ran_on
        while True:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid = ANY(%s)",
                           [sorted(ran_on)])
            left = cursor.fetchall()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert left == []


@pytest.mark.django_db
def test_next_due_is_the_time_to_the_earliest_deferred_entry_of_known_flows(queue):
    store = store_for()
    flows = sorted(registry.registered())
    declare_queue(queue, concurrency=1)
    assert store.next_due(flows) is None
    enqueue("queues.test.double", {"n": 1}, queue=queue)  # due now: not a deferred entry
    assert store.next_due(flows) is None
    enqueue("queues.test.double", {"n": 2}, queue=queue, run_after=datetime.now(UTC) + timedelta(seconds=60))
    enqueue("queues.test.double", {"n": 3}, queue=queue, run_after=datetime.now(UTC) + timedelta(hours=2))
    assert 50 < store.next_due(flows) <= 61  # PostgreSQL: now() is the test transaction's start
    assert store.next_due(["some.other.flow"]) is None
