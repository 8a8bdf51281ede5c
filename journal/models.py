"""The journal's tables. Writes go through `Event.objects` (journal/store), never the ORM's save()."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from journal.managers import EventManager, FenceManager, SnapshotManager


class Event(models.Model):
    """One event of one stream. `seq` counts from 0 with no gaps; `id` is a global position."""

    id = models.BigAutoField(primary_key=True)
    stream_id = models.CharField(max_length=200)
    seq = models.BigIntegerField()
    type = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    recorded_at = models.DateTimeField(db_default=Now())

    objects = EventManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stream_id", "seq"], name="journal_event_stream_seq")]
        ordering = ["stream_id", "seq"]

    def __str__(self) -> str:
        return f"{self.stream_id}#{self.seq} {self.type}"

    def save(self, *args, **kwargs):
        raise TypeError("the journal is append-only: use Event.objects.append() or append_batch()")

    def delete(self, *args, **kwargs):
        raise TypeError("the journal is append-only: events are never deleted")


class Fence(models.Model):
    """The current fence token of a single-writer stream. Advancing it refuses the former owner."""

    stream_id = models.CharField(max_length=200, primary_key=True)
    token = models.BigIntegerField(default=1)
    created_at = models.DateTimeField(db_default=Now())

    objects = FenceManager()

    def __str__(self) -> str:
        return f"{self.stream_id} @{self.token}"


class Snapshot(models.Model):
    """A checkpoint of a stream's folded state, covering its events up to `seq` inclusive."""

    stream_id = models.CharField(max_length=200)
    seq = models.BigIntegerField()
    state = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())

    objects = SnapshotManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stream_id", "seq"], name="journal_snapshot_stream_seq")]

    def __str__(self) -> str:
        return f"{self.stream_id}@{self.seq}"


class Execution(models.Model):
    """The header of an execution stream (its id is the stream id), kept for listing and recovery."""

    class Status(models.TextChoices):
        QUEUED = "queued"  # accepted on a queue, not begun: a worker's dispatcher begins it (journal/flows/queued.py)
        RUNNING = "running"
        WAITING = "waiting"  # parked on a timer, a message or a child: no lease, no thread (journal_wait)
        SUSPENDED = "suspended"  # suspend(): no lease, no wait, no worker until resume()
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        STUCK = "stuck"  # recovery gave up after LOOM_RECOVERY_MAX_ATTEMPTS

    id = models.CharField(max_length=200, primary_key=True)
    flow = models.CharField(max_length=200, db_index=True)
    # The flow version it started on (EXECUTION_STARTED `$version`): it resumes only on a worker that has
    # it (docs/flows.md "Versions"). A database default, so a header written before versions (or by a
    # statement that names no version) is version 1.
    flow_version = models.IntegerField(db_default=1)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING, db_index=True)
    input = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    recoveries = models.IntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        # What an operator may do to an execution in the admin (and the API), besides viewing it.
        permissions = [("resume_execution", "Can resume an execution (hand it to a worker)"),
                       ("retry_execution", "Can retry a failed execution"),
                       ("cancel_execution", "Can cancel an execution"),
                       # flows that wait (journal/flows/waits.py)
                       ("wake_execution", "Can wake a waiting execution now"),
                       ("message_execution", "Can send a message to an execution"),
                       ("suspend_execution", "Can suspend and resume an execution"),
                       ("fork_execution", "Can fork an execution")]
        # The recovery sweep's orphan arm (RECOVERY_CANDIDATES): running executions last updated before
        # the orphan grace, without reading every running one. Partial: the settled rows (most of the
        # table) are never in it. Its statements say `status = 'running'` exactly as here: SQLite uses a
        # partial index only when the WHERE implies its predicate term by term.
        indexes = [models.Index(fields=["updated_at"], condition=models.Q(status="running"),
                                name="journal_exec_running_upd"),
                   # Retention (journal/retention.py): the settled headers oldest finished first, one range
                   # scan per batch. Partial: running and parked headers (no finished_at) are never in it.
                   models.Index(fields=["finished_at"], condition=models.Q(finished_at__isnull=False),
                                name="journal_exec_finished")]

    def __str__(self) -> str:
        return f"{self.flow} {self.id} ({self.status})"


class Wait(models.Model):
    """What a waiting execution waits for (one row per parked execution): the waker claims the rows
    whose `due_at` has come (journal/flows/waits.py). `token` is the fence the run parked under: a
    claim advances the fence only from it, so a wait outlived by a takeover wakes nothing."""

    execution_id = models.CharField(max_length=200, primary_key=True)
    flow = models.CharField(max_length=200)
    kind = models.CharField(max_length=20)  # sleep, recv, child, start, retry
    pos = models.IntegerField(default=-1)
    token = models.BigIntegerField()
    due_at = models.DateTimeField(null=True, blank=True)  # None: no timer (woken by a message or a child)
    topic = models.CharField(max_length=200, blank=True, default="")
    child = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        # A worker claims (and probes) the due waits of the flows it has registered, one range scan of
        # this index per flow that stops after its limit: the cost grows neither with the number of
        # pending waits nor with the due waits of flows it does not have (their number is unbounded:
        # another service's, or a flow removed from the code). No index on due_at alone: the planner
        # preferred walking it and filtering by flow (every foreign due row read on every claim).
        indexes = [models.Index(fields=["flow", "due_at"], name="journal_wait_flow_due",
                                condition=models.Q(due_at__isnull=False))]

    def __str__(self) -> str:
        return f"{self.execution_id} waits ({self.kind}) until {self.due_at}"


