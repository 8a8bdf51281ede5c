"""Child processes of tests/journal/test_retention_shards.py: the aggregate admin's stream list, restore's
committed-batch check and `loom archive list` over shards, each scenario in a Django process configured for its
shards (two PostgreSQL servers, or two SQLite files; a third that does not answer), printing one JSON line of facts.

    python -m tests.journal.retention_shard_scenarios <scenario> [json argument]
"""

from __future__ import annotations

import re
import threading
from datetime import timedelta

from tests.fixtures import shard_scenarios
from tests.journal.compaction_scenarios import _loom

ROW = re.compile(r'<td><a href="([^"]+)">([^<]*)</a></td>\s*<td><code>([^<]*)</code></td>.*?'
                 r'class="field-shard">([^<]*)<', re.S)


def _declare():
    """The state of the list scenarios, its own (the list shows every stream of the state)."""
    from tests.journal import aggregate_states

    return aggregate_states.counter("ListTally")


def _ids_on(aliases: list[str], prefixes: tuple[str, ...], per_shard: int) -> dict[str, list[str]]:
    """Aggregate ids of ListTally whose streams fall on each alias, `per_shard` of each prefix there."""
    from journal import shards

    want: dict[str, list[str]] = {alias: [] for alias in aliases}
    for prefix in prefixes:
        placed = dict.fromkeys(aliases, 0)
        i = 0
        while any(n < per_shard for n in placed.values()):
            candidate = f"{prefix}{i}"
            alias = shards.shard_for(f"ListTally-{candidate}")
            if alias in placed and placed[alias] < per_shard:
                want[alias].append(candidate)
                placed[alias] += 1
            i += 1
    return want


def _client(run: str):
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username=f"{run}-admin", is_staff=True, is_superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _page(client, url: str, **params) -> dict:
    """One list page: its rows (link, id, stream, shard), the count it says, the shards it names as unreadable."""
    answer = client.get(url, params)
    html = answer.content.decode()
    count = re.search(r"\((\d+) streams\)", html)
    return {"status": answer.status_code, "rows": ROW.findall(html), "count": int(count.group(1)) if count else None,
            "down": re.findall(r"Shard “([^”]+)” could not be read", html)}


def aggregate_list(arg) -> dict:
    """Streams of one state on each shard (upper- and lower-case ids: a byte-wise merge puts "B" before "a", a
    linguistic collation after): the list pages through all of them in one order, each row naming its shard; a
    search finds each shard's matches; a shard1 row's link opens that stream (read on shard1), in a client and by
    a click in headless Chromium."""
    from journal import shards
    from journal.aggregates import do
    from journal.aggregates.admin import STREAMS_PER_PAGE

    st, bump = _declare()
    aliases = shards.shards()
    run = arg["run"]
    ids = _ids_on(aliases, (f"B{run}-", f"a{run}-", f"q{run}-"), 12)
    for names in ids.values():
        for n, id in enumerate(names):
            for _ in range(1 + n % 3):
                do(bump, id, {"by": 1})
    client = _client(run)
    url = f"/admin/journal/aggregatestream/{st.name}/"
    pages = [_page(client, url)]
    while len(pages) < 10 and len(pages[-1]["rows"]) == STREAMS_PER_PAGE:
        pages.append(_page(client, url, page=len(pages) + 1))
    listed = [row for page in pages for row in page["rows"]]
    search = _page(client, url, q=f"q{run}-")
    second = aliases[1]
    on_second = next(row for row in listed if row[3] == second)
    detail = client.get(on_second[0])
    return {
        "aliases": aliases, "per_page": STREAMS_PER_PAGE, "statuses": [p["status"] for p in pages],
        "counts": [p["count"] for p in pages], "pages": [len(p["rows"]) for p in pages],
        "listed": [[row[1], row[2], row[3]] for row in listed],
        "expected": sorted([id, st.stream(id), alias] for alias, names in ids.items() for id in names),
        "expected_order": sorted(st.stream(id) for names in ids.values() for id in names),
        "search": sorted([row[1], row[3]] for row in search["rows"]),
        "search_expected": sorted([id, alias] for alias, names in ids.items() for id in names
                                  if id.startswith(f"q{run}-")),
        "search_count": search["count"], "down": [p["down"] for p in pages],
        "detail": [detail.status_code, f"<code>{on_second[2]}</code>" in detail.content.decode(),
                   "at version" in detail.content.decode()],
        "clicked": click_into(client, url, on_second[1]) if arg.get("browser") else None,
        "clicked_id": on_second[1], "clicked_stream": on_second[2],
    }


def click_into(client, url: str, id: str) -> dict | None:
    """In headless Chromium (no JavaScript) against a live server of this process (its shards): open the list,
    click the link of `id` and read the page it loads (None without a browser)."""
    import os
    from pathlib import Path

    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    chromium = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not chromium.exists():
        return None

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
    server.set_app(WSGIHandler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop in this thread; the ORM beside it
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(chromium), args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            context = browser.new_context(java_script_enabled=False)
            context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base}])
            page = context.new_page()
            page.goto(f"{base}{url}")
            rows = page.locator("#content-main table tbody tr").count()
            with page.expect_navigation():  # the click returns before the page it asked for has loaded
                page.get_by_role("link", name=id, exact=True).click()
            found = {"rows_on_list": rows, "url": page.url, "heading": page.inner_text("#content-main h2 >> nth=0"),
                     "events": page.locator("#content-main table tbody tr").count(),
                     "state": page.inner_text("#current-state") if page.locator("#current-state").count() else ""}
            browser.close()
            return found
    finally:
        server.shutdown()
        server.server_close()


