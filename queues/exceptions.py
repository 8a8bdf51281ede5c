"""The queues' errors: every refusal of a declaration or an enqueue is one of these, and nothing is
written when one is raised."""

from __future__ import annotations

from journal.flows.errors import NotResumable


class QueueError(ValueError):
    """Base class of the queues' errors."""


class UnknownQueue(QueueError):
    """No queue of that name is declared (LOOM_QUEUES, declare_queue) in this process or the database."""


class InvalidQueue(QueueError):
    """A queue declaration is unusable: a bad name, a cap below 1, a rate limit without a period."""


class InvalidEnqueue(QueueError):
    """An enqueue's options are unusable: priority, partition key, dedup id or run_after."""


class QueueFull(QueueError, NotResumable):
    """A retry of a queued execution would run over its queue's cap (review R2): nothing was written;
    retry again once a running execution of the queue has settled."""
