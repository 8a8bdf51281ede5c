"""Which Django task a `loom.task` execution runs: its signed task path, and the name people see for it.

LoomBackend.enqueue (queues/tasks.py) signs the task path together with the execution id (Django's signing:
SECRET_KEY, and SECRET_KEY_FALLBACKS verify too). The worker, get_result, the admin and the CLI trust a path only
once its signature verifies, so a start of `loom.task` made elsewhere (the API, a schedule, a row written by
hand) neither imports a module nor shows as a task. No Django Tasks import here: the admin and the CLI use this
module in projects without the Tasks framework.
"""

from __future__ import annotations

from typing import Any

from django.core import signing
from django.db.models import Q

from journal.flows.errors import FlowError

TASK_FLOW = "loom.task"
SIGNING_SALT = "journal.tasks.LoomBackend"  # the signature of a task path: made at enqueue, checked before import
# (the backend's first path: kept, so that tasks queued before it moved to queues/tasks.py still verify)


class UnverifiedTask(FlowError):
    """A loom.task execution whose task path carries no valid signature of LoomBackend.enqueue (a start of the
    flow from elsewhere, a row written by hand, a key that changed): refused before anything is imported."""


def sign_task(execution_id: str, path: str) -> str:
    """The signature binding a task path to one execution."""
    return signing.Signer(salt=SIGNING_SALT).signature(f"{execution_id}\n{path}")


def verified_path(input: Any, execution_id: str) -> str:
    """The task path of a loom.task input if LoomBackend.enqueue signed it for this execution; UnverifiedTask
    otherwise. Nothing is imported before this returns."""
    path = input.get("task") if isinstance(input, dict) else None
    signature = input.get("signature") if isinstance(input, dict) else None
    if not isinstance(path, str) or not isinstance(signature, str) or not isinstance(execution_id, str):
        raise UnverifiedTask(f"execution {execution_id!r}: its input names no signed task (a loom.task execution "
                             "is made by LoomBackend.enqueue only)")
    signer = signing.Signer(salt=SIGNING_SALT)
    try:
        signer.unsign(f"{execution_id}\n{path}{signer.sep}{signature}")
    except signing.BadSignature:
        raise UnverifiedTask(f"execution {execution_id!r}: the signature of task {path[:200]!r} is not valid "
                             "(not made by LoomBackend.enqueue for this execution, or with a key no longer in "
                             "SECRET_KEY or SECRET_KEY_FALLBACKS)") from None
    return path


def shown_flow(flow: str, input: Any, execution_id: str) -> str:
    """The flow as people see it in lists: a Django task's dotted name (its path verified) for `loom.task`."""
    if flow != TASK_FLOW:
        return flow
    try:
        return verified_path(input, execution_id)
    except UnverifiedTask:
        return flow


def flow_q(name: str) -> Q:
    """Executions of a flow, or of the Django task of that dotted name (the lists' flow filter). A loom.task
    row whose path does not verify matches by name too, and is still shown as loom.task."""
    return Q(flow=name) | Q(flow=TASK_FLOW, input__task=name)
