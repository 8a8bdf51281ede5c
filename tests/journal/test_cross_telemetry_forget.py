"""Across telemetry (journal/telemetry.py, issue 29) and forget: a subject's executions run through the API and
a queue (one completes, one fails quoting its marked value, one waits in a queue partitioned by the subject's
id), then the subject is forgotten. The metrics page (`GET /api/metrics`, the same exposition loom_worker's
port serves) then holds no subject id, no input value and no execution id — its labels are flows, queues,
consumers, routes and statuses — and its counts still agree with the database. Both backends."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from journal.models import Execution
from journal.privacy import forget, keys
from queues import enqueue, run_due
from tests.fixtures import privacy_fixtures as fx
from tests.journal.test_telemetry import (  # noqa: F401  (the fixtures)
    TOKEN,
    api_start,
    metrics,
    pytestmark,
    spans,
    stop_the_process_lease_keeper,
)

SUBJECT = "subj-tele-4431"
EMAIL = "tele.forgotten.4431@example.org"


def test_the_metrics_page_after_a_forget_holds_no_subject_id_no_input_and_still_counts_right(client, spans,  # noqa: F811
                                                                                             settings, tmp_path):
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    try:
        body = {"customer_id": SUBJECT, "email": EMAIL}
        for name, eid in (("test.privacy.signup", f"{SUBJECT}-ok"), ("test.privacy.fails", f"{SUBJECT}-bad")):
            response = api_start(client, name, {"input": body, "execution_id": eid})
            assert response.status_code == 202, response.content
        assert sorted(run_due()) == ["completed", "failed"]
        enqueue("test.privacy.signup", body, execution_id=f"{SUBJECT}-later", partition_key=SUBJECT,
                run_after=timezone.now() + timedelta(hours=1))  # waits: not due for an hour
        before = metrics(client)
        forget(SUBJECT, by="dpo")
        page = client.get("/api/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()
        after = metrics(client)
    finally:
        keys.cache.clear()
    assert "test.privacy.fails" in page and "loom_queue_depth" in page
    for personal in (SUBJECT, EMAIL, "tele.forgotten", "subj-tele"):
        assert personal not in page, personal
    settled = [key for key in after if key[0] == "loom_executions_settled_total"]
    assert settled and {key: after[key] for key in settled} == {key: before[key] for key in settled}
    for status in ("completed", "failed", "queued"):
        assert after[("loom_executions", (("alias", "default"), ("flow", "test.privacy.signup" if status != "failed"
                                                                  else "test.privacy.fails"), ("status", status)))] \
            == Execution.objects.filter(status=status, flow__startswith="test.privacy.").count() >= 1
