"""The heartbeat-lease hook of the runtime: who owns a running execution, and when it lost it.

The runtime calls `get_ownership().begin(...)` right after it knows the run's fence token (the
sequence-0 bootstrap of a fresh start, or the advanced fence of a resume/takeover), checks
`claim.lost` at every step boundary (a lost claim stops the run: another worker may own the
execution now, and its fence refuses our appends anyway), and calls `claim.end()` exactly once
when the run completes, fails, suspends or stops. The `leases` app installs a real implementation
with `set_ownership(...)`; the default owns nothing and never loses.

Inline leases (the bootstrap/settle companion, PostgreSQL; docs/flows.md "Extension point"): an
ownership may also write its lease row INSIDE the run's bootstrap statement and delete it INSIDE
its settle statement, so a short run pays no statement of its own for its lease. It does so by
having an attribute `companion` (a `Companion`: the CTE texts, which the journal store splices into
the execution statements without knowing what they write) and a method `inline_lease()` (called right before
a fresh start's bootstrap: an `InlineLease` to write with it, or None). begin() then receives that
lease (`lease=`), and a claim whose lease row may be deleted by the settle says so with
`settle_owner` (the owner id, or None); `end(released=True)` tells it the settle did.

Live owners (resume, hand-over): an ownership may have a method `live_owner(execution_id) -> str |
None` that names whoever else provably drives the execution right now (a live lease of another
process, or a fresh run still within its lazy grace, which has no lease row yet). resume() and
hand_over() refuse to take such an execution over (ExecutionBusy) unless forced. Without the
method (the no-op default, LOOM_LEASE_MODE=off) nothing can be proven live and nothing is refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Companion:
    """PostgreSQL CTEs (each starting with ", name AS (") added to the flows statements.

    boot:        BOOT (one execution); may read `fence f` (a row iff this start won) and the params
                 %(lease_owner)s text, %(lease_ttl)s float8.
    boot_many:   BOOT_MANY; may read `req q` and `fence f` and %(lease_owners)s text[], %(lease_ttls)s
                 float8[] (aligned with %(sids)s; a NULL owner: no lease for that stream).
    settle:      SETTLE (one execution); may read `ins` and %(hid)s, %(lease_owner)s, %(lease_token)s.
    settle_many: SETTLE_MANY; may read `ins` and %(lease_eids)s text[], %(lease_owners)s text[],
                 %(lease_tokens)s bigint[] (only the streams whose settle may delete a lease).
    Data-modifying CTEs run to completion with the statement: the companion rows commit (or roll
    back) with the fence, events and header they depend on.
    """

    boot: str
    boot_many: str
    settle: str
    settle_many: str


@dataclass(frozen=True, slots=True)
class InlineLease:
    """A lease to write with a fresh start's bootstrap: owner, TTL (s), and the monotonic time just
    before the statement was sent (the earliest the database clock can have started the TTL)."""

    owner: str
    ttl: float
    sent_at: float = field(default_factory=time.monotonic)


@runtime_checkable
class Claim(Protocol):
    """One run's hold on one execution."""

    @property
    def lost(self) -> bool:
        """True once the run must stop working on the execution (lease expired or taken over)."""
        ...

    def end(self, released: bool = False) -> None:
        """The run settled or stopped: release whatever `begin` took. Called once. released=True:
        the settle statement already deleted the lease row (the companion's settle CTE).

        A claim may also have `abandon(graceful=False)`, called instead of end() when the run stopped with the
        execution still running (a halt: its write failed or was refused): leases keep the lease row to lapse, so
        that recovery finds the execution by its expired lease. Without it, end() is called. graceful=True: the
        run stopped at a step boundary for a graceful shutdown (ShuttingDown, its work recorded): the takeover
        that continues it is no recovery attempt (LOOM_RECOVERY_MAX_ATTEMPTS)."""
        ...


@runtime_checkable
class Ownership(Protocol):
    """Decides and records who runs an execution."""

    def begin(self, execution_id: str, fence_token: int, *, fresh: bool,
              lease: InlineLease | None = None) -> Claim:
        """Claim the execution for this run holding `fence_token`.

        fresh=True for a new start (an implementation may lease lazily: most runs finish before a
        lease is worth writing); False for resume/takeover (always lease eagerly). `lease`: the
        bootstrap already wrote this lease (what `inline_lease()` returned before it).
        """
        ...


class _NoClaim:
    __slots__ = ()
    lost = False
    settle_owner = None

    def end(self, released: bool = False) -> None:
        return None


_NO_CLAIM = _NoClaim()


class NoOwnership:
    """The default: no leases; a run never loses its claim (resume is called explicitly)."""

    def begin(self, execution_id: str, fence_token: int, *, fresh: bool,
              lease: InlineLease | None = None) -> Claim:
        return _NO_CLAIM


_current: Ownership = NoOwnership()


def set_ownership(ownership: Ownership | None) -> None:
    """Install the process-wide ownership (None restores the no-op default)."""
    global _current
    _current = NoOwnership() if ownership is None else ownership


def get_ownership() -> Ownership:
    return _current


def inline_lease() -> tuple[Companion, InlineLease] | None:
    """The installed ownership's companion and the lease to write with a fresh bootstrap, if any."""
    current = _current
    companion = getattr(current, "companion", None)
    if companion is None:
        return None
    lease = current.inline_lease()
    return None if lease is None else (companion, lease)


def live_owner(execution_id: str) -> str | None:
    """Who else drives the execution right now (the installed ownership's `live_owner`), or None."""
    check = getattr(_current, "live_owner", None)
    return None if check is None else check(execution_id)


def companion() -> Companion | None:
    """The installed ownership's companion CTEs (None: the plain statements)."""
    return getattr(_current, "companion", None)
