"""The delivery log: who sent what to /hooks/, including what was refused (README "Delivery log").

Every request the intake answers becomes one `Delivery`. Writing it must cost the
intake almost nothing and a flood of forged requests must not grow the table
without bound, so:

- rows are buffered in memory and written by a daemon thread every
  FLUSH_SECONDS, never on the request's path, never in the claim's transaction:
  one COPY on PostgreSQL (less client CPU per row than SQLAlchemy's
  executemany, and the flusher shares its process with the intake), one
  multi-row INSERT on SQLite;
- authenticated deliveries (accepted, duplicate, conflict, and a signed body
  that failed validation) always get an exact row: each needs a valid key, so
  their volume is the sender's own, and an accepted one writes a receipt anyway;
- refusals of unauthenticated requests (401, 404, 413, an unreadable body) get
  exact rows at `refusals_per_minute` per process for each (integration,
  matched dead key) pair, a token bucket that starts with STARTING_TOKENS;
  beyond it they are only counted, and the count is written once per minute as
  one row with `count` = N;
- refusals that no key signed at all also share one bucket per process of
  TOTAL_REFUSAL_FACTOR x `refusals_per_minute`: a flood spread over every public
  integration id gets no more exact rows than a flood on one.

So one process writes at most TOTAL_REFUSAL_FACTOR x `refusals_per_minute` exact
rows for unsigned refusals in all, `refusals_per_minute` for each dead key, plus
one count row per refusal reason per minute for each integration and dead key,
whatever the flood's rate or how many integration ids it uses, and STARTING_TOKENS
more per bucket in each new process life (gunicorn's max_requests recycling). If
the database is away, the buffer stops growing at MAX_BUFFERED rows and further
rows are dropped (and counted in metrics).
"""

from __future__ import annotations

import operator
import os
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert

from ledger import metrics
from ledger.clock import Clock
from ledger.db.driver import run_pooled, time_to_driver
from ledger.db.schema import deliveries
from ledger.logs import get_logger