class Message(models.Model):
    """A message sent to an execution (send()); consumed once by a ctx.recv of its topic."""

    id = models.BigAutoField(primary_key=True)
    execution_id = models.CharField(max_length=200)
    topic = models.CharField(max_length=200)
    message_id = models.CharField(max_length=200)
    payload = models.JSONField(null=True)
    sent_at = models.DateTimeField(db_default=Now())
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_seq = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["execution_id", "message_id"],
                                               name="journal_message_idempotent")]
        # The oldest pending message of a topic: one probe of this index.
        indexes = [models.Index(fields=["execution_id", "topic", "id"], name="journal_message_pending",
                                condition=models.Q(consumed_at__isnull=True))]

    def __str__(self) -> str:
        return f"{self.execution_id} <- {self.topic} ({self.message_id})"


class FlowEvent(models.Model):
    """A value an execution published with ctx.set_event(key, value), read by get_event()."""

    execution_id = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    value = models.JSONField(null=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["execution_id", "key"], name="journal_flowevent_key")]

    def __str__(self) -> str:
        return f"{self.execution_id}[{self.key}]"


class AggregateStream(Event):
    """The aggregates' admin pages (journal/aggregates/admin.py): a proxy of Event so that they are
    listed on the admin index and guarded by their own view permission (journal.view_aggregatestream)."""

    class Meta:
        proxy = True
        verbose_name = "aggregate stream"
        verbose_name_plural = "aggregates"


class DataKey(models.Model):
    """A data subject's key (journal/privacy/keys.py), wrapped by the master key `master_id`. Forgetting
    the subject sets `wrapped` to NULL: the row stays as the tombstone that keeps the subject forgotten."""

    subject = models.CharField(max_length=200, primary_key=True)
    master_id = models.CharField(max_length=64, blank=True, default="")
    wrapped = models.TextField(null=True, blank=True)  # base64 of nonce + AES-GCM(master, data key)
    created_at = models.DateTimeField(db_default=Now())
    forgotten_at = models.DateTimeField(null=True, blank=True)
    forgotten_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        verbose_name = "data subject"
        permissions = [("forget_subject", "Can forget a data subject (destroy its key)"),
                       ("disclose_personal_data", "Can read every sensitive field")]

    def __str__(self) -> str:
        return f"{self.subject} ({'forgotten' if self.wrapped is None else 'key held'})"


class ContentLink(models.Model):
    """Content in the content store and the subject whose sealed blob it is ('' for none): `forget`
    erases the blobs of its subject (journal/privacy/content.py)."""

    sha256 = models.CharField(max_length=64)
    subject = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sha256", "subject"], name="journal_contentlink_sha_subject")]
        indexes = [models.Index(fields=["subject"], name="journal_contentlink_subject")]


class Removal(models.Model):
    """One batch of settled executions the retention service removed (journal/retention.py): written in the
    batch's own transaction, so it records exactly what was removed (admin, `manage.py loom retention`)."""

    id = models.BigAutoField(primary_key=True)
    removed_at = models.DateTimeField()
    executions = models.IntegerField(default=0)
    events = models.BigIntegerField(default=0)
    messages = models.IntegerField(default=0)
    flow_events = models.IntegerField(default=0)
    ids = models.JSONField(default=list, help_text="The execution ids removed by this batch.")
    archive = models.CharField(max_length=500, blank=True, default="",
                               help_text="The archive object written before removal ('' for none).")

    class Meta:
        ordering = ["-id"]
        verbose_name = "removal batch"
        verbose_name_plural = "removal batches"

    def __str__(self) -> str:
        return f"removal {self.id}: {self.executions} execution(s), {self.events} event(s)"


class Compaction(models.Model):
    """One batch of an aggregate stream's compaction (journal/compaction.py): the events before its newest
    snapshot deleted, written in the batch's own transaction (admin, `manage.py loom retention compact`)."""

    id = models.BigAutoField(primary_key=True)
    compacted_at = models.DateTimeField()
    state = models.CharField(max_length=200, help_text="The aggregate state (its declared name).")
    stream_id = models.CharField(max_length=200)
    before_seq = models.BigIntegerField(help_text="The kept snapshot's seq: the events before it were deleted.")
    events = models.BigIntegerField(default=0)
    snapshots = models.IntegerField(default=0, help_text="Older snapshots deleted with them.")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["stream_id", "before_seq"], name="journal_compaction_stream")]
        verbose_name = "compaction batch"
        verbose_name_plural = "compaction batches"

    def __str__(self) -> str:
        return f"compaction {self.id}: {self.stream_id} before seq {self.before_seq}, {self.events} event(s)"
