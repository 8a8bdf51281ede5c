"""The queue page in the admin (issue 24, "pending work in the admin"), through the test client on either
database: each queue's pending and started entries (who claimed each, since when, attempts, partition,
priority), filtered by queue and state and linked to their executions; cancel (a confirmation page, then
each row's outcome as it happened) and reprioritise (a priority -100..100 on pending entries, the others
named), each behind its own permission; the executions list's "queued" status choice. The clicks are in
tests/queues/test_queue_entries_browser.py."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from journal.envelopes import Envelope
from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution
from queues import declare_queue, enqueue
from queues.declarations import forget
from queues.models import QueueEntry
from queues.service import run_claimed
from queues.store import store_for
from tests.fixtures import queue_flows  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db

ENTRIES = "/admin/queues/queueentry/"
FLOW = "queues.test.double"


@pytest.fixture(autouse=True)
def no_leases():
    installed = own.get_ownership()
    own.set_ownership(None)  # runs here take no lease (no keeper thread in these tests)
    yield
    own.set_ownership(installed)


@pytest.fixture
def queue():
    name = f"adm-{uuid.uuid4().hex[:6]}"
    declare_queue(name, concurrency=5)
    yield name
    forget(name)


def staff(client, *codenames: str) -> User:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return user


@pytest.fixture
def operator(client):
    staff(client, "view_queueentry", "view_queue", "cancel_queueentry", "reprioritise_queueentry",
          "view_execution")
    return client


def claim(queue: str, owner: str = "worker-7", limit: int = 1):
    return store_for().dequeue(queue, owner, limit, [FLOW], 3600.0)


def header(eid: str, status: str) -> None:
    """The execution's header in `status`, its stream opened: made here where an entry has no header until a
    worker begins it, updated where the enqueue wrote one already (status queued, issue 24's one start path)."""
    if not Event.objects.filter(stream_id=eid).exists():
        Event.objects.open_stream(eid, Envelope("EXECUTION_STARTED", {"flow": FLOW, "input": {"n": 1}}))
    Execution.objects.update_or_create(id=eid, defaults={"flow": FLOW, "status": status})


def never_ran(eids: list[str]) -> bool:
    """No step of these executions ran: no header, or a cancelled one with no step recorded."""
    return (not Execution.objects.filter(pk__in=eids).exclude(status="cancelled").exists()
            and not Event.objects.filter(stream_id__in=eids, type="STEP_STARTED").exists())


def four_entries(queue: str) -> dict[str, str]:
    """pending (p), claimed not begun (c), begun and running (r), begun and completed (d: its entry done, as the
    next dequeue found its execution settled): their ids."""
    ids = {k: f"{queue}-{k}" for k in "rdcp"}
    for key in "rdcp":
        enqueue(FLOW, {"n": 1}, queue=queue, execution_id=ids[key], partition_key=f"part-{key}",
                priority={"r": 30, "d": 20, "c": 10, "p": 0}[key])
    (running,) = claim(queue)
    assert store_for().begin(running.execution_id, running.worker, running.attempts)
    header(ids["r"], "running")  # its run is going on, on the worker
    (done,) = claim(queue)
    assert run_claimed(done) == "completed"
    (claimed,) = claim(queue)
    assert claimed.execution_id == ids["c"]
    return ids


def post_action(client, action: str, entries: list[QueueEntry], **extra):
    data = {"action": action, "_selected_action": [str(e.pk) for e in entries], **extra}
    return client.post(ENTRIES, data, follow=True)


def test_the_queue_page_lists_its_pending_and_started_entries_with_who_since_when_and_links(operator, queue):
    ids = four_entries(queue)
    page = operator.get(f"{ENTRIES}?queue={queue}&state=live").content.decode()
    for key in "rcp":
        assert ids[key] in page and reverse("admin:journal_execution_change", args=[ids[key]]) in page
    assert ids["d"] not in page and ids["d"] in operator.get(f"{ENTRIES}?queue={queue}&state=done").content.decode()
    assert "worker-7" in page and "part-c" in page and "30" in page
    pending = operator.get(f"{ENTRIES}?queue={queue}&state=pending").content.decode()
    assert ids["p"] in pending and ids["c"] not in pending
    assert ids["p"] not in operator.get(f"{ENTRIES}?queue=other-queue").content.decode()
    listing = operator.get("/admin/queues/queue/").content.decode()
    assert f"?queue={queue}&amp;state=live" in listing and "queued executions" in listing
    assert f"queue={queue}&amp;status__exact=queued" in listing
    # The execution's page says which queue it came from, with a link back to the queue page.
    panel = operator.get(reverse("admin:journal_execution_change", args=[ids["d"]])).content.decode()
    assert f"queue <a href=\"/admin/queues/queueentry/?queue={queue}&amp;state=live\">{queue}</a>" in panel


def test_cancel_shows_its_plan_first_then_says_what_it_did_per_row_and_the_cancelled_start_never_runs(operator,
                                                                                                     queue):
    ids = four_entries(queue)
    entries = list(QueueEntry.objects.filter(queue_id=queue))
    plan = post_action(operator, "cancel_entries", entries).content.decode()
    assert "will be cancelled: it never starts" in plan and "already running" in plan
    assert "already finished (entry done, execution completed)" in plan
    assert sorted(QueueEntry.objects.filter(queue_id=queue).values_list("state", flat=True)) == [
        "done", "pending", "started", "started"]
    done = post_action(operator, "cancel_entries", entries, post="yes").content.decode()
    state = dict(QueueEntry.objects.filter(queue_id=queue).values_list("execution_id", "state"))
    assert state[ids["p"]] == state[ids["c"]] == "cancelled"
    assert (state[ids["r"]], state[ids["d"]]) == ("started", "done")  # a begun run is not the queue's to stop
    said = re.search(r'class="success">Cancelled, they never start: (.*?)</li>', done).group(1)
    assert [part.split(" (")[0] for part in said.split(", ")] == [ids["c"], ids["p"]]
    assert ("Not cancelled, already running — cancel the execution instead: <a href=\""
            f"{reverse('admin:journal_execution_change', args=[ids['r']])}\">{ids['r']}</a>") in done
    assert f"Not cancelled, already finished: {ids['d']} (entry done, execution completed)<" in done
    assert Execution.objects.get(pk=ids["r"]).status == "running"  # untouched: its own Cancel button does that
    # A dispatcher pass: nothing of the queue is claimed again, the cancelled starts never run.
    assert claim(queue, limit=10) == []
    assert never_ran([ids["p"], ids["c"]])


def test_cancel_of_an_entry_whose_execution_is_queued_cancels_the_execution_too(operator, queue):
    """An accepted start with its header (status "queued", issue 24) is cancelled as an execution: its
    header says cancelled, and its entry never begins."""
    enqueue(FLOW, {"n": 2}, queue=queue, execution_id=f"{queue}-h")
    header(f"{queue}-h", "queued")
    done = post_action(operator, "cancel_entries", list(QueueEntry.objects.filter(queue_id=queue)), post="yes")
    assert f"Cancelled, they never start: {queue}-h (and its queued execution)<" in done.content.decode()
    assert Execution.objects.get(pk=f"{queue}-h").status == "cancelled"
    assert QueueEntry.objects.get(execution_id=f"{queue}-h").state == "cancelled"
    assert claim(queue, limit=10) == []


@pytest.mark.parametrize("typed", ["101", "-101", "abc", "", "1.5"])
def test_reprioritise_refuses_a_bad_priority_on_its_form_and_changes_nothing(operator, queue, typed):
    enqueue(FLOW, {"n": 1}, queue=queue, execution_id=f"{queue}-x", priority=5)
    entries = list(QueueEntry.objects.filter(queue_id=queue))
    page = post_action(operator, "reprioritise_entries", entries, post="yes", priority=typed).content.decode()
    assert "the priority must be" in page and "nothing was changed" in page
    assert QueueEntry.objects.get(execution_id=f"{queue}-x").priority == 5


def test_reprioritise_sets_the_priority_of_pending_entries_names_the_others_and_changes_the_start_order(operator,
                                                                                                       queue):
    ids = four_entries(queue)
    enqueue(FLOW, {"n": 1}, queue=queue, execution_id=f"{queue}-q")  # pending, priority 0, after p
    entries = list(QueueEntry.objects.filter(queue_id=queue))
    form = post_action(operator, "reprioritise_entries", entries).content.decode()
    assert 'name="priority"' in form and "nothing: not pending (started)" in form
    chosen = [e for e in entries if e.execution_id in (f"{queue}-q", ids["c"], ids["r"])]
    done = post_action(operator, "reprioritise_entries", chosen, post="yes", priority="100").content.decode()
    assert f"Priority 100 set on: {queue}-q<" in done
    assert f"Priority unchanged, not pending (only a pending entry's start order can change): {ids['r']} (started), " \
           f"{ids['c']} (started)<" in done.replace("&#x27;", "'")
    priority = dict(QueueEntry.objects.filter(queue_id=queue).values_list("execution_id", "priority"))
    assert (priority[f"{queue}-q"], priority[ids["p"]], priority[ids["c"]], priority[ids["r"]]) == (100, 0, 10, 30)
    (first,) = claim(queue)
    assert first.execution_id == f"{queue}-q"  # it now starts before p, which was queued before it


@pytest.mark.parametrize(("perms", "shown"), [
    (("view_queueentry",), set()),
    (("view_queueentry", "cancel_queueentry"), {"cancel_entries"}),
    (("view_queueentry", "reprioritise_queueentry"), {"reprioritise_entries"}),
    (("view_queueentry", "cancel_queueentry", "reprioritise_queueentry"), {"cancel_entries", "reprioritise_entries"}),
], ids=["view-only", "cancel", "reprioritise", "both"])
def test_each_action_needs_its_own_permission_and_a_refused_one_does_nothing(client, queue, perms, shown):
    enqueue(FLOW, {"n": 1}, queue=queue, execution_id=f"{queue}-v", priority=5)
    staff(client, *perms)
    page = client.get(f"{ENTRIES}?queue={queue}").content.decode()
    assert f"{queue}-v" in page
    offered = {a for a in ("cancel_entries", "reprioritise_entries") if f'value="{a}"' in page}
    assert offered == shown
    entry = QueueEntry.objects.get(execution_id=f"{queue}-v")
    for action in ("cancel_entries", "reprioritise_entries"):
        post_action(client, action, [entry], post="yes", priority="-7")
    entry.refresh_from_db()
    assert entry.state == ("cancelled" if "cancel_entries" in shown else "pending")
    assert entry.priority == (-7 if "reprioritise_entries" in shown and "cancel_entries" not in shown else 5)
    assert client.post(f"{ENTRIES}{entry.pk}/change/", {}).status_code == 403  # never edited by hand


def test_the_entries_list_answers_a_nul_in_a_filter_with_the_admins_redirect(operator, settings):
    """Without loomsite's HostileQueryMiddleware (a host project's admin), as every Loom list page."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != "loomsite.middleware.HostileQueryMiddleware"]
    response = operator.get(f"{ENTRIES}?queue=a%00b")
    assert response.status_code == 302 and response["Location"] == f"{ENTRIES}?e=1"


def test_the_executions_list_offers_queued_and_filters_by_it(admin_client, queue):
    start(FLOW, {"n": 1}, execution_id=f"{queue}-ran")
    header(f"{queue}-w", "queued")
    listing = admin_client.get("/admin/journal/execution/").content.decode()
    assert "?status__exact=queued" in listing and ">Queued<" in listing
    queued = admin_client.get("/admin/journal/execution/?status__exact=queued").content.decode()
    assert f"{queue}-w" in queued and f"{queue}-ran" not in queued


@hyp_settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(typed=st.one_of(st.integers(-300, 300).map(str), st.sampled_from(["1_0", "\u0663", " 7 ", "+5", "0x10"]),
                       st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)))
def test_any_typed_priority_is_set_when_it_is_a_whole_number_in_range_and_else_refused_with_nothing_changed(
        operator, queue, typed):
    """Whatever is typed: a whole number -100..100 is set on the pending entry; anything else is refused on the
    form with the reason, and the entry keeps the priority it had."""
    if not QueueEntry.objects.filter(execution_id=f"{queue}-any").exists():
        enqueue(FLOW, {"n": 1}, queue=queue, execution_id=f"{queue}-any")
    entry = QueueEntry.objects.get(execution_id=f"{queue}-any")
    before = entry.priority
    page = post_action(operator, "reprioritise_entries", [entry], post="yes", priority=typed).content.decode()
    entry.refresh_from_db()
    wanted = int(typed.strip()) if re.fullmatch(r"[+-]?[0-9]{1,12}", typed.strip()) else None
    if wanted is not None and -100 <= wanted <= 100:
        assert entry.priority == wanted and f"Priority {wanted} set on" in page
    else:
        assert entry.priority == before and "the priority must be" in page and "nothing was changed" in page
