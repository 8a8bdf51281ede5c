"""The tables of reactions and projections: one subscription per (consumer, source stream), and
the correlation checkpoint of each consumer. The SQL that reads and writes them lives in
projections/store; the ORM is used only by the admin.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now


class Subscription(models.Model):
    """A consumer (reaction or projection) following one journal stream.

    `at` is the seq of the last event of `stream` the consumer has handled (-1: none). `tip` is
    the last seq correlation has seen there; `tip > at` means "has work", which is what the
    partial index `projections_sub_work` holds, so a claim never looks at caught-up streams.
    `lease` counts claims: the value a claimer got is its fence token for ack and block.
    """

    consumer = models.CharField(max_length=200)
    stream = models.CharField(max_length=200)
    source = models.CharField(max_length=200, blank=True, default="",
                              help_text="The consumer's source filter (stream prefix) when it subscribed.")
    lane = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    at = models.BigIntegerField(default=-1)
    tip = models.BigIntegerField(default=-1)
    lease = models.BigIntegerField(default=0)
    leased_by = models.CharField(max_length=200, null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    retries = models.IntegerField(default=0)
    blocked = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["consumer", "stream"], name="projections_sub_consumer_stream")]
        indexes = [
            # Only rows with pending work and not blocked: the claim's candidate set, whatever the
            # total number of subscriptions.
            models.Index(fields=["lane", "priority"], name="projections_sub_work",
                         condition=Q(tip__gt=F("at"), blocked=False)),
            models.Index(fields=["blocked"], name="projections_sub_blocked", condition=Q(blocked=True)),
        ]
        ordering = ["consumer", "stream"]
        # The admin's actions (see projections/admin.py): view and change do not imply them.
        permissions = [
            ("unblock_subscription", "Can unblock a blocked subscription"),
            ("replay_subscription", "Can reset a consumer and replay it from the start (wipes its read model)"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer} <- {self.stream} @{self.at}/{self.tip}"

    @property
    def lag(self) -> int:
        return max(0, self.tip - self.at)


class Checkpoint(models.Model):
    """How far correlation has scanned the log for one consumer (global event ids).

    `position`: every id up to it is settled and scanned. `horizon_id`/`horizon_at`: the largest id
    seen by a scan at `horizon_at`; once that is older than LOOM_CORRELATE_HORIZON_SECONDS (and, on
    PostgreSQL, every transaction running when it had aged has ended: `horizon_xmax`), ids up to
    `horizon_id` are settled even if some are missing (rolled back), see docs/projections.md.
    """

    consumer = models.CharField(max_length=200, primary_key=True)
    position = models.BigIntegerField(default=0)
    horizon_id = models.BigIntegerField(default=0)
    horizon_at = models.DateTimeField(null=True, blank=True)
    horizon_xmax = models.BigIntegerField(
        null=True, blank=True,
        help_text="PostgreSQL: xmax of a snapshot taken once the horizon had aged; the gap settles only"
                  " when no transaction older than it is running.")
    updated_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.consumer} @{self.position}"
