"""Table definitions for SQLAlchemy Core. Alembic (ledger/db/migrations/) owns the real schema.

These tables say what the migrated databases hold: tests/integration/test_schema_drift.py
runs Alembic's autogenerate comparison against a migrated SQLite and PostgreSQL database
and fails on any difference, so `alembic revision --autogenerate` starts from an empty diff.

Design notes:
- `receipts` is the hot, long-lived table. The scope is an integer (the
  integration's id), the state a small integer, and nothing references
  receipts with a foreign key: a per-row FK check makes the retention purge
  about 7x slower. The integrity sweep (jobs/) finds orphans instead.
- The last error of a failed receipt lives on its newest `attempts` row, so a
  complete receipt has no NULL column and no null bitmap in its heap tuple.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.types import TypeDecorator

metadata = MetaData()


def only_on(dialect: str, index: Index) -> Index:
    """Declare an index that the migrations create on one database only."""
    index.info["only_on"] = dialect
    return index.ddl_if(dialect=dialect)


def autogenerate_options(dialect: str) -> dict[str, Any]:
    """Return the options of Alembic's autogenerate comparison on a `dialect` database."""
    return {"compare_type": True, "compare_server_default": True,
            "include_object": _include_object_on(dialect)}


def _include_object_on(dialect: str) -> Callable[..., bool]:
    """Return an include_object hook that leaves out the other database's indexes.

    Autogenerate ignores `ddl_if`: without this hook it would ask for the
    PostgreSQL BRIN index (attempts.started_at) on SQLite. Reflected objects
    are always compared, so an index that a database has and these tables lack
    still shows as drift.
    """
    def include_object(obj: Any, _name: str | None, type_: str, reflected: bool,
                       _compare_to: Any) -> bool:
        if type_ == "index" and not reflected:
            return bool(obj.info.get("only_on", dialect) == dialect)
        return True

    return include_object


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python; timestamptz on PostgreSQL, naive UTC text on SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        """Refuse naive datetimes and store UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime refused: use timezone-aware UTC")
        value = value.astimezone(UTC)
        if getattr(dialect, "name", "") == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        """Return aware UTC whatever the driver gave."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


integrations = Table(
    "integrations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", Text, nullable=False, unique=True),
    Column("account", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("profile", Text, nullable=False),
    Column("tolerance_seconds", Integer, nullable=False),
    Column("max_body_bytes", Integer),
    Column("sandbox", Boolean, nullable=False, default=False, server_default=false()),
    Column("created_at", UTCDateTime, nullable=False),
    # Profile settings (0004_profiles): where the type is, the endpoint URL a
    # sender signs (Twilio, Square), the `hmac` profile's options as JSON.
    Column("type_path", Text),
    Column("fixed_event_type", Text),
    Column("endpoint_url", Text),
    Column("hmac_options", Text),
    UniqueConstraint("account", "name", name="uq_integrations_scope"),
)

credentials = Table(
    "credentials",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key_id", Text, nullable=False, unique=True),
    Column("integration_id", Integer, nullable=False, index=True),
    Column("secret_enc", Text, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime),
    Column("revoked_at", UTCDateTime),
    Column("revoked_reason", Text),
    # An operator's name for the key ("CI deploy key", "Stripe dashboard, Dec"): optional.
    Column("label", Text),
)

