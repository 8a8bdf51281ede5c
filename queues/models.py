"""The queue tables: declared queues with their caps (Queue) and queued starts (QueueEntry).

Rows are written by queues/store (named SQL per backend), never by the ORM's save(): the models exist
for the admin, the command line and reads. A queue's caps live in its row, so every worker process on
every host enforces the same caps (declarations in settings or code are upserted into the row).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

PENDING, STARTED, DONE, CANCELLED = "pending", "started", "done", "cancelled"
LIVE = (PENDING, STARTED)  # the states in which a dedup id is held


class Queue(models.Model):
    """A named queue and its caps, as the last process that declared it wrote them."""

    name = models.CharField(max_length=100, primary_key=True)
    concurrency = models.IntegerField(help_text="Most executions of the queue running at once, on all workers.")
    partition_concurrency = models.IntegerField(
        null=True, blank=True, help_text="Most running at once per partition key (empty: no per-partition cap).")
    rate_limit = models.IntegerField(null=True, blank=True,
                                     help_text="Most starts per rate_period seconds (empty: no rate limit).")
    rate_period = models.FloatField(null=True, blank=True, help_text="Seconds of the rate limit's sliding window.")
    updated_at = models.DateTimeField(db_default=Now())
    # An operator's pause (queues/pause.py): while set, no dispatcher on any host claims from the queue (the
    # dequeue reads it under the queue's row lock); enqueues are still accepted. Declarations never touch it.
    paused_at = models.DateTimeField(null=True, blank=True, help_text="Paused since (empty: not paused).")
    paused_by = models.CharField(max_length=200, blank=True, default="", db_default="",
                                 help_text="Who paused it, and from where (admin, CLI).")

    class Meta:
        ordering = ["name"]
        # What an operator may do to a queue in the admin and the CLI (queues/pause.py), besides viewing it.
        permissions = [("pause_queue", "Can pause and resume a queue's dispatch")]

    def __str__(self) -> str:
        return self.name


class QueueEntry(models.Model):
    """One queued start (its execution is written, status queued, in the same transaction) or a handed-over
    resume of an execution: one entry per execution; the execution's fence makes a second run a no-op."""

    STATES = [(PENDING, "pending"), (STARTED, "started"), (DONE, "done"), (CANCELLED, "cancelled")]

    id = models.BigAutoField(primary_key=True)
    # db_constraint: a queue row is never deleted while entries name it (PROTECT), and the FK keeps the
    # admin's links; the index is the partial ones below.
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, db_index=False, related_name="entries")
    execution_id = models.CharField(max_length=200, unique=True)
    flow = models.CharField(max_length=200)
    input = models.TextField(help_text="The input as the execution's header shows it (marked fields withheld: the "
                                       "runner reads the input from the journal); entries written before queued "
                                       "executions hold the whole input here.")
    meta = models.TextField(blank=True, default="", help_text="$meta of the start as JSON text, or empty.")
    partition_key = models.CharField(max_length=200, null=True, blank=True)
    priority = models.SmallIntegerField(default=0, help_text="-100..100; higher starts first.")
    dedup_id = models.CharField(max_length=200, null=True, blank=True)
    state = models.CharField(max_length=10, choices=STATES, default=PENDING)
    run_after = models.DateTimeField(help_text="Not started before this time.")
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True, help_text="When a worker last claimed it.")
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="", help_text="The worker that claimed it.")
    begun_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the claimer's runner began it (until then a cancel still stops it; review R4).")
    attempts = models.IntegerField(default=0, help_text="Claims (more than one: re-offered after a lost claim).")
    resume_fence = models.BigIntegerField(
        null=True, blank=True, help_text="A resume (hand-over): resume the execution from this fence token. Empty: "
                                         "a start (begin the queued execution).")
    resume_force = models.BooleanField(default=False, db_default=False,
                                       help_text="The resume takes over a live owner (hand_over force).")

    class Meta:
        ordering = ["-id"]
        db_table = "queues_entry"
        verbose_name_plural = "queue entries"
        # What an operator may do to an entry in the admin (queues/admin.py), besides viewing it.
        permissions = [("cancel_queueentry", "Can cancel a queued start that has not begun"),
                       ("reprioritise_queueentry", "Can change the priority of a pending queued start")]
        indexes = [
            # The dequeue's candidates: pending entries of a queue in start order.
            models.Index("queue", models.F("priority").desc(), "id", name="queues_entry_pending",
                         condition=Q(state=PENDING)),
            # Which pending entries are due (run_after <= now): a range of this index, so entries deferred
            # to a later time are never read by the readiness probe, the candidates or the ready count
            # (review R1: 100,000 deferred entries made each of them scan the whole pending set).
            models.Index("queue", "run_after", name="queues_entry_due", condition=Q(state=PENDING)),
            # The running count (per partition) under the queue's lock.
            models.Index("queue", "partition_key", name="queues_entry_started", condition=Q(state=STARTED)),
            # Entries offered again after a lost claim (normally none): the dequeue adopts the late starters.
            models.Index("queue", name="queues_entry_reoffered", condition=Q(state=PENDING, attempts__gt=0)),
            # The rate limit's window of recent starts.
            models.Index("queue", "started_at", name="queues_entry_recent"),
        ]
        constraints = [
            # A dedup id is held by one live entry per queue: a racing second enqueue loses the insert.
            models.UniqueConstraint("queue", "dedup_id", name="queues_entry_dedup",
                                    condition=Q(state__in=LIVE, dedup_id__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.execution_id} ({self.state})"
