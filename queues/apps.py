from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Loom queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from journal.flows.plugins import add_cancel_hook, add_rerun_hook, set_queue_start, set_resume_queue
        from journal.retention import add_remove_hook
        from queues import conf  # noqa: F401  (registers the LOOM_QUEUE* settings)
        from queues.enqueuing import enqueue, enqueue_resume
        from queues.hooks import cancelled, removed, reopen
        from queues.service import QueueService, import_task_flows

        add_rerun_hook(reopen)
        add_remove_hook(removed)
        add_cancel_hook(cancelled)
        set_queue_start(enqueue)  # journal.flows.start(..., queue=...)
        set_resume_queue(enqueue_resume)  # journal.flows.hand_over, retry(handoff=True)
        import_task_flows()  # the Tasks backend's flow, when TASKS names queues.tasks.LoomBackend
        from journal.telemetry import add_gauge_source
        from queues.telemetry import gauges

        add_gauge_source(gauges)  # queue depth on the metrics page (docs/observability.md)
        from queues import cli

        cli.register()  # `manage.py loom queues|workers`, an execution's queue entry (journal/cli.py's seams)
        try:
            from leases.worker import register_service
        except ImportError:  # pragma: no cover - leases is a dependency of this app
            return
        register_service(QueueService)
