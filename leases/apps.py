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
        from journal.flows.plugins import add_cancel_hook
        from leases.ownership import drop_on_cancel

        add_cancel_hook(drop_on_cancel)  # whatever the mode: rows another process wrote go too
        from journal.retention import add_remove_hook
        from leases.retention import RetentionService, drop_removed

        add_remove_hook(drop_removed)
        register_service(HeartbeatService)
        register_service(RecoveryService)
        from leases.schedules import ScheduleService

        register_service(ScheduleService)  # cron schedules (leases/schedules.py)
        register_service(WakeService)  # resumes parked executions when due (flows that wait)
        register_service(RetentionService)  # removes settled executions past retention (journal/retention.py)
        from leases.watchdog import StepWatchdog

        register_service(StepWatchdog)  # tells running steps to stop; retires a worker whose step ignores it
        from leases.drain import DrainService

        register_service(DrainService)  # carries out an operator's drain request naming this worker
        from leases import cli

        cli.register()  # `manage.py loom schedules`, an execution's lease and schedule (journal/cli.py's seams)
        try:
            from django_q.signals import post_spawn
        except ImportError:  # django-q2 not installed: no queued starts, no cluster to watch
            return
        from leases.worker import register_q_child

        post_spawn.connect(register_q_child, dispatch_uid="leases.register_q_child")
