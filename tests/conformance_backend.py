"""LoomBackend as the backends Django's own tests/tasks/ name (tests/queues/test_tasks_conformance.py), adapted only
in how results are awaited and read:

- AwaitingLoomBackend stands where Django's tests name ImmediateBackend: its enqueue() queues the task as
  LoomBackend does, then runs the queue's due entries in this thread as a loom_worker does (its dispatcher's
  dequeue and run_claimed), and answers get_result() of the task: the result a test awaiting it would see.
- QueuedLoomBackend stands where they name DummyBackend: LoomBackend unchanged (nothing runs), with Dummy's
  `results` read from the database and its `clear()` a no-op (each test has a database of its own).
"""

from __future__ import annotations

from queues.tasks import TASK_FLOW, LoomBackend


class AwaitingLoomBackend(LoomBackend):
    def enqueue(self, task, args, kwargs):
        from journal.flows import registry
        from queues.service import run_claimed
        from queues.store import store_for

        result = super().enqueue(task, args, kwargs)
        for claimed in store_for(self._alias()).dequeue(task.queue_name, "conformance-worker", 100,
                                                         registry.runnable(), 3600.0):
            run_claimed(claimed)
        return self.get_result(result.id)


class QueuedLoomBackend(LoomBackend):
    @property
    def results(self) -> list:
        from queues.models import QueueEntry

        ids = QueueEntry.objects.using(self._alias()).filter(flow=TASK_FLOW).order_by("id")
        return [self.get_result(execution_id) for execution_id in ids.values_list("execution_id", flat=True)]

    def clear(self) -> None:
        """Dummy's clear() empties its list; here each test's database starts empty."""
