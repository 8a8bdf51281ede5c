"""The result pages in a real browser: headless Chromium (Debian's package) driven by Playwright.

Install the browser with `scripts/ensure-chromium`; Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.db import connections

from benchmarks.recording import Recorder

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


def record(slow: float) -> int:
    with Recorder("bench_throughput", {"ops": 10}) as rec:
        for conc in (1, 4, 8):
            for scenario in ("per-event", "batch"):
                tput = 1000 * conc / slow  # three repeats 2 % apart: a 2x change is outside their spread
                rec.add("append", scenario, {"concurrency": conc}, throughput=tput, unit="events/s",
                        p50_ms=0.2 * slow, p95_ms=0.6 * slow, p99_ms=2.0 * slow, max_ms=5.0 * slow, count=10,
                        runs=[tput * 0.98, tput, tput * 1.02], p50_runs=[0.196 * slow, 0.2 * slow, 0.204 * slow])
    return rec.run.pk


def click_through(locator) -> None:
    """Click what loads a page (a link, a submit button: JavaScript is off) and return once that page is there.

    Playwright's click returns when the click is dispatched, not when the page it asked for has loaded: a
    `page.content()` read in between read an empty document (CI, stop 15), `wait_for_load_state()` answered
    for the page being left, and a locator could match that page (a form refused twice has an error note
    before the second answer comes).
    """
    with locator.page.expect_navigation():
        locator.click()


@pytest.fixture
def browser_page():
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright runs an event loop in this thread; Django's async-safety guard must allow the ORM
    # calls the live server and fixtures make beside it.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    # Django keeps a connection per context; Playwright's greenlets give the test body another one,
    # so the connection opened before it would never be closed and the test database could not be
    # dropped at the end of the session. Close it now.
    connections.close_all()
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
            page = browser.new_page(java_script_enabled=False)
            yield page
            browser.close()
            connections.close_all()  # the one the test body opened in Playwright's context
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.mark.django_db(transaction=True)
def test_list_run_and_compare_pages_render_tables_and_charts(live_server, browser_page, settings):
    """Without JavaScript, the list shows the runs, the run page its tables and SVG charts, the compare
    page its ratios with the regressions flagged, and the stylesheet is served."""
    settings.LOOM_RESULTS_PUBLIC = True
    base, new = record(1.0), record(2.0)
    page = browser_page

    page.goto(f"{live_server.url}/bench/")
    assert page.locator("table.runs tbody tr").count() == 2
    stylesheet = page.locator("link[rel=stylesheet]").get_attribute("href")
    assert page.request.get(f"{live_server.url}{stylesheet}").ok
    click_through(page.locator("button", has_text="Compare"))  # a plain GET form: works without JavaScript
    page.wait_for_url(f"**/bench/compare/{base}/{new}/")
    assert page.locator("tr.regression").count() == 6
    assert page.locator("td.ratio", has_text="2.00\u00d7").count() == 12  # p50 and p99 of each cell

    page.goto(f"{live_server.url}/bench/runs/{new}/")
    assert page.locator("table.cells tbody tr").count() == 6
    charts = page.locator("figure.chart svg")
    assert charts.count() == 2
    assert charts.first.locator("polyline").count() == 2  # per-event and batch
    assert charts.first.bounding_box()["height"] > 100  # drawn, not collapsed


PASSWORD = "a-long-passphrase-for-the-browser"


@pytest.mark.django_db(transaction=True)
def test_result_pages_send_visitors_to_the_login_and_staff_back_to_the_page(live_server, browser_page, settings,
                                                                             django_user_model):
    """By default (no LOOM_RESULTS_PUBLIC), /bench/runs/<id>/ redirects to the admin login; after logging
    in as staff through the form, the browser is sent back to the run's page; a wrong password is refused."""
    if hasattr(settings, "LOOM_RESULTS_PUBLIC"):
        del settings.LOOM_RESULTS_PUBLIC
    run = record(1.0)
    django_user_model.objects.create_user("ann", password=PASSWORD, is_staff=True)
    page = browser_page

    page.goto(f"{live_server.url}/bench/runs/{run}/")
    assert "/admin/login/" in page.url
    assert page.locator("table.cells").count() == 0

    page.fill("#id_username", "ann")
    page.fill("#id_password", "wrong password")
    click_through(page.locator("input[type=submit]"))
    assert "/admin/login/" in page.url and page.locator(".errornote").count() == 1

    page.fill("#id_username", "ann")
    page.fill("#id_password", PASSWORD)
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url(f"**/bench/runs/{run}/")
    assert page.locator("table.cells tbody tr").count() == 6
