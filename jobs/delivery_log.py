"""Delivery log retention: delete rows older than LEDGER_DELIVERY_LOG_SECONDS, in batches.

The log has its own retention, independent of receipts': it answers "who signed with
key K, from where" for the window an investigation needs. Each batch is its own short
transaction on the oldest ids (the (at, id) index finds them), so the intake's
inserts keep committing between batches.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, delete, select

from ledger.clock import Clock
from ledger.config import Settings
from ledger.db.schema import deliveries
from ledger.logs import get_logger
from ledger.metrics import PURGED_ROWS

log = get_logger("ledger.jobs.delivery_log")
BATCH_SIZE = 10_000


def purge_deliveries(engine: Engine, settings: Settings, clock: Clock, *,
                     batch_size: int = BATCH_SIZE) -> int:
    """Delete delivery log rows older than the log's retention; return how many."""
    cutoff = clock.now() - timedelta(seconds=settings.delivery_log_seconds)
    total = 0
    while True:
        oldest = (select(deliveries.c.id).where(deliveries.c.at < cutoff)
                  .order_by(deliveries.c.at, deliveries.c.id).limit(batch_size))
        with engine.begin() as conn:
            removed = conn.execute(
                delete(deliveries).where(deliveries.c.id.in_(oldest.scalar_subquery()))
            ).rowcount
        total += removed
        if removed < batch_size:
            break
    PURGED_ROWS.labels("deliveries").inc(total)
    log.info("delivery log purged", rows=total, cutoff=cutoff.isoformat())
    return total


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: purge the delivery log and return the rows removed."""
    return purge_deliveries(engine, settings, clock)
