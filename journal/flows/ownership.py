"""The heartbeat-lease hook of the runtime: who owns a running execution, and when it lost it.

The runtime calls `get_ownership().begin(...)` right after it knows the run's fence token (the
sequence-0 bootstrap of a fresh start, or the advanced fence of a resume/takeover), checks
`claim.lost` at every step boundary (a lost claim stops the run: another worker may own the
execution now, and its fence refuses our appends anyway), and calls `claim.end()` exactly once
when the run completes, fails, suspends or stops. The `leases` app installs a real implementation
with `set_ownership(...)`; the default owns nothing and never loses.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Claim(Protocol):
    """One run's hold on one execution."""

    @property
    def lost(self) -> bool:
        """True once the run must stop working on the execution (lease expired or taken over)."""
        ...

    def end(self) -> None:
        """The run settled or stopped: release whatever `begin` took. Called once."""
        ...


@runtime_checkable
class Ownership(Protocol):
    """Decides and records who runs an execution."""

    def begin(self, execution_id: str, fence_token: int, *, fresh: bool) -> Claim:
        """Claim the execution for this run holding `fence_token`.

        fresh=True for a new start (an implementation may lease lazily: most runs finish before a
        lease is worth writing); False for resume/takeover (always lease eagerly).
        """
        ...


class _NoClaim:
    __slots__ = ()
    lost = False

    def end(self) -> None:
        return None


_NO_CLAIM = _NoClaim()


class NoOwnership:
    """The default: no leases; a run never loses its claim (resume is called explicitly)."""

    def begin(self, execution_id: str, fence_token: int, *, fresh: bool) -> Claim:
        return _NO_CLAIM


_current: Ownership = NoOwnership()


def set_ownership(ownership: Ownership | None) -> None:
    """Install the process-wide ownership (None restores the no-op default)."""
    global _current
    _current = NoOwnership() if ownership is None else ownership


def get_ownership() -> Ownership:
    return _current
