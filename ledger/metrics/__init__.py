"""Prometheus metrics. With PROMETHEUS_MULTIPROC_DIR set, values aggregate over processes."""

from __future__ import annotations

import os

from prometheus_client import Counter, Histogram

from ledger.config import metrics_multiproc_dir

# In multiprocess mode the unlabelled metrics below open their files as they are
# defined: make sure the directory exists (a worker may start before gunicorn).
if (_MULTIPROC_DIR := metrics_multiproc_dir()) is not None:
    os.makedirs(_MULTIPROC_DIR, exist_ok=True)

DELIVERIES = Counter(
    "ledger_deliveries_total", "Deliveries answered by the intake, by outcome",
    ["outcome"],
)
INTAKE_LATENCY = Histogram(
    "ledger_intake_seconds", "Time from body read to answer",
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
AUTH_FAILURES = Counter(
    "ledger_auth_failures_total", "Deliveries refused as unauthenticated, by reason",
    ["reason"],
)
DEAD_KEY_USE = Counter(
    "ledger_dead_key_use_total", "Deliveries signed with a revoked or expired key",
    ["state"],
)
ATTEMPTS = Counter(
    "ledger_attempts_total",
    "Handler attempts by event type and outcome (no Python handler: event type "
    "'forwarded' when a destination ran it, else 'unhandled')",
    ["event_type", "outcome"],
)
TERMINAL_FAILURES = Counter(
    "ledger_terminal_failures_total",
    "Receipts that became failed, by event type (labelled as ledger_attempts_total)",
    ["event_type"],
)
DELIVERY_LOG_ROWS = Counter(
    "ledger_delivery_log_rows_total",
    "Delivery log: exact rows written, refusals only counted (over the rate), rows dropped",
    ["kind"],
)
PURGED_ROWS = Counter("ledger_purged_rows_total", "Rows removed by the purge", ["kind"])
SCHEDULER_RUNS = Counter(
    "ledger_scheduler_runs_total", "Scheduled job runs by job and outcome", ["job", "outcome"],
)
# SQLite's one writer (ledger.db.writer_turns): every write transaction of every ledger
# process on the host takes its turn in one line. rate(held_seconds_sum) is the share of
# the time the one writer was busy: near 1, more load only lengthens the waits.
_TURN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
SQLITE_WRITER_WAIT = Histogram(
    "ledger_sqlite_writer_wait_seconds",
    "SQLite: time a write transaction waited for its writer turn", buckets=_TURN_BUCKETS,
)
SQLITE_WRITER_HELD = Histogram(
    "ledger_sqlite_writer_held_seconds",
    "SQLite: time a writer turn was held (its transaction, commit included)",
    buckets=_TURN_BUCKETS,
)
SQLITE_WRITER_SKIPPED = Counter(
    "ledger_sqlite_writer_turns_skipped_total",
    "SQLite: write transactions that went on without their turn, a holder's process not"
    " running (stopped, frozen)",
)
SQLITE_CLAIMS_PER_COMMIT = Histogram(
    "ledger_sqlite_claims_per_commit",
    "SQLite: intake claims written by one transaction (group commit)",
    buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64),
)
