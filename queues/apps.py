from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Loom queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from journal.flows.runtime import CANCEL_HOOKS, QUEUE_STARTS, RERUN_HOOKS
        from journal.retention import REMOVE_HOOKS
        from queues import conf  # noqa: F401  (registers the LOOM_QUEUE* settings)
        from queues.hooks import cancelled, removed, reopen
        from queues.service import QueueService, import_task_flows

        if reopen not in RERUN_HOOKS:
            RERUN_HOOKS.append(reopen)
        if cancelled not in CANCEL_HOOKS:
            CANCEL_HOOKS.append(cancelled)
        if removed not in REMOVE_HOOKS:
            REMOVE_HOOKS.append(removed)
        from journal.flows.handover import RESUME_QUEUES
        from queues.enqueuing import enqueue, enqueue_resume

        QUEUE_STARTS[:] = [enqueue]  # journal.flows.start(..., queue=...)
        RESUME_QUEUES[:] = [enqueue_resume]  # journal.flows.hand_over, retry(handoff=True)
        import_task_flows()  # the Tasks backend's flow, when TASKS names journal.tasks.LoomBackend
        try:
            from leases.worker import register_service
        except ImportError:  # pragma: no cover - leases is a dependency of this app
            return
        register_service(QueueService)