log = get_logger("ledger.delivery_log")
FLUSH_SECONDS = 0.5
MAX_BUFFERED = 20_000
MAX_REASON = 300
STARTING_TOKENS = 5
TOTAL_REFUSAL_FACTOR = 2
# The bucket every refusal that no key signed also draws from.
_UNSIGNED: BucketKey = (-1, None)
# Key of a token bucket: (integration id, matched key id); (None, None) for unknown paths.
BucketKey = tuple[int | None, str | None]
# The COPY's columns: every one of the table's but its id, which Delivery.row fills.
_COLUMNS = tuple(c.name for c in deliveries.columns if c.name != "id")
_COPY = f"COPY deliveries ({', '.join(_COLUMNS)}) FROM STDIN"
_VALUES = operator.itemgetter(*_COLUMNS)
_AT = _COLUMNS.index("at")


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One request to /hooks/ as the log keeps it: never a body, signature or secret."""

    at: datetime
    integration_id: int | None
    public_id: str | None
    outcome: str
    http_status: int
    key_id: str | None = None
    event_id: str | None = None
    client: str | None = None
    reason: str | None = None
    # True when a key signed the request: such rows are never rate-limited.
    authenticated: bool = False
    # From the request reaching the intake to its answer: body read, checks, commit.
    latency_us: int | None = None

    def row(self, count: int = 1) -> dict[str, Any]:
        """Return the deliveries row of this delivery."""
        reason = self.reason[:MAX_REASON] if self.reason else None
        return {"at": self.at, "integration_id": self.integration_id,
                "public_id": self.public_id, "outcome": self.outcome,
                "http_status": self.http_status, "key_id": self.key_id,
                "event_id": self.event_id, "client": self.client, "reason": reason,
                "count": count, "latency_us": self.latency_us}


class _Bucket:
    """A token bucket: `rate` tokens per minute, at most `rate` saved up.

    A new bucket holds only STARTING_TOKENS: a process that gunicorn recycles
    (max_requests) every few thousand requests must not bring a full minute's
    worth of rows with each new life.
    """

    __slots__ = ("_tokens", "_updated")

    def __init__(self, rate: int, now: float) -> None:
        self._tokens = float(min(rate, STARTING_TOKENS))
        self._updated = now

    def take(self, rate: int, now: float) -> bool:
        self._tokens = min(float(rate), self._tokens + (now - self._updated) * rate / 60)
        self._updated = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class DeliveryLog:
    """Buffers deliveries and writes them in batches from a daemon thread."""

    def __init__(self, engine: Engine, clock: Clock, *, enabled: bool,
                 refusals_per_minute: int, flush_seconds: float = FLUSH_SECONDS) -> None:
        self._engine = engine
        self._write = (self._copy if engine.dialect.name == "postgresql"
                       else self._insert)
        self._at_to_driver = time_to_driver(engine.dialect)
        self._clock = clock
        self.enabled = enabled
        self._rate = refusals_per_minute
        self._flush_seconds = flush_seconds
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._buckets: dict[BucketKey, _Bucket] = {}
        # (minute, delivery without time and client) -> [count, newest delivery]
        self._counted: dict[tuple[datetime, Delivery], list[Any]] = {}
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, delivery: Delivery) -> None:
        """Keep one delivery: an exact row, or a count once its bucket is empty."""
        if not self.enabled:
            return
        with self._lock:
            if delivery.authenticated or self._take(delivery):
                if len(self._rows) >= MAX_BUFFERED:
                    metrics.DELIVERY_LOG_ROWS.labels("dropped").inc()
                    return
                self._rows.append(delivery.row())
            else:
                minute = delivery.at.replace(second=0, microsecond=0)
                # A counted row keeps no client or latency: they differ request by request.
                key = (minute, replace(delivery, at=minute, client=None, latency_us=None,
                                       public_id=None if delivery.integration_id is None
                                       else delivery.public_id))
                entry = self._counted.setdefault(key, [0, delivery])
                entry[0] += 1
                entry[1] = delivery
                metrics.DELIVERY_LOG_ROWS.labels("counted").inc()
        self._ensure_started()

    def _take(self, delivery: Delivery) -> bool:
        """Take a token from the delivery's bucket, and the shared unsigned one (under the lock)."""
        now = time.monotonic()
        if not self._bucket((delivery.integration_id, delivery.key_id), self._rate, now):
            return False
        # A dead key's refusals are a leak to investigate: only their own bucket bounds them.
        return delivery.key_id is not None or self._bucket(
            _UNSIGNED, TOTAL_REFUSAL_FACTOR * self._rate, now)

    def _bucket(self, key: BucketKey, rate: int, now: float) -> bool:
        """Take a token from one bucket, made on first use."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) > 100_000:  # forget idle buckets rather than grow
                self._buckets.clear()
            bucket = self._buckets[key] = _Bucket(rate, now)
        return bucket.take(rate, now)

    def flush(self, *, everything: bool = False) -> int:
        """Write the buffered rows, and the counts of minutes that ended (all if `everything`)."""
        this_minute = self._clock.now().replace(second=0, microsecond=0)
        with self._lock:
            rows, self._rows = self._rows, []
            done = [k for k in self._counted if everything or k[0] < this_minute]
            for key in done:
                count, newest = self._counted.pop(key)
                row = newest.row(count)
                row["public_id"], row["latency_us"] = key[1].public_id, None
                rows.append(row)
        if not rows:
            return 0
        try:
            self._write(rows)
        except Exception as error:  # never let the log hurt the intake; say so and go on
            metrics.DELIVERY_LOG_ROWS.labels("dropped").inc(len(rows))
            log.warning("delivery_log.flush_failed", rows=len(rows),
                        error=type(error).__name__)
            return 0
        metrics.DELIVERY_LOG_ROWS.labels("written").inc(len(rows))
        return len(rows)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        """Write rows in one multi-row INSERT (SQLite)."""
        with self._engine.begin() as conn:
            conn.execute(insert(deliveries), rows)

    def _copy(self, rows: list[dict[str, Any]]) -> None:
        """Write rows in one COPY on a pooled psycopg connection, committed (PostgreSQL)."""
        run_pooled(self._engine, self._copy_on, rows, what="the delivery log's COPY")

    def _copy_on(self, driver_connection: Any, rows: list[dict[str, Any]]) -> None:
        to_driver = self._at_to_driver
        with driver_connection.cursor() as cursor, cursor.copy(_COPY) as copy:
            for row in rows:
                values = list(_VALUES(row))
                values[_AT] = to_driver(values[_AT])
                copy.write_row(values)
        driver_connection.commit()

    def _ensure_started(self) -> None:
        """Start the flusher in this process (idempotent; restarts after a fork)."""
        if self._pid == os.getpid() or self._stop.is_set():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="ledger-delivery-log",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """Flush every FLUSH_SECONDS until stopped."""
        while not self._stop.wait(self._flush_seconds):
            self.flush()

    def close(self) -> None:
        """Stop the flusher and write everything still buffered (best effort)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and self._pid == os.getpid():
            thread.join(timeout=5)
        self.flush(everything=True)