receipts = Table(
    "receipts",
    metadata,
    # Column order keeps 8-byte fields first so the tuple carries no padding.
    Column("accepted_at", UTCDateTime, nullable=False),
    Column("completed_at", UTCDateTime),
    Column("scope_id", Integer, primary_key=True),
    Column("state", SmallInteger, nullable=False),
    Column("attempts", SmallInteger, nullable=False),
    Column("event_id", Text, primary_key=True),
    Column("event_type", Text, nullable=False),
    Column("body_sha256", LargeBinary(32), nullable=False),
    Column("result_ref", Text),
)
# A btree on accepted_at serves the newest-first lists (a backward scan; the rare ties
# are put in (scope_id, event_id) order by an incremental sort), time windows, the
# purge and the rollups' bands. It was a BRIN on PostgreSQL until 0012: once new
# receipts land in the free space of old pages (after VACUUM, after every retention
# purge) a BRIN range spans old to new and a one-hour window reads the whole table.
# It costs ~22 B per receipt.
Index("ix_receipts_accepted", receipts.c.accepted_at)
# Only unfinished receipts (pending, failed) are indexed by state: complete ones,
# the vast majority, cost nothing here. On PostgreSQL it carries scope_id and
# completed_at, so the rollups count the unfinished and the failed receipts every run
# by an index-only scan (0016).
Index("ix_receipts_open", receipts.c.state, receipts.c.accepted_at,
      postgresql_where=receipts.c.state != 1, sqlite_where=receipts.c.state != 1,
      postgresql_include=["scope_id", "completed_at"])

