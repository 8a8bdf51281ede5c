"""Result pages, exports, comparison rules and the bench_check gate, over recorded runs.

Runs are recorded through `benchmarks.recording.Recorder`, the path every bench command uses, with
figures chosen by the test, so what the pages and the gate must say is known exactly.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from benchmarks import charts
from benchmarks.compare import GATED, Cell, best_p50, classify, compare, gate, is_gated, read_baseline
from benchmarks.models import BenchRun
from benchmarks.recording import Recorder

ROOT = Path(__file__).resolve().parents[2]
PER_EVENT_1 = "append/per-event[concurrency=1,events_per_call=1,payload_bytes=256]"


def record_run(command: str = "bench_throughput", *, slow: float = 1.0, extra_section: bool = False,
               spread: float = 0.02) -> BenchRun:
    """A run with an `append` concurrency sweep; `slow` multiplies every latency (and divides throughput).
    Each cell has three repeats spread by +-`spread` around its median (`runs`, `p50_runs`)."""
    with Recorder(command, {"ops": 100}) as rec:
        for conc in (1, 8):
            for scenario, per_call, p50 in (("per-event", 1, 0.2), ("batch", 16, 0.5), ("ceiling", 1, 0.05)):
                tput = 4000 * conc / slow
                rec.add("append", scenario, {"concurrency": conc, "payload_bytes": 256, "events_per_call": per_call},
                        throughput=tput, unit="events/s", count=100 * conc,
                        p50_ms=p50 * slow, p95_ms=p50 * 3 * slow, p99_ms=p50 * 10 * slow, max_ms=p50 * 40 * slow,
                        verified_rows=100 * conc, runs=[tput * (1 - spread), tput, tput * (1 + spread)],
                        p50_runs=[p50 * slow * (1 - spread), p50 * slow, p50 * slow * (1 + spread)])
        if extra_section:
            rec.add("renew", "renew_many", {"leases": 500}, throughput=900.0, unit="leases/s", p50_ms=1.5,
                    p95_ms=2.0, p99_ms=3.0, max_ms=4.0, count=500)
    return rec.run


@pytest.fixture
def public(settings):
    """The explicit opt-in: pages open to anyone (they are staff-only by default)."""
    settings.LOOM_RESULTS_PUBLIC = True


@pytest.mark.django_db
def test_run_list_shows_runs_newest_first_with_their_environment(client, public):
    """The list names each run's commit, dirty flag, database and machine, the newest first."""
    old, new = record_run(), record_run("bench_lease")
    BenchRun.objects.filter(pk=new.pk).update(git_commit="abcdef1234567890", git_dirty=True, machine="box-7")
    response = client.get(reverse("benchmarks:run_list"))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.index(f'href="/bench/runs/{new.pk}/"') < html.index(f'href="/bench/runs/{old.pk}/"')
    assert "abcdef1234" in html and "dirty" in html and "box-7" in html
    assert old.db_version in html
    assert "<script" not in html


@pytest.mark.django_db
def test_run_list_filters_by_command(client, public):
    """?command= keeps only that command's runs."""
    kept, dropped = record_run("bench_lease"), record_run("bench_throughput")
    html = client.get(reverse("benchmarks:run_list"), {"command": "bench_lease"}).content.decode()
    assert f"/bench/runs/{kept.pk}/" in html
    assert f"/bench/runs/{dropped.pk}/" not in html


