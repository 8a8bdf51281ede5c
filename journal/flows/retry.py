"""Retry policy of a step: how many attempts, how long to wait between them, what is retried."""

from __future__ import annotations

from dataclasses import dataclass

from journal.flows.errors import NonRetryableError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """attempts: total tries including the first (1 = no retry). The wait before try k+1 is
    min(max_backoff, backoff * factor**(k-1)) seconds. Only exceptions of `retry_on` are retried;
    NonRetryableError (and anything else) fails the step at once."""

    attempts: int = 1
    backoff: float = 0.0
    factor: float = 2.0
    max_backoff: float = 60.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be an integer >= 1, got {self.attempts!r}")
        if self.backoff < 0 or self.factor < 1 or self.max_backoff < 0:
            raise ValueError("RetryPolicy needs backoff >= 0, factor >= 1 and max_backoff >= 0")

    def delay(self, failed_attempt: int) -> float:
        """Seconds to wait after the `failed_attempt`-th try failed (1-based)."""
        if self.backoff <= 0:
            return 0.0
        return min(self.max_backoff, self.backoff * self.factor ** (failed_attempt - 1))

    def retries(self, exc: BaseException, failed_attempt: int) -> bool:
        return (failed_attempt < self.attempts and not isinstance(exc, NonRetryableError)
                and isinstance(exc, self.retry_on))


NO_RETRY = RetryPolicy()
