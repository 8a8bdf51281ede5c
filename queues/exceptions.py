"""The queues' errors: every refusal of a declaration or an enqueue is one of these, and nothing is
written when one is raised."""

from __future__ import annotations


class QueueError(ValueError):
    """Base class of the queues' errors."""


class UnknownQueue(QueueError):
    """No queue of that name is declared (LOOM_QUEUES, declare_queue) in this process or the database."""


class InvalidQueue(QueueError):
    """A queue declaration is unusable: a bad name, a cap below 1, a rate limit without a period."""


class InvalidEnqueue(QueueError):
    """An enqueue's options are unusable: priority, partition key, dedup id or run_after."""
