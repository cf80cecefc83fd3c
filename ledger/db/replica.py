"""Reads on a PostgreSQL streaming replica, with its lag, and the fall back to the primary.

Only the dashboard's and the API's reads come here (ledger.web.read_source); every
write, action, login and check that must see its own write uses the primary engine.
A read first measures the replica's lag on the connection it will read from; it goes
to the primary instead when the replica is unreachable (then the replica is left
alone for RETRY_SECONDS, so pages do not each wait for a connect timeout), when the
lag is over the configured bound, when the replica has not replayed the caller's own
last write yet, or when the replica fails during the read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy import exc as sa_exc

from ledger.logs import get_logger

log = get_logger("ledger.replica")
T = TypeVar("T")
# After a failure, how long reads skip the replica before trying it again.
RETRY_SECONDS = 5.0

# Lag as the replica knows it. Caught up (0) when it has replayed all the WAL it received
# while streaming: on an idle primary nothing new arrives and the last replayed commit
# ages, so its age alone would show a growing lag that is not there. Otherwise the age of
# the last replayed commit (NULL before any replay since the standby started). A server
# not in recovery (a promoted standby, or the primary itself) is current: 0. A role
# without pg_read_all_stats sees the WAL receiver's pid but not its status: a running
# receiver then counts as streaming.
LAG_SQL = text("""
SELECT pg_is_in_recovery() AS standby,
       EXISTS (SELECT 1 FROM pg_stat_wal_receiver
               WHERE coalesce(status, 'streaming') = 'streaming') AS streaming,
       pg_last_wal_receive_lsn() IS NOT NULL
         AND pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn() AS caught_up,
       EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8 AS replay_age
""")
# Whether the replica has replayed a given primary position (read-your-writes).
REPLAYED_SQL = text("SELECT pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn)")
PRIMARY_LSN_SQL = text("SELECT pg_current_wal_lsn()::text")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadSource:
    """Where one request's reads ran, how far behind that was, and why."""

    replica: bool  # True: read from the replica
    lag_seconds: float | None = None  # the replica's lag; None when unknown
    note: str | None = None  # why the primary was read, or what is unknown about the lag


def measure_lag(conn: Connection) -> tuple[float | None, str | None]:
    """Return the replica's lag in seconds (None when unknown) and a note when it is unknown."""
    row = conn.execute(LAG_SQL).one()
    if not row.standby:
        return 0.0, None
    if row.streaming and row.caught_up:
        return 0.0, None
    if row.replay_age is None:
        return None, "no replay yet since the replica started: its lag is unknown"
    note = None if row.streaming else "the replica is not streaming from the primary"
    return max(0.0, float(row.replay_age)), note


def primary_position(conn: Connection) -> str:
    """Return the primary's current WAL position (after a write: what a replica must reach)."""
    return str(conn.execute(PRIMARY_LSN_SQL).scalar_one())


class ReplicaReads:
    """Runs read functions on the replica when it is fit to serve them, else on the primary."""

    def __init__(self, primary: Engine, replica: Engine | None, *,
                 max_lag_seconds: float | None = None, snapshot: Engine | None = None) -> None:
        self.primary, self.replica = primary, replica
        # Where a read runs on the primary database: on SQLite an engine of snapshots that
        # take no writer turn (ledger.db.engine.snapshot_engine), else the primary's own.
        self.local = snapshot if snapshot is not None else primary
        self.max_lag_seconds = max_lag_seconds
        self._lock = threading.Lock()
        self._skip_until = 0.0  # monotonic: the replica failed; not tried again before

    def run(self, read: Callable[[Connection], T], *, wrote_at: str | None = None
            ) -> tuple[T, ReadSource]:
        """Run `read(conn)` on the replica or the primary; return its result and where it ran.

        `wrote_at`: the primary position of the caller's last write; the replica serves
        only once it has replayed that far.
        """
        if self.replica is None:
            return self._on_primary(read, None)
        if time.monotonic() < self._skip_until:
            return self._on_primary(read, f"the replica failed less than {RETRY_SECONDS:g} s "
                                          "ago")
        try:
            with self.replica.connect() as conn:
                lag, note = measure_lag(conn)
                refusal = self._refusal(conn, lag, wrote_at)
                if refusal is None:
                    return read(conn), ReadSource(replica=True, lag_seconds=lag, note=note)
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as error:
            self._failed(error)
            return self._on_primary(read, "the replica is unreachable")
        return self._on_primary(read, refusal, lag)

    def _refusal(self, conn: Connection, lag: float | None, wrote_at: str | None) -> str | None:
        """Return why this replica must not serve now, or None when it may."""
        bound = self.max_lag_seconds
        if bound is not None and lag is None:
            return f"the replica's lag is unknown and LEDGER_READ_MAX_LAG_SECONDS is {bound} s"
        if bound is not None and lag is not None and lag > bound:
            return f"the replica is more than LEDGER_READ_MAX_LAG_SECONDS ({bound} s) behind"
        if wrote_at is not None and not conn.execute(REPLAYED_SQL, {"lsn": wrote_at}).scalar():
            return "your last change has not reached the replica yet"
        return None

    def _failed(self, error: BaseException) -> None:
        """Skip the replica for RETRY_SECONDS after a failure (and say so once per failure)."""
        with self._lock:
            self._skip_until = time.monotonic() + RETRY_SECONDS
        log.warning("replica.unavailable", error_class=type(error).__name__,
                    retry_in_seconds=RETRY_SECONDS)

    def _on_primary(self, read: Callable[[Connection], T], note: str | None,
                    lag: float | None = None) -> tuple[T, ReadSource]:
        """Run `read` on the primary."""
        with self.local.connect() as conn:
            return read(conn), ReadSource(replica=False, lag_seconds=lag, note=note)
