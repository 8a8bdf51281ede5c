"""Admin: leases (who drives which execution, until when), workers and what they hold, and the
executions under recovery. Read-only, for everyone (superusers too), on the shared base
(journal/admin_base.py): leases, worker rows and execution headers are written by the keeper, the
sweep and the runtime only; deleting one by hand would hide a running execution from recovery or
break its fence bookkeeping. The lease line of the execution page is added here, through the journal's
panel hook (the journal's admin does not import this module)."""

from __future__ import annotations

from datetime import timedelta

from django.apps import apps
from django.contrib import admin
from django.db.models import Q
from django.db.models.functions import Now
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html

from journal.admin_base import ReadOnlyAdmin, ReadOnlyInline, add_execution_panel
from journal.ids import stored_id_problem
from journal.timestamps import stamp
from leases import conf
from leases.models import Lease, RecoveryView, Worker


def expires_in(lease: Lease) -> str:
    seconds = (lease.expires_at - timezone.now()).total_seconds()
    return f"{seconds:.1f} s" if seconds >= 0 else f"expired {-seconds:.1f} s ago"


def lease_summary(execution_id: str) -> str:
    """One line for the Execution page: owner, expires in, renewed at (or why there is none)."""
    lease = Lease.objects.filter(execution_id=execution_id).first()
    if lease is None:
        return "no lease (settled, off mode, or a lazy run still within its grace)"
    return (f"owner {lease.owner_id}, fence token {lease.fence_token}, expires in {expires_in(lease)}, "
            f"renewed at {stamp(lease.renewed_at)}")


add_execution_panel("lease", "lease", lease_summary)

if apps.is_installed("django_q"):  # leases runs without django-q2 (no queued starts): then no task pages either
    import leases.admin_q  # noqa: F401  (django-q2's task pages, their resubmit action behind a permission)


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ("execution_link", "owner_id", "fence_token", "acquired_at", "renewed_at", "expires_in",
                    "handed_back")
    list_filter = ("owner",)
    search_fields = ("execution__id", "owner__id")
    ordering = ("expires_at",)

    @admin.display(description="execution")
    def execution_link(self, lease: Lease) -> str:
        try:
            url = reverse("admin:journal_execution_change", args=[lease.execution_id])
        except NoReverseMatch:
            url = reverse("admin:leases_recoveryview_change", args=[lease.execution_id])
        return format_html('<a href="{}">{}</a>', url, lease.execution_id)

    @admin.display(description="expires in")
    def expires_in(self, lease: Lease) -> str:
        return expires_in(lease)


class HeldLeases(ReadOnlyInline):
    model = Lease
    fk_name = "owner"
    fields = ("execution", "fence_token", "renewed_at", "expires_at")
    readonly_fields = fields
    show_change_link = True


def worker_state(worker: Worker) -> str:
    """alive (heartbeat within a lease TTL), stopped (clean shutdown) or gone (no heartbeat since)."""
    if worker.stopped_at is not None:
        return "stopped"
    silent = (timezone.now() - worker.seen_at).total_seconds()
    window = max(conf.get("LOOM_LEASE_TTL"), 3 * conf.get("LOOM_LEASE_RENEW_EVERY"))
    return "alive" if silent <= window else f"gone (silent {silent:.0f} s)"


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    """One row per process: a loom_worker's main process, each of its django-q2 children (id
    <main id>/<pid>), and any other process whose runs took leases. Rows unseen for
    LOOM_WORKER_RETENTION seconds are pruned by the workers' recovery loop."""

    list_display = ("id", "role", "host", "pid", "state", "seen_at", "started_at", "stopped_at", "held")
    list_filter = ("role",)
    search_fields = ("id", "host")
    inlines = [HeldLeases]

    @admin.display(description="leases held")
    def held(self, worker: Worker) -> int:
        return worker.leases.count()

    @admin.display(description="alive or gone")
    def state(self, worker: Worker) -> str:
        return worker_state(worker)


@admin.register(RecoveryView)
class RecoveryAdmin(ReadOnlyAdmin):
    """Executions under recovery now, not healthy ones: running with an expired lease, or with none past
    the lazy grace + TTL (orphans the next sweep takes), or stuck (an execution recovered once and healthy
    or settled since is not listed: its "recoveries" column on the executions list counts it).
    Stuck ones (recovery gave up after LOOM_RECOVERY_MAX_ATTEMPTS) need a
    person: fix the cause, then resume them by hand (journal.flows.resume)."""

    withheld_lookups = ("input", "result", "error")

    list_display = ("id", "flow", "status", "recoveries", "lease_owner", "lease_expires_in", "error", "updated_at")
    list_filter = ("status",)
    search_fields = ("id", "flow")
    fields = ("id", "flow", "status", "recoveries", "error", "lease_owner", "lease_token", "lease_renewed_at",
              "lease_expires_in", "created_at", "updated_at")
    readonly_fields = fields

    def get_object(self, request, object_id, from_field=None):
        """None (the admin's "does not exist") for an id the database cannot hold (NUL, lone surrogate)."""
        if stored_id_problem(object_id) is not None:
            return None
        return super().get_object(request, object_id, from_field)

    def get_queryset(self, request):
        orphaned_before = timezone.now() - timedelta(seconds=conf.lease_grace() + conf.get("LOOM_LEASE_TTL"))
        expired = Q(status="running", lease__expires_at__lt=Now())
        orphan = Q(status="running", lease__isnull=True, updated_at__lt=orphaned_before)
        # Under recovery NOW (issue #28): not every execution ever recovered (the executions list shows those
        # by their "recoveries" column), only ones a sweep is about to take, or gave up on.
        return (super().get_queryset(request).filter(expired | orphan | Q(status="stuck"))
                .select_related("lease"))

    @staticmethod
    def _lease(execution):
        try:
            return execution.lease
        except Lease.DoesNotExist:
            return None

    @admin.display(description="lease owner")
    def lease_owner(self, execution) -> str:
        lease = self._lease(execution)
        return lease.owner_id if lease else "-"

    @admin.display(description="fence token")
    def lease_token(self, execution) -> str:
        lease = self._lease(execution)
        return str(lease.fence_token) if lease else "-"

    @admin.display(description="renewed at")
    def lease_renewed_at(self, execution) -> str:
        lease = self._lease(execution)
        return stamp(lease.renewed_at) if lease else "-"

    @admin.display(description="lease expires in")
    def lease_expires_in(self, execution) -> str:
        lease = self._lease(execution)
        return expires_in(lease) if lease else "no lease"

from leases import admin_schedules  # noqa: E402,F401  (the schedules' pages: leases/admin_schedules.py)
