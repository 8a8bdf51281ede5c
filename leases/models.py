"""The lease tables: who runs which execution (Lease) and which worker nodes exist (Worker).

Rows are written by leases/store (named SQL per backend), never by the ORM's save(): the ORM
models exist for the admin and for reads.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from journal.models import Execution


class Worker(models.Model):
    """A process that owns executions: a `loom_worker`, or any process that started a run."""

    id = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    role = models.CharField(max_length=40, blank=True, default="", db_default="",
                            help_text="main (a loom_worker), django-q2 child (a process its cluster forked), "
                                      "or caller (a web process or shell whose runs took leases).")
    started_at = models.DateTimeField(db_default=Now())
    seen_at = models.DateTimeField(db_default=Now(), help_text="Last heartbeat tick of this node.")
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="Set on a clean shutdown.")

    class Meta:
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return self.id


class Lease(models.Model):
    """One execution's heartbeat lease: `owner` drives it with `fence_token` until `expires_at`.

    No database foreign keys: a lease may be written before the execution's header row (eager
    acquire right after the sequence-0 bootstrap) and outlives a worker row that was cleaned up.
    The fields are ForeignKeys only so that the admin can link and list them.
    """

    execution = models.OneToOneField("journal.Execution", primary_key=True, on_delete=models.DO_NOTHING,
                                     db_constraint=False, related_name="lease")
    # db_index=False: Meta.indexes has the one owner index the admin and shutdown need; the FK's own
    # two (btree + varchar_pattern_ops) would only add index writes to every lease insert/delete.
    owner = models.ForeignKey(Worker, on_delete=models.DO_NOTHING, db_constraint=False, db_column="owner",
                              db_index=False, related_name="leases")
    fence_token = models.BigIntegerField()
    acquired_at = models.DateTimeField()
    renewed_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    handed_back = models.BooleanField(
        default=False, db_default=False,
        help_text="Expired by its owner's graceful shutdown at a step boundary: its takeover is no recovery attempt "
                  "(LOOM_RECOVERY_MAX_ATTEMPTS); any later write of the row clears it.")

    class Meta:
        ordering = ["expires_at"]
        indexes = [models.Index(fields=["owner"], name="leases_lease_owner")]

    def __str__(self) -> str:
        return f"{self.execution_id} by {self.owner_id} @{self.fence_token}"

    def save(self, *args, **kwargs):
        raise TypeError("leases are written by leases.store (acquire/renew/release/takeover), not save()")


class RecoveryView(Execution):
    """The executions seen from recovery (a proxy for the admin: stuck ones first, with leases)."""

    class Meta:
        proxy = True
        verbose_name = "execution under recovery"
        verbose_name_plural = "executions under recovery"


class StartReservation(models.Model):
    """An execution id claimed by a queued start (leases.tasks.enqueue_start) that has not begun yet.

    Written in the same transaction as the queued task (with the ORM broker), so the id is taken at
    enqueue, not when a worker first writes the execution: a second start of the id, by another
    token or with another input, is refused then (409), and the worker runs only the start the
    reservation describes. Deleted once the execution exists (its EXECUTION_STARTED keeps who
    started it). Not an execution header: recovery never sees it.
    """

    execution_id = models.CharField(max_length=200, primary_key=True)
    flow = models.CharField(max_length=200)
    input_hash = models.CharField(max_length=64,
                                  help_text="HMAC-SHA256, keyed by SECRET_KEY, of the stored input as canonical JSON.")
    started_by = models.CharField(max_length=200, blank=True, default="",
                                  help_text="The API token's name (empty for a start queued from code).")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.execution_id} ({self.flow}) reserved"


class Schedule(models.Model):
    """A cron schedule of a flow (leases/schedules.py): each tick starts one execution whose id is
    `sched:<name>:<tick>`, so every worker that ticks it agrees on what it started.

    Written through leases/store (`save_schedule`, the tick's claim and advance), never by the ORM's
    save(): the admin's form calls leases.schedules.define, which validates first. `next_tick_at` is
    the state the worker's tick reads (UTC, whatever the schedule's `timezone`: the zone only decides
    which instants the cron names); `source` says whether code (`@schedule`) or the admin made the row
    (a code schedule is rewritten from its code whenever a worker starts)."""

    class CatchUp(models.TextChoices):
        SKIP = "skip", "skip: a tick missed by more than LOOM_SCHEDULE_GRACE is not run"
        ONCE = "once", "once: all missed ticks together start one execution (the latest tick)"
        ALL = "all", "all: every missed tick starts its execution, oldest first"

    name = models.CharField(max_length=100, primary_key=True,
                            help_text="Letters, digits, '-', '_' and '.'; part of every execution id it starts.")
    cron = models.CharField(max_length=200, help_text="5 fields (minute hour day month weekday), or 6 with a "
                                                      "leading seconds field; evaluated in the time zone below.")
    timezone = models.CharField(max_length=64, default="UTC",
                                help_text="The IANA time zone the cron is evaluated in (e.g. Europe/Paris), "
                                          "daylight saving included (docs/schedules.md); ticks are stored in UTC.")
    flow = models.CharField(max_length=200, help_text="The registered flow each tick starts.")
    input = models.JSONField(default=dict, blank=True, help_text="The input of every execution it starts (JSON).")
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.SKIP)
    queue = models.CharField(max_length=100, blank=True, default="",
                             help_text="Start on this queue (empty: the worker cluster's plain queued start).")
    enabled = models.BooleanField(default=True)
    source = models.CharField(max_length=10, default="admin", editable=False)
    next_tick_at = models.DateTimeField(help_text="The next tick due (UTC).")
    last_tick_at = models.DateTimeField(null=True, blank=True, help_text="The last tick that started an execution.")
    last_execution_id = models.CharField(max_length=200, blank=True, default="")
    # An operator's pause (leases/schedule_ops.py): no tick starts while set. Kept apart from `enabled` so that a
    # code schedule rewritten from its code at a worker's start stays paused; on resume the catch-up policy
    # decides what the ticks missed meanwhile start.
    paused_at = models.DateTimeField(null=True, blank=True, editable=False, help_text="Paused since (empty: not).")
    paused_by = models.CharField(max_length=200, blank=True, default="", db_default="", editable=False)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["next_tick_at"], name="leases_schedule_due")]
        # Not django-q2's "Scheduled tasks" (its own page, under Django Q): the admin index names both apart.
        verbose_name = "Loom schedule"
        verbose_name_plural = "Loom schedules (flows on a cron)"
        permissions = [("operate_schedule", "Can run a schedule now, pause, resume and backfill it")]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} -> {self.flow})"

    def save(self, *args, **kwargs):
        raise TypeError("schedules are written by leases.schedules.define() (validated), not save()")


class DrainRequest(models.Model):
    """An operator's request that one worker drain (leases/drain.py): take no new work, let what runs finish,
    then exit. Written by the admin or `loom workers drain`; read and carried out by the named loom_worker
    process itself (its drain service polls this row), so the request outlives the process that made it."""

    worker_id = models.CharField(max_length=200, primary_key=True, help_text="The worker that is to drain.")
    requested_at = models.DateTimeField()
    requested_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    started_at = models.DateTimeField(null=True, blank=True,
                                      help_text="When the worker saw the request and stopped taking work.")
    finished_at = models.DateTimeField(null=True, blank=True,
                                       help_text="When its runs had ended and it began to exit.")

    class Meta:
        db_table = "leases_drain_request"
        ordering = ["-requested_at"]
        permissions = [("drain_worker", "Can ask a worker to drain (finish its runs and exit)")]

    def __str__(self) -> str:
        return f"drain {self.worker_id}"

    def save(self, *args, **kwargs):
        raise TypeError("drain requests are written by leases.drain (request/seen/done), not save()")