def _archiving(where: str):
    """Settings of the archive scenarios: every flow archived to a folder of the test's, removed after 30 days."""
    from django.conf import settings
    from django.test import override_settings

    return override_settings(
        STORAGES={**settings.STORAGES, "archives": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                                                    "OPTIONS": {"location": where}}},
        LOOM_ARCHIVE_STORAGE="archives", LOOM_ARCHIVE_FLOWS=["*"], LOOM_RETENTION_DAYS=30)


def _settled_long_ago(run: str, alias: str) -> str:
    """A one-step execution on `alias`, finished 40 days ago: its id."""
    from django.utils import timezone

    from journal import shards
    from journal.flows import start
    from journal.models import Execution

    eid = next(e for e in shard_scenarios.ids_on_each_shard(run, 1) if shards.shard_for(e) == alias)
    assert start("shards.one", 1, execution_id=eid).status == "completed"
    Execution.objects.using(alias).filter(pk=eid).update(finished_at=timezone.now() - timedelta(days=40))
    return eid


def _rows(eid: str) -> dict[str, list[int]]:
    """Per shard: the execution's header and events there."""
    from journal import shards
    from journal.models import Event, Execution

    return {alias: [Execution.objects.using(alias).filter(pk=eid).count(),
                    Event.objects.using(alias).filter(stream_id=eid).count()] for alias in shards.shards()}


def restore_checks_its_shard(arg) -> dict:
    """An execution on shard1 removed with an archive; its batch's journal_removal row taken away (as if the batch
    never committed) and one naming the object put on default instead: `archive list` marks it not committed and
    restore refuses it, nothing written. The row back on shard1: listed as committed; restore with --database
    default refused (its rows belong on shard1); restore without it puts the execution back on shard1, reading as
    it did."""
    from django.forms.models import model_to_dict

    from journal import retention, shards
    from journal.flows import describe
    from journal.models import Removal

    second = shards.shards()[1]
    out: dict = {}
    with _archiving(arg["archives"]):
        eid = _settled_long_ago(f"{arg['run']}-r", second)
        seen = describe(eid)
        out["removed"] = retention.run(second)["executions"]
        out["after_removal"] = _rows(eid)
        batch = next(r for r in Removal.objects.using(second).all() if eid in r.ids)
        name = batch.archive
        kept = model_to_dict(batch)
        batch.delete()
        Removal.objects.using("default").create(**{**kept, "id": None})  # names the object, on the wrong shard
        out["list_uncommitted"] = _loom("archive", "list")[:2]
        out["refused"] = _loom("archive", "restore", name)[:2]
        out["after_refused"] = _rows(eid)
        Removal.objects.using("default").filter(archive=name).delete()
        Removal.objects.using(second).create(**kept)
        out["list_committed"] = _loom("archive", "list")[:2]
        out["elsewhere"] = _loom("archive", "restore", name, "--database", "default")[:2]
        out["after_elsewhere"] = _rows(eid)
        out["restored"] = _loom("archive", "restore", name)[:2]
        out["after_restore"] = _rows(eid)
        out["reads_as_it_did"] = describe(eid) == seen
    out.update({"name": name, "eid": eid, "second": second})
    return out


def shard_down(arg) -> dict:
    """Three shards, the third's server not answering: the aggregate list shows default's and shard1's streams and
    names shard2; `archive list` marks the reached shards' archives and names shard2 (exit 4)."""
    from django.utils import timezone

    from journal import retention, shards
    from journal.aggregates import do

    st, bump = _declare()
    up, down = shards.shards()[:2], shards.shards()[2]
    ids = _ids_on(up, (f"d{arg['run']}-",), 1)
    for names in ids.values():
        do(bump, names[0], {"by": 1})
    client = _client(arg["run"])
    page = _page(client, f"/admin/journal/aggregatestream/{st.name}/", q=f"d{arg['run']}-")
    out: dict = {"down": down, "page": [page["status"], page["down"], sorted([r[1], r[3]] for r in page["rows"]),
                                        page["count"]],
                 "expected": sorted([names[0], alias] for alias, names in ids.items())}
    with _archiving(arg["archives"]):
        eid = _settled_long_ago(f"{arg['run']}-a", up[1])
        out["removed"] = retention.run(up[1])["executions"]
        out["on_down"] = retention.write_archive(down, {"header": [], "event": []}, timezone.now())  # an old one
        out["list"] = _loom("archive", "list")
    out["eid"] = eid
    return out


def main() -> None:
    shard_scenarios.main(globals())


if __name__ == "__main__":
    threading.current_thread().name = "scenario"
    main()
