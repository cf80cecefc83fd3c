"""How every retention batch runs: its own short transaction, a bounded lock wait, paced.

Every batch of the purge commits on its own with `lock_timeout` set, so intake keeps
committing between and during batches; a batch that waited too long for a row lock
is retried a few times. The Pacer leaves the intake its share of the machine
(LEDGER_PURGE_DUTY_CYCLE).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Connection, Engine, Table, delete, select, tuple_
from sqlalchemy import exc as sa_exc

from ledger.config import DEFAULT_DUTY_CYCLE, Settings, check_duty_cycle
from ledger.logs import get_logger

log = get_logger("ledger.jobs.retention")
_T = TypeVar("_T")
LOCK_RETRIES = 3


@dataclass(slots=True)
class Pacer:
    """Keep the purge's batches to a share of wall time, leaving the rest to the intake.

    After a batch that took t seconds it sleeps t * (1 / duty_cycle - 1): at 0.5
    the purge runs half the time at full speed. On 2 cores a full-speed purge
    takes the CPU a CPU-bound intake needs.
    """

    duty_cycle: float = DEFAULT_DUTY_CYCLE
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        check_duty_cycle(self.duty_cycle)

    def rest(self, busy_seconds: float) -> None:
        """Sleep after a batch that kept the database busy for `busy_seconds`."""
        if self.duty_cycle < 1 and busy_seconds > 0:
            self.sleep(busy_seconds * (1 / self.duty_cycle - 1))


def run_batch(engine: Engine, settings: Settings, step: Callable[[Connection], _T],
                       pacer: Pacer | None = None) -> _T:
    """Run `step` in its own transaction (retried on a lock timeout), then pace the next one."""
    for attempt in range(LOCK_RETRIES):
        started = time.perf_counter()
        try:
            with engine.begin() as conn:
                _set_lock_timeout(conn, settings)
                out = step(conn)
            if pacer is not None:
                pacer.rest(time.perf_counter() - started)
            return out
        except sa_exc.OperationalError as error:
            if attempt == LOCK_RETRIES - 1 or not _is_lock_timeout(error):
                raise
            log.warning("purge batch waited too long for a lock; retrying", attempt=attempt + 1)
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _is_lock_timeout(error: sa_exc.OperationalError) -> bool:
    """Tell a lock wait timeout (PostgreSQL 55P03, SQLite busy) from other failures."""
    code = getattr(error.orig, "sqlstate", None)
    return code == "55P03" or "database is locked" in str(error.orig)


def _set_lock_timeout(conn: Connection, settings: Settings) -> None:
    """Bound how long a batch waits for a row lock (PostgreSQL; SQLite has busy_timeout)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(settings.lock_timeout_ms)}")


def delete_expired(engine: Engine, table: Table, key: tuple[str, ...], now: datetime,
                   batch_size: int) -> int:
    """Delete `table`'s rows whose `expires_at` has passed, batch by batch (each its own
    transaction, picked by their `key` columns); return how many."""
    total = 0
    columns = [table.c[name] for name in key]
    while True:
        picked = select(*columns).where(table.c.expires_at < now).limit(batch_size)
        with engine.begin() as conn:
            count = int(conn.execute(delete(table).where(tuple_(*columns).in_(picked))).rowcount)
        total += count
        if count < batch_size:
            return total
