"""Recorded benchmark runs: every run of a bench command leaves a BenchRun and its BenchResults."""

from __future__ import annotations

from django.db import models


class BenchRun(models.Model):
    """One invocation of a bench command, with the environment needed to reproduce or doubt it."""

    class Status(models.TextChoices):
        RUNNING = "running"
        OK = "ok"
        FAILED = "failed"

    command = models.CharField(max_length=100, db_index=True)
    argv = models.TextField(help_text="The command line, as run.")
    started_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True, default="")
    git_commit = models.CharField(max_length=64, blank=True, default="")
    git_dirty = models.BooleanField(default=False)
    source_hash = models.CharField(max_length=64, blank=True, default="",
                                   help_text="SHA-256 over the runtime's source files (journal, leases, projections).")
    db_vendor = models.CharField(max_length=30)
    db_version = models.CharField(max_length=200, blank=True, default="")
    python_version = models.CharField(max_length=50)
    django_version = models.CharField(max_length=50)
    cpu_count = models.IntegerField(default=0)
    machine = models.CharField(max_length=200, blank=True, default="")
    settings = models.JSONField(default=dict, blank=True, help_text="Options of the run and the LOOM_* settings.")

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.command} on {self.db_vendor} ({self.started_at:%Y-%m-%d %H:%M})"


class BenchResult(models.Model):
    """One measured cell: a section, its scenario and parameters, and its figures."""

    run = models.ForeignKey(BenchRun, on_delete=models.CASCADE, related_name="results")
    section = models.CharField(max_length=50, db_index=True)
    scenario = models.CharField(max_length=100)
    params = models.JSONField(default=dict, blank=True)
    throughput = models.FloatField(null=True, blank=True)
    unit = models.CharField(max_length=30, blank=True, default="")
    p50_ms = models.FloatField(null=True, blank=True)
    p95_ms = models.FloatField(null=True, blank=True)
    p99_ms = models.FloatField(null=True, blank=True)
    max_ms = models.FloatField(null=True, blank=True)
    count = models.IntegerField(null=True, blank=True, help_text="Operations measured.")
    metrics = models.JSONField(default=dict, blank=True, help_text="Every other figure of the cell.")

    class Meta:
        ordering = ["run", "id"]

    def __str__(self) -> str:
        return f"{self.section}/{self.scenario} {self.params}"

    @property
    def key(self) -> str:
        """Identity of the cell across runs, for comparisons and gates."""
        params = ",".join(f"{k}={self.params[k]}" for k in sorted(self.params))
        return f"{self.section}/{self.scenario}[{params}]"
