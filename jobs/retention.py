"""Retention: expire finished receipts past the retention window, drop reviewed payloads.

This module runs the purge in its order; each step lives in the module of its concept:

- retention_payloads.py: failed payloads and kept conflict bodies past the review
  window, and the forensic window's expired bodies;
- retention_receipts.py: finished receipts past retention with their attempts,
  failed work item, unsigned-body record and conflicts (PostgreSQL walks heap-page
  windows, retention_windows.py);
- retention_scoped.py: the same on a distributed (Citus) ledger, scope by scope;
- retention_bookkeeping.py: run records, resolved findings, orphaned conflicts and
  old bulk-requeue members;
- retention_batching.py: every batch in its own short transaction with a bounded
  lock wait, paced (the Pacer) so that intake keeps its share of the machine;
- retention_preview.py: what the next scheduled purge will do (`ledger purge --preview`).

A replay after expiry finds nothing and becomes new work (the seed's stated
consequence, README "Operations: scheduled jobs").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from ledger.access import audit
from ledger.clock import Clock
from ledger.config import Settings
from ledger.db import citus
from ledger.errors import LedgerError
from ledger.logs import get_logger
from ledger.metrics import PURGED_ROWS

from . import retention_scoped as scoped
from .retention_batching import Pacer
from .retention_bookkeeping import (
    drop_expired_sender_tokens,
    drop_old_requeue_members,
    expire_bookkeeping,
)
from .retention_payloads import (
    count_expired_payloads,
    drop_expired_forensic_bodies,
    expire_conflict_bodies,
    expire_payloads,
)
from .retention_receipts import count_expired, expire_attempts_by_time, expire_receipts

log = get_logger("ledger.jobs.retention")
DEFAULT_BATCH_SIZE = 25_000


class PurgeImpossible(LedgerError):
    """The purge cannot work on this database; it says why instead of deleting nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeResult:
    """What a purge removed (or, with dry_run, would remove)."""

    expired_receipts: int
    payloads_dropped: int
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `ledger purge --json` object."""
        return {"expired_receipts": self.expired_receipts,
                "payloads_dropped": self.payloads_dropped, "dry_run": self.dry_run}


def purge(engine: Engine, settings: Settings, clock: Clock, *, dry_run: bool = False,
          batch_size: int = DEFAULT_BATCH_SIZE, actor: audit.Actor | None = None,
          on_batch: Callable[[int], None] | None = None,
          pacer: Pacer | None = None) -> PurgeResult:
    """Expire finished receipts past retention and drop failed payloads past review.

    Batches are paced by the operator's LEDGER_PURGE_DUTY_CYCLE unless `pacer` is given.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    pacer = pacer or Pacer(settings.purge_duty_cycle)
    now = clock.now()
    cutoff = now - timedelta(seconds=settings.retention_seconds)
    review_cutoff = now - timedelta(seconds=settings.review_window_seconds)
    if dry_run:
        with engine.connect() as conn:
            return PurgeResult(expired_receipts=count_expired(conn, cutoff),
                               payloads_dropped=count_expired_payloads(conn, review_cutoff),
                               dry_run=True)
    if _distributed(engine):
        dropped = scoped.scoped_payloads(engine, settings, review_cutoff, batch_size)
        expired = scoped.scoped_receipts(engine, settings, cutoff, batch_size, on_batch, pacer)
        expire_bookkeeping(engine, settings, cutoff, scoped_conflicts=True)
        _check_nothing_left(engine, cutoff, now)
        # On Citus a kept conflict body leaves with its conflict record at retention (the
        # batched cross-scope UPDATE below cannot be routed to one shard): README, Limits.
        bodies = 0
    else:
        # Payloads first: a failed work item past retention is also past review, so each
        # dropped payload is counted once, whichever step removes it.
        dropped = expire_payloads(engine, settings, review_cutoff, batch_size)
        bodies = expire_conflict_bodies(engine, settings, review_cutoff, batch_size)
        expire_attempts_by_time(engine, settings, cutoff, batch_size, pacer)
        expired = expire_receipts(engine, settings, cutoff, batch_size, on_batch, pacer)
        expire_bookkeeping(engine, settings, cutoff)
    bodies += drop_expired_forensic_bodies(engine, now, batch_size)
    PURGED_ROWS.labels("sender_tokens").inc(drop_expired_sender_tokens(engine, now, batch_size))
    drop_old_requeue_members(engine, cutoff)
    result = PurgeResult(expired_receipts=expired, payloads_dropped=dropped, dry_run=False)
    if actor is not None and (expired or dropped):
        with engine.begin() as conn:
            audit.record(conn, actor, "receipts.purge", "receipts", at=clock.now(),
                         detail={**result.to_json(), "cutoff": cutoff.isoformat()})
    log.info("purge done", expired_receipts=expired, payloads_dropped=dropped,
             conflict_bodies_dropped=bodies, cutoff=cutoff.isoformat())
    return result


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: purge and return the rows affected."""
    result = purge(engine, settings, clock, actor=audit.Actor(name="scheduler", role="system"))
    return result.expired_receipts + result.payloads_dropped


def _distributed(engine: Engine) -> bool:
    """Tell, afresh, whether the ledger is distributed; refuse a half-distributed one."""
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as conn:
        layout = citus.layout(conn)
    problems = layout.problems()
    if problems:
        raise PurgeImpossible("the ledger is partly distributed, so neither the page-window "
                              "purge nor the per-scope purge would find every expired row: "
                              + "; ".join(problems) + " (run `ledger db distribute`)")
    return layout.distributed


def _check_nothing_left(engine: Engine, cutoff: datetime, started: datetime) -> None:
    """Raise when expired receipts that finished before the purge began are still there."""
    with engine.connect() as conn:
        left = scoped.left_behind(conn, cutoff, started)
    if left:
        raise PurgeImpossible(f"{left} expired receipts are still there after the purge "
                              "(finished before it began, accepted before the cutoff)")