@pytest.mark.django_db
def test_run_page_has_a_table_per_section_and_svg_charts(client, public):
    """Every cell is a table row; each section has throughput and latency charts as inline SVG."""
    run = record_run(extra_section=True)
    response = client.get(reverse("benchmarks:run_detail", args=[run.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert html.count("<table") == 2  # append, renew
    assert html.count("<tbody>") == 2
    assert html.count('<tr>') >= run.results.count()
    assert "append: throughput vs concurrency" in html
    assert "append: latency p50 (solid) and p99 (dashed) vs concurrency" in html
    assert "renew: throughput" in html and "renew: latency percentiles" in html
    assert html.count("<svg") == 4
    assert "gated" in html  # the single-writer cells bench_check watches are marked
    assert "<script" not in html


@pytest.mark.django_db
def test_compare_page_flags_a_regression_with_its_ratio(client, public):
    """A run 2x slower than its base shows ratios of 2.00x and every comparable cell as a regression."""
    base, new = record_run(), record_run(slow=2.0)
    response = client.get(reverse("benchmarks:compare", args=[base.pk, new.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert "2.00\u00d7" in html and "0.50\u00d7" in html
    assert html.count('<tr class="regression">') == 6
    assert "6 regressions" in html


@pytest.mark.django_db
def test_compare_page_threshold_and_cells_only_in_one_run(client, public):
    """A higher threshold turns the 2x cells into 'same'; cells of one run only are listed as such."""
    base, new = record_run(), record_run(slow=2.0, extra_section=True)
    html = client.get(reverse("benchmarks:compare", args=[base.pk, new.pk]), {"threshold": "2.5"}).content.decode()
    assert '<tr class="regression">' not in html
    assert html.count('<tr class="same">') == 6
    assert html.count('<tr class="added">') == 1 and "only in new" in html


@pytest.mark.django_db
def test_compare_form_redirects_to_the_linkable_address(client, public):
    """The list's compare form (GET ?base=&new=) lands on /bench/compare/<base>/<new>/."""
    base, new = record_run(), record_run()
    response = client.get(reverse("benchmarks:compare_form"), {"base": base.pk, "new": new.pk})
    assert response.status_code == 302
    assert response["Location"] == reverse("benchmarks:compare", args=[base.pk, new.pk])
    assert client.get(reverse("benchmarks:compare_form")).status_code == 404


@pytest.mark.django_db
def test_run_csv_has_one_row_per_cell(client, public):
    """The CSV export carries every cell with its params as JSON."""
    run = record_run(extra_section=True)
    response = client.get(reverse("benchmarks:run_csv", args=[run.pk]))
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == run.results.count() == 7
    first = rows[0]
    assert first["section"] == "append" and json.loads(first["params"])["concurrency"] == 1
    assert float(first["p50_ms"]) == pytest.approx(0.2)


@pytest.mark.django_db
def test_run_json_is_the_document_bench_commands_write(client, public):
    """The JSON export has the run's environment and every result."""
    run = record_run()
    data = client.get(reverse("benchmarks:run_json", args=[run.pk])).json()
    assert data["run"]["id"] == run.pk and data["run"]["db_vendor"] == run.db_vendor
    assert len(data["results"]) == 6
    assert {r["scenario"] for r in data["results"]} == {"per-event", "batch", "ceiling"}


@pytest.mark.django_db
def test_compare_csv_has_ratio_and_status_per_cell(client, public):
    """The comparison's CSV gives each cell's ratios and verdict."""
    base, new = record_run(), record_run(slow=2.0)
    response = client.get(reverse("benchmarks:compare_csv", args=[base.pk, new.pk]))
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 6
    assert {r["status"] for r in rows} == {"regression"}
    assert float(rows[0]["p50_ratio"]) == pytest.approx(2.0)


@pytest.mark.django_db
def test_pages_are_staff_only_unless_results_are_made_public(client, settings, django_user_model):
    """By default (LOOM_RESULTS_PUBLIC unset), anonymous and non-staff users are sent to the login page."""
    if hasattr(settings, "LOOM_RESULTS_PUBLIC"):
        del settings.LOOM_RESULTS_PUBLIC
    run = record_run()
    urls = [reverse("benchmarks:run_list"), reverse("benchmarks:run_detail", args=[run.pk]),
            reverse("benchmarks:run_csv", args=[run.pk]), reverse("benchmarks:run_json", args=[run.pk]),
            reverse("benchmarks:compare", args=[run.pk, run.pk])]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    client.force_login(django_user_model.objects.create_user("plain", password="x"))
    assert client.get(urls[0]).status_code == 302
    client.force_login(django_user_model.objects.create_user("staff", password="x", is_staff=True))
    assert all(client.get(url).status_code == 200 for url in urls)


@pytest.mark.django_db
def test_admin_lists_runs_and_shows_results_read_only(admin_client):
    """The admin lists runs with filters, shows a run's results inline and allows no add or edit."""
    run = record_run()
    changelist = admin_client.get(reverse("admin:benchmarks_benchrun_changelist"), {"db_vendor": run.db_vendor})
    assert changelist.status_code == 200 and f"{run.pk}" in changelist.content.decode()
    page = admin_client.get(reverse("admin:benchmarks_benchrun_change", args=[run.pk]))
    html = page.content.decode()
    assert page.status_code == 200 and "per-event" in html and "ceiling" in html
    assert 'name="_save"' not in html
    assert admin_client.get(reverse("admin:benchmarks_benchrun_add")).status_code == 403
    assert admin_client.get(reverse("admin:benchmarks_benchresult_changelist")).status_code == 200


# --- comparison and chart rules, without the database ------------------------------------------------


def test_classify_treats_slower_p50_or_lower_throughput_as_regression():
    """Worse p50 or worse throughput past the factor is a regression, even if the other improved."""
    assert classify(1.0, 1.6, 1.5) == "regression"
    assert classify(0.6, 1.0, 1.5) == "regression"
    assert classify(2.0, 1.6, 1.5) == "regression"
    assert classify(1.0, 0.5, 1.5) == "improvement"
    assert classify(1.2, 1.2, 1.5) == "same"
    assert classify(None, None, 1.5) == "same"


def test_compare_pairs_cells_by_section_scenario_and_params():
    """Cells with the same key pair up; a param change makes a different cell."""
    a = Cell("s", "x", {"c": 1}, throughput=100.0, p50_ms=1.0, throughput_runs=(99.0, 101.0))
    b = Cell("s", "x", {"c": 1}, throughput=50.0, p50_ms=3.0, throughput_runs=(49.0, 51.0))
    c = Cell("s", "x", {"c": 2}, throughput=50.0, p50_ms=3.0)
    rows = compare([a], [b, c])
    assert [(r.status, r.throughput_ratio, r.p50_ratio) for r in rows] == [
        ("regression", 0.5, 3.0), ("added", None, None)]
    assert compare([a, c], [b])[-1].status == "removed"


def test_gate_fails_past_the_factor_and_when_a_cell_is_missing():
    """p50 over 1.5x its baseline fails; exactly 1.5x passes; an unmeasured gated cell fails."""
    current = {"k1": Cell("a", "x", p50_ms=1.5), "k2": Cell("a", "y", p50_ms=1.51)}
    outcomes = {o.key: o.failed for o in gate({"k1": 1.0, "k2": 1.0, "k3": 1.0}, current, 1.5)}
    assert outcomes == {"k1": False, "k2": True, "k3": True}


def test_best_p50_keeps_the_lowest_median_per_cell():
    """Best of N runs: noise only slows a run, so the lowest p50 of each cell is kept."""
    runs = [[Cell("a", "x", {"c": 1}, p50_ms=2.0)], [Cell("a", "x", {"c": 1}, p50_ms=1.0)]]
    assert best_p50(runs)["a/x[c=1]"].p50_ms == 1.0


def test_gated_cells_are_single_writer():
    """Every gate rule pins concurrency to 1 (multi-writer cells are too noisy to gate)."""
    assert GATED and all(rule.params.get("concurrency") == 1 for rule in GATED)
    assert is_gated(Cell("append", "per-event", {"concurrency": 1, "payload_bytes": 256}))
    assert not is_gated(Cell("append", "per-event", {"concurrency": 8}))


def test_section_charts_sweep_a_numeric_param_and_escape_labels():
    """A swept numeric param gives line charts against it; labels from params are escaped."""
    cells = [Cell("fanout", "<b>k</b>", {"subscribers": n}, throughput=10.0 * (n + 1), unit="events/s",
                  p50_ms=1.0, p99_ms=5.0) for n in (0, 2, 4)]
    made = charts.section_charts("fanout", cells)
    assert [c.title for c in made] == ["fanout: throughput vs subscribers",
                                       "fanout: latency p50 (solid) and p99 (dashed) vs subscribers"]
    assert "<b>" not in made[0].svg and "&lt;b&gt;" in made[0].svg
    assert made[0].svg.count("<circle") == 3


# --- bench_check ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_bench_check_update_writes_the_gated_cells_then_passes(tmp_path):
    """--update writes only the gated cells for this database; checking the same run passes."""
    run = record_run()
    path = tmp_path / "perf-baseline.json"
    call_command("bench_check", "--baseline", str(path), "--update", stdout=io.StringIO())
    baseline = read_baseline(path, run.db_vendor)
    assert set(baseline.cells) == {PER_EVENT_1, "append/batch[concurrency=1,events_per_call=16,payload_bytes=256]"}
    assert baseline.cells[PER_EVENT_1] == pytest.approx(0.2)
    assert baseline.run_id == run.pk
    out = io.StringIO()
    call_command("bench_check", "--baseline", str(path), stdout=out)
    assert "2 gated cell(s) within 1.5x" in out.getvalue()


@pytest.mark.django_db
def test_bench_check_fails_with_exit_1_when_p50_is_over_1_5x(tmp_path):
    """A later run 1.6x slower fails the gate with return code 1 and names the cells."""
    record_run()
    path = tmp_path / "perf-baseline.json"
    call_command("bench_check", "--baseline", str(path), "--update", stdout=io.StringIO())
    record_run(slow=1.6)
    with pytest.raises(CommandError) as failure:
        call_command("bench_check", "--baseline", str(path), stdout=io.StringIO())
    assert failure.value.returncode == 1
    assert PER_EVENT_1 in str(failure.value)


@pytest.mark.django_db
def test_bench_check_against_a_run_id_and_best_of(tmp_path):
    """--baseline <run id> uses that run's gated cells; --best-of 2 forgives one slow repeat."""
    base = record_run()
    record_run(slow=1.2)
    record_run(slow=3.0)
    with pytest.raises(CommandError) as failure:
        call_command("bench_check", "--baseline", str(base.pk), stdout=io.StringIO())
    assert failure.value.returncode == 1
    call_command("bench_check", "--baseline", str(base.pk), "--best-of", "2", stdout=io.StringIO())


@pytest.mark.django_db
def test_bench_check_usage_errors_exit_2(tmp_path):
    """No run with gated cells, or no baseline file, is a usage error (2), not a regression."""
    with pytest.raises(CommandError) as no_run:
        call_command("bench_check", "--baseline", str(tmp_path / "x.json"), stdout=io.StringIO())
    assert no_run.value.returncode == 2
    record_run()
    with pytest.raises(CommandError) as no_file:
        call_command("bench_check", "--baseline", str(tmp_path / "missing.json"), stdout=io.StringIO())
    assert no_file.value.returncode == 2 and "does not exist" in str(no_file.value)


@pytest.mark.django_db(transaction=True)
def test_bench_check_process_exit_codes(tmp_path, child_env):
    """As CI runs it: the process exits 0 within the factor and 1 past it."""
    record_run()
    path = tmp_path / "perf-baseline.json"
    call_command("bench_check", "--baseline", str(path), "--update", stdout=io.StringIO())
    command = [sys.executable, "manage.py", "bench_check", "--baseline", str(path)]
    ok = subprocess.run(command, env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    record_run(slow=2.0)
    bad = subprocess.run(command, env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "FAIL" in bad.stdout