jobs = Table(
    "jobs",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("event_id", Text, primary_key=True),
    Column("event_type", Text, nullable=False),
    Column("accepted_at", UTCDateTime, nullable=False),
    # When the work item may next be claimed. A claim pushes it to the lease's end,
    # so an expired lease needs no separate condition to become claimable.
    Column("run_at", UTCDateTime, nullable=False),
    Column("status", SmallInteger, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("lease_token", BigInteger, nullable=False),
    Column("leased_by", Text),
    Column("leased_until", UTCDateTime),
    Column("payload", Text),
    # The sender's Content-Type as received (printable, at most 255 characters; NULL when
    # absent or unusable) and, for a form sender, its body as received: `payload` holds the
    # decoded fields handlers read, a destination forwards these (CONTRACT section 8).
    Column("content_type", Text),
    Column("raw_body", Text),
)
Index("ix_jobs_due", jobs.c.run_at, postgresql_where=jobs.c.status == 0,
      sqlite_where=jobs.c.status == 0)
# The claim's pick of one scope's due work items, oldest first (ledger/worker/sql.py,
# CLAIM_SQL). SQLite has one writer, so its batches never wait on each other's
# rows and it claims plainly oldest first (ledger/worker/store.py).
only_on("postgresql", Index("ix_jobs_scope_due", jobs.c.scope_id, jobs.c.run_at,
                            postgresql_where=jobs.c.status == 0))

# Bodies accepted under profiles whose event id is not signed (GitHub): the
# same body under a fresh id is a replay of the original, not new work.
unsigned_bodies = Table(
    "unsigned_bodies",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("body_sha256", LargeBinary(32), primary_key=True),
    Column("event_id", Text, nullable=False),
    Column("accepted_at", UTCDateTime, nullable=False),
)

# The signature tokens of a sender whose signature covers a token, not the event (Mailgun),
# each with the event it carried, kept until its signed timestamp leaves the freshness
# window (`expires_at`): the token under another event is refused, not accepted.
sender_tokens = Table(
    "sender_tokens",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("token", Text, primary_key=True),
    Column("event_id", Text, nullable=False),
    Column("body_sha256", LargeBinary(32), nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
)
Index("ix_sender_tokens_expires", sender_tokens.c.expires_at)

# conflicts and attempts: primary key (id, scope_id) on PostgreSQL, so that Citus can
# distribute them by scope (migration 0005); on SQLite `id` alone stays the INTEGER
# PRIMARY KEY that SQLite numbers itself (Alembic's comparison ignores primary keys).
conflicts = Table(
    "conflicts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("scope_id", Integer, primary_key=True, autoincrement=False),
    Column("event_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("original_event_id", Text, nullable=False),
    Column("original_sha256", LargeBinary(32), nullable=False),
    Column("incoming_sha256", LargeBinary(32), nullable=False),
    Column("first_seen", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
    Column("count", Integer, nullable=False),
    Column("acknowledged_at", UTCDateTime),
    Column("acknowledged_by", Text),
    Column("ack_note", Text),
    # The conflicting body, kept (up to CONFLICT_BODY_LIMIT bytes) for the payload
    # review window so an operator can see what differs; the retention purge drops it.
    Column("incoming_body", Text),
    Column("incoming_size", Integer),
    UniqueConstraint("scope_id", "event_id", "incoming_sha256", name="uq_conflicts_delivery"),
)
Index("ix_conflicts_last_seen", conflicts.c.last_seen)

# The forensic window (LEDGER_CONFLICT_BODY_SECONDS, off by default): the original body of
# a completed receipt, kept apart from the work item (which leaves when it completes) so that a
# later conflict on its event id can be diffed; the retention purge drops expired rows.
conflict_bodies = Table(
    "conflict_bodies",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("event_id", Text, primary_key=True),
    Column("body", Text, nullable=False),
    Column("kept_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
)
Index("ix_conflict_bodies_expires", conflict_bodies.c.expires_at)

# The receipts one bulk requeue ("Requeue group…", "Requeue all") requeued, so that its
# follow-through (complete / pending / failed again) can be counted; purged with retention.
requeue_members = Table(
    "requeue_members",
    metadata,
    Column("batch_id", Text, primary_key=True),
    Column("scope_id", Integer, primary_key=True),
    Column("event_id", Text, primary_key=True),
    Column("requeued_at", UTCDateTime, nullable=False),
)
Index("ix_requeue_members_at", requeue_members.c.requeued_at)

# Revocation evidence (jobs/credential_jobs.py): the first refresh of each live web
# instance seen at or after a revocation, so the Credentials page can say "refreshed on
# N of N web instances, slowest X s" after the fact.
revocation_refreshes = Table(
    "revocation_refreshes",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("instance_id", Text, primary_key=True),
    Column("refreshed_at", UTCDateTime, nullable=False),
    Column("seen_at", UTCDateTime, nullable=False),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("scope_id", Integer, primary_key=True, autoincrement=False),
    Column("event_id", Text, nullable=False),
    Column("number", Integer, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("lease_token", BigInteger, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    Column("outcome", Text),
    Column("error", Text),
)
Index("ix_attempts_receipt", attempts.c.scope_id, attempts.c.event_id, attempts.c.number)
# PostgreSQL only (the migration skips it on SQLite): the retention purge's time range.
only_on("postgresql", Index("ix_attempts_started_brin", attempts.c.started_at,
                            postgresql_using="brin"))

demo_balances = Table(
    "demo_balances",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("balance", BigInteger, nullable=False),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("scope", Text),
    Column("reason", Text),
    Column("request_id", Text),
    Column("detail", Text),
    Column("prev_hash", Text, nullable=False),
    Column("row_hash", Text, nullable=False),
)
Index("ix_audit_at", audit_log.c.at)
Index("ix_audit_action", audit_log.c.action, audit_log.c.id)

operators = Table(
    "operators",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("username", Text, nullable=False, unique=True),
    Column("role", Text, nullable=False),
    Column("password_hash", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("disabled_at", UTCDateTime),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("operator_id", Integer, nullable=False, index=True),
    Column("token_sha256", LargeBinary(32), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime),
    Column("last_used_at", UTCDateTime),
    # Public, non-secret name of the token (`tok_…`): listing and revocation use it.
    Column("public_id", Text, nullable=False, unique=True),
    # Space-separated: "read" or "read write".
    Column("scopes", Text, nullable=False, server_default="read"),
    Column("expires_at", UTCDateTime, nullable=False),
    # The primary's WAL position after this token's last write (a pg_lsn as text): its
    # reads go to the primary until a read replica has replayed that far.
    Column("wrote_at", Text),
)

# Dashboard sessions: the cookie holds a random id, the server keeps only its
# hash, so logout, a role change or disabling an operator ends it at once.
operator_sessions = Table(
    "operator_sessions",
    metadata,
    Column("id_sha256", LargeBinary(32), primary_key=True),
    Column("operator_id", Integer, nullable=False, index=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime),
    # Wrong password re-entries (rotate, revoke, …) in a row in this session only.
    Column("reauth_failures", Integer, nullable=False, server_default="0"),
)

# Failed dashboard logins per (username, client address), shared by every process.
login_failures = Table(
    "login_failures",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", Text, nullable=False),
    Column("at", UTCDateTime, nullable=False),
)
Index("ix_login_failures_key_at", login_failures.c.key, login_failures.c.at)

instances = Table(
    "instances",
    metadata,
    Column("id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    Column("credentials_refreshed_at", UTCDateTime),
    Column("handles", Text),  # a worker's event types, a JSON array (0020)
)

scheduler_runs = Table(
    "scheduler_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job", Text, nullable=False),
    Column("period_start", UTCDateTime, nullable=False),
    Column("instance", Text, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    Column("outcome", Text, nullable=False),
    Column("rows_affected", BigInteger),
    Column("error", Text),
    # While 'running': the holder renews this; past it, the holder is gone (abandoned).
    Column("leased_until", UTCDateTime),
    UniqueConstraint("job", "period_start", name="uq_scheduler_runs_period"),
)
# The runs still 'running', for the abandoned-run check (the table keeps every period).
Index("ix_scheduler_runs_running", scheduler_runs.c.job,
      postgresql_where=scheduler_runs.c.outcome == "running",
      sqlite_where=scheduler_runs.c.outcome == "running")

findings = Table(
    "findings",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("detail", Text),
    Column("first_seen", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
    Column("resolved_at", UTCDateTime),
    UniqueConstraint("kind", "subject", name="uq_findings_subject"),
)

scope_counts = Table(
    "scope_counts",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("state", SmallInteger, primary_key=True),
    Column("count", BigInteger, nullable=False),
    Column("oldest_accepted_at", UTCDateTime),
    Column("refreshed_at", UTCDateTime, nullable=False),
)

# Receipts per scope accepted in [settled_from, settled_until): a band no purge can
# reach yet and no intake transaction still writes into, so jobs/rollups.py adds
# only what entered and subtracts only what left it since its last run.
# The band's bounds, the run that moved them and the last full recount live in
# one row of rollup_marks (name 'scope_totals').
scope_totals = Table(
    "scope_totals",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("settled", BigInteger, nullable=False),
)

ROLLUP_MARK = "scope_totals"  # the rollup_marks row of jobs/rollups.py's scope counts
rollup_marks = Table(
    "rollup_marks",
    metadata,
    Column("name", Text, primary_key=True),
    Column("settled_from", UTCDateTime, nullable=False),
    Column("settled_until", UTCDateTime, nullable=False),
    Column("counted_at", UTCDateTime, nullable=False),
    Column("recounted_at", UTCDateTime, nullable=False),
    # The hour index the rollup's last run recounted whole (jobs/rollup_series.py); NULL
    # after a full count and for the rollups that do not repair hour by hour.
    Column("repaired_hour", Integer),
    # The last scope id scope_totals' last run recounted whole (jobs/rollups.py); NULL
    # after a full count, after the last scope, and for the other rollups.
    Column("repaired_scope", Integer),
)

SERIES_MARK = "hourly_series"  # the rollup_marks row of jobs/rollup_series.py

# Where a bounded sweep stopped (jobs/sweep.py): each run reads its next batch of keys
# after `position` (JSON) and wraps to the start at the end of the table.
sweep_marks = Table(
    "sweep_marks",
    metadata,
    Column("name", Text, primary_key=True),
    Column("position", Text, nullable=False),
    Column("swept_at", UTCDateTime, nullable=False),
)

hourly_series = Table(
    "hourly_series",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("hour", UTCDateTime, primary_key=True),
    Column("accepted", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("refreshed_at", UTCDateTime, nullable=False),
    # Of `accepted`, the receipts inside the settled band (kept incrementally); the
    # rest are the band's fresh edges, recounted every run (jobs/rollup_series.py).
    Column("settled", BigInteger, nullable=False),
)
# Failures can move in any hour of the window (a requeue lowers a closed hour): each
# run compares the failed cells, found here without reading the whole series.
Index("ix_hourly_series_failed", hourly_series.c.scope_id, hourly_series.c.hour,
      postgresql_where=hourly_series.c.failed > 0, sqlite_where=hourly_series.c.failed > 0,
      postgresql_include=["failed"])
# Each run reads a few hours' cells (the band's edges, the hour it recounts whole) and
# drops the hours past the window: by hour, not through the (scope_id, hour) key.
Index("ix_hourly_series_hour", hourly_series.c.hour)

# hourly_series summed over its scopes: the ledger's accepted and failed receipts per hour.
# A rollups run rewrites the hours whose cells it changed, and the hour it repairs
# (jobs/rollup_series.py), so the ledger's last 24 hours (Capacity) are 25 rows here, not
# one per scope and hour (240,000 at 10,000 scopes).
hourly_totals = Table(
    "hourly_totals",
    metadata,
    Column("hour", UTCDateTime, primary_key=True),
    Column("accepted", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
)

# From the delivery log, per integration and hour (jobs/rollup_deliveries.py): refusals
# (4xx but 409), and answered deliveries (2xx, 409) per fixed latency bucket.
DELIVERY_HOURS_MARK = "delivery_hours"  # its rollup_marks row
hourly_refusals = Table(
    "hourly_refusals",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("hour", UTCDateTime, primary_key=True),
    Column("refused", BigInteger, nullable=False),
)
# Upper bounds (us) of the latency buckets: each 1.33x or 1.5x the one before, so a
# p95 read from them is its bucket's upper bound, at most 1.5x the true value; the
# last bucket (index len(bounds)) holds everything slower.
LATENCY_BOUNDS_US = (1_000, 1_500, 2_000, 3_000, 4_000, 6_000, 8_000, 12_000, 16_000,
                     24_000, 32_000, 48_000, 64_000, 96_000, 128_000, 192_000, 256_000,
                     384_000, 512_000, 768_000, 1_024_000, 1_536_000, 2_048_000, 3_072_000,
                     4_096_000, 6_144_000, 8_192_000, 16_384_000)
hourly_latency = Table(
    "hourly_latency",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("hour", UTCDateTime, primary_key=True),
    Column("bucket", SmallInteger, primary_key=True),
    Column("deliveries", BigInteger, nullable=False),
)

# The delivery log (README "Delivery log"): one row per request to /hooks/, or one row
# counting the refusals of a minute that went over the per-integration log rate
# (`count` > 1). Never a body, a signature or a secret. Purged by age (jobs/delivery_log.py).
deliveries = Table(
    "deliveries",
    metadata,
    # BIGINT on PostgreSQL; SQLite's rowid alias must be declared INTEGER.
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
           autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("integration_id", Integer),  # NULL: the path named no known integration
    Column("public_id", Text),
    Column("outcome", Text, nullable=False),
    Column("http_status", SmallInteger, nullable=False),
    Column("key_id", Text),
    Column("event_id", Text),
    Column("client", Text),
    Column("reason", Text),
    Column("count", Integer, nullable=False),
    # Microseconds from the request reaching the intake to its answer (NULL before 0010).
    Column("latency_us", Integer),
)
Index("ix_deliveries_at", deliveries.c.at, deliveries.c.id)
Index("ix_deliveries_integration", deliveries.c.integration_id, deliveries.c.at,
      deliveries.c.id)
Index("ix_deliveries_key", deliveries.c.key_id, deliveries.c.at,
      postgresql_where=deliveries.c.key_id.is_not(None),
      sqlite_where=deliveries.c.key_id.is_not(None))
# The outcome filter: every outcome but `accepted` (90 % of a normal log, which the
# (at, id) index finds at once) is rare, and a rare or absent one would otherwise walk
# the whole log newest first (1.3 s at 10M rows).
Index("ix_deliveries_outcome", deliveries.c.outcome, deliveries.c.at, deliveries.c.id,
      postgresql_where=deliveries.c.outcome != "accepted",
      sqlite_where=deliveries.c.outcome != "accepted")
Index("ix_deliveries_event", deliveries.c.integration_id, deliveries.c.event_id,
      postgresql_where=deliveries.c.event_id.is_not(None),
      sqlite_where=deliveries.c.event_id.is_not(None))

# Failure groups an operator acknowledged or muted (ledger.worker.failure_review); a
# group's id is a digest of its event type and error signature (ledger.reads.groups).
failure_groups = Table(
    "failure_groups",
    metadata,
    Column("id", Text, primary_key=True),
    Column("event_type", Text, nullable=False),
    Column("signature", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("note", Text, nullable=False),
    Column("updated_by", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# Failure groups kept as failures happen (ledger.worker.failure_groups, migration
# 0010_durable_failure_groups): one member row per failed receipt with its group,
# the group's text once, and per (group, scope) the count of its failed receipts
# with their first and last failure time. Only failed receipts have rows here, so
# complete receipts cost nothing; a requeue or the purge takes the member out.
failure_members = Table(
    "failure_members",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("event_id", Text, primary_key=True),
    Column("group_id", Text, nullable=False),
    Column("failed_at", UTCDateTime, nullable=False),
)
# A group's members by scope and failure time: a group's requeue walks it in keyset
# order, and a counter's first and last failure are two probes into it.
Index("ix_failure_members_group", failure_members.c.group_id, failure_members.c.scope_id,
      failure_members.c.failed_at, failure_members.c.event_id)

failure_signatures = Table(
    "failure_signatures",
    metadata,
    Column("id", Text, primary_key=True),
    Column("event_type", Text, nullable=False),
    Column("signature", Text, nullable=False),
    Column("example", Text),  # one full error of the group, as the worker recorded it
    Column("first_seen", UTCDateTime, nullable=False),
)

failure_group_scopes = Table(
    "failure_group_scopes",
    metadata,
    Column("group_id", Text, primary_key=True),
    Column("scope_id", Integer, primary_key=True),
    Column("count", BigInteger, nullable=False),
    Column("first_seen", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
)
# The failures page filtered by a scope or an account reads that scope's counters.
Index("ix_failure_group_scopes_scope", failure_group_scopes.c.scope_id)

# Destinations (CONTRACT section 8, ledger.destinations): an integration's accepted
# events forwarded over HTTP. `event_types` is NULL for every type, else a JSON list.
# The backoff columns are shared by every worker: while `blocked_until` is ahead, none
# of the destination's events is attempted (one failing endpoint holds its queue, it
# does not burn each event's attempts); `next_send_at` paces sends at `rate_per_second`.
destinations = Table(
    "destinations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", Text, nullable=False, unique=True),
    Column("integration_id", Integer, nullable=False, index=True),
    Column("url", Text, nullable=False),
    Column("event_types", Text),
    Column("state", Text, nullable=False),
    Column("state_reason", Text),
    Column("state_changed_at", UTCDateTime, nullable=False),
    Column("timeout_seconds", Float, nullable=False),
    Column("max_in_flight", Integer, nullable=False),
    Column("rate_per_second", Float),  # NULL: no rate limit
    Column("consecutive_failures", Integer, nullable=False, server_default="0"),
    Column("blocked_until", UTCDateTime),
    Column("next_send_at", UTCDateTime),
    Column("created_at", UTCDateTime, nullable=False),
)

# A destination's `whsec_` signing secrets, encrypted like credentials. Several verify at
# once during a rotation's overlap: the request carries one `v1,` signature per live one.
destination_secrets = Table(
    "destination_secrets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("destination_id", Integer, nullable=False, index=True),
    Column("secret_enc", Text, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime),
)

# What the destination answered to each attempt of a receipt (the receipt's attempt
# `number`): status (NULL when no answer came), latency, the first 1 KiB of the body.
destination_attempts = Table(
    "destination_attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("destination_id", Integer, nullable=False),
    Column("scope_id", Integer, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("number", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("http_status", SmallInteger),
    Column("outcome", Text, nullable=False),
    Column("error", Text),
    Column("response_excerpt", Text),
)
Index("ix_destination_attempts_receipt", destination_attempts.c.scope_id,
      destination_attempts.c.event_id, destination_attempts.c.number)
Index("ix_destination_attempts_started", destination_attempts.c.destination_id,
      destination_attempts.c.started_at)
