from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
    verbose_name = "Loom leases and workers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from leases import checks, conf  # noqa: F401  (registers the system checks and the LOOM_LEASE_* settings)
        from leases.ownership import install
        from leases.recovery import RecoveryService
        from leases.waker import WakeService
        from leases.worker import HeartbeatService, register_service

        install()  # LOOM_LEASE_MODE decides; the keeper's thread starts with the first claim
        from journal.flows.runtime import CANCEL_HOOKS
        from leases.ownership import drop_on_cancel

        if drop_on_cancel not in CANCEL_HOOKS:  # whatever the mode: rows another process wrote go too
            CANCEL_HOOKS.append(drop_on_cancel)
        from journal.retention import REMOVE_HOOKS
        from leases.retention import RetentionService, drop_removed

        if drop_removed not in REMOVE_HOOKS:
            REMOVE_HOOKS.append(drop_removed)
        register_service(HeartbeatService)
        register_service(RecoveryService)
        from leases.schedules import ScheduleService

        register_service(ScheduleService)  # cron schedules (leases/schedules.py)
        register_service(WakeService)  # resumes parked executions when due (flows that wait)
        register_service(RetentionService)  # removes settled executions past retention (journal/retention.py)
        from leases.watchdog import StepWatchdog

        register_service(StepWatchdog)  # tells running steps to stop; retires a worker whose step ignores it
        try:
            from django_q.signals import post_spawn
        except ImportError:  # django-q2 not installed: no queued starts, no cluster to watch
            return
        from leases.worker import register_q_child

        post_spawn.connect(register_q_child, dispatch_uid="leases.register_q_child")
