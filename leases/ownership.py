"""The heartbeat-lease implementation of journal.flows.ownership, per LOOM_LEASE_MODE.

- off: journal.flows' no-op default (no lease rows; recovery sweeps are disabled, since a
  running execution without a lease cannot be told apart from a live one);
- eager: on PostgreSQL a fresh start's lease is written by its own bootstrap statement and deleted
  by its settle statement (inline_lease(), journal/flows/ownership.py Companion); elsewhere, and
  for resume/takeover, a run waits for its (group-committed) acquire before its first step;
- lazy (default): a FRESH start takes no lease during the grace (LOOM_LEASE_LAZY_GRACE, TTL/3);
  a run that finishes within it never touches the lease table. Resume and takeover
  (fresh=False) are always eager. The runtime calls begin() only after the sequence-0 bootstrap
  succeeded, so the loser of two racing starts of one id never gets a claim, a grace timer or a
  lease row.
"""

from __future__ import annotations

from django.db import connections

from journal import shards
from journal.flows.ownership import Claim, Companion, InlineLease, NoOwnership, set_ownership
from journal.models import Execution, Fence
from leases import conf
from leases.keeper import LeaseKeeper, get_keeper
from leases.models import Lease
from leases.store import store_for

_IN_TRANSACTION = NoOwnership()


class LeaseOwnership:
    @property
    def companion(self) -> Companion | None:
        """The lease CTEs the flows bootstrap and settle statements carry: the lease store's (PostgreSQL;
        None on SQLite, whose leases go through the keeper; see inline_lease)."""
        return store_for(self.alias).companion

    def __init__(self, mode: str, keeper: LeaseKeeper | None = None, alias: str | None = None):
        if mode not in ("eager", "lazy"):
            raise ValueError(f"LeaseOwnership mode must be eager or lazy, not {mode!r}")
        self.mode = mode
        self._keeper = keeper
        self._alias = alias  # a fixed database (tests); None: the shard the run's entry point bound

    @property
    def alias(self) -> str:
        """The database of the run's execution (and of its lease): journal/shards.py, bound by the flows
        entry point (start, resume...) to the execution's shard."""
        return self._alias or (self._keeper.alias if self._keeper else shards.home())

    @property
    def keeper(self) -> LeaseKeeper:
        return self._keeper or get_keeper(self.alias)

    def inline_lease(self) -> InlineLease | None:
        """Eager fresh starts on PostgreSQL write their lease in the bootstrap statement itself (and
        delete it in the settle): a run that settles before the keeper's next tick costs no lease
        statement and no hand-off to the keeper thread. A store without a companion (SQLite) keeps
        the keeper path (no round trip to save there); a run inside the caller's transaction takes no
        lease at all (see begin)."""
        if (self.mode != "eager" or store_for(self.alias).companion is None
                or connections[self.alias].in_atomic_block):
            return None
        keeper = self.keeper
        return InlineLease(keeper.worker_id, keeper.ttl())

    def begin(self, execution_id: str, fence_token: int, *, fresh: bool,
              lease: InlineLease | None = None) -> Claim:
        if lease is not None:  # written by the bootstrap statement: just renew it from now on
            return self.keeper.begin_inline(execution_id, fence_token, lease.sent_at)
        if connections[self.alias].in_atomic_block:
            # The run is inside the caller's transaction: nobody else can see the execution until
            # it commits (no sweeper can take it over), and if this process dies it rolls back
            # entirely. A lease written from the keeper's connection could not even see its fence.
            return _IN_TRANSACTION.begin(execution_id, fence_token, fresh=fresh)
        if fresh and self.mode == "lazy":
            return self.keeper.begin_lazy(execution_id, fence_token)
        return self.keeper.begin_eager(execution_id, fence_token)

    def live_owner(self, execution_id: str) -> str | None:
        """Who provably drives a running execution now, so that resume/hand-over must not take it
        over (docs/leases.md "Live"): an unexpired lease (database clock) held by another process, or held by
        this one for a run in progress here; or no lease row yet, fence token 1 or 2 (a fresh start, or a
        queued execution just begun: lazy runs only go unleased then) and a header younger than grace + TTL
        (the sweep's own orphan rule). A lease of this worker id that no run here holds is the recovery
        sweep's takeover, handed to the resume that follows: not live."""
        from django.db.models.functions import Now

        header = (Execution.objects.filter(pk=execution_id).annotate(db_now=Now())
                  .values_list("status", "updated_at", "db_now").first())
        if header is None or header[0] != "running":
            return None
        _, updated_at, now = header
        lease = Lease.objects.filter(execution_id=execution_id).values_list("owner_id", "expires_at").first()
        keeper = self.keeper
        with keeper.cond:
            here = any(c.execution_id == execution_id for c in (*keeper.held, *keeper.pending, *keeper.acquire_q))
        if here:
            return f"a run in this process ({keeper.worker_id})"
        if lease is not None:
            owner, expires_at = lease
            left = (expires_at - now).total_seconds()
            if left > 0 and owner != keeper.worker_id:
                return f"worker {owner} (lease expires in {left:.1f} s)"
            return None
        window = conf.lease_grace() + conf.get("LOOM_LEASE_TTL")
        # Token 1: a fresh start; token 2: a queued execution its runner began (journal/flows/queued.py: the
        # begin advanced from the enqueue's token 1, and the run leases lazily like a fresh start).
        if Fence.objects.current(execution_id) in (1, 2) and (now - updated_at).total_seconds() < window:
            return "a fresh run within its lazy-lease grace (no lease row yet)"
        return None


def drop_on_cancel(execution_id: str, alias: str) -> None:
    """journal.flows.runtime.CANCEL_HOOKS: a cancelled execution's lease row goes in the cancel's own
    transaction, whoever held it (a live run elsewhere, fenced off by the cancel, or a process that died).
    Left there, it stayed forever: the recovery sweep reads running executions only."""
    store_for(alias).drop_lease(execution_id)


def install(mode: str | None = None) -> str:
    """Install the ownership for `mode` (default: LOOM_LEASE_MODE) process-wide; returns the mode."""
    mode = mode or conf.get("LOOM_LEASE_MODE")
    set_ownership(None if mode == "off" else LeaseOwnership(mode))
    return mode
