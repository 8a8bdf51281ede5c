from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Loom queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from journal.flows.runtime import QUEUE_STARTS, RERUN_HOOKS
        from queues import conf  # noqa: F401  (registers the LOOM_QUEUE* settings)
        from queues.hooks import reopen
        from queues.service import QueueService, import_task_flows

        if reopen not in RERUN_HOOKS:
            RERUN_HOOKS.append(reopen)
        from queues.enqueuing import enqueue

        QUEUE_STARTS[:] = [enqueue]  # journal.flows.start(..., queue=...)
        import_task_flows()  # the Tasks backend's flow, when TASKS names journal.tasks.LoomBackend
        try:
            from leases.worker import register_service
        except ImportError:  # pragma: no cover - leases is a dependency of this app
            return
        register_service(QueueService)
