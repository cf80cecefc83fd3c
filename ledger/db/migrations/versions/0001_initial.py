"""Initial ledger schema: integrations, credentials, receipts, jobs and operations tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = UTCDateTime


def upgrade() -> None:
    """Create every table of the first release."""
    op.create_table(
        "integrations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.Text, nullable=False, unique=True),
        sa.Column("account", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("tolerance_seconds", sa.Integer, nullable=False),
        sa.Column("max_body_bytes", sa.Integer),
        sa.Column("sandbox", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("account", "name", name="uq_integrations_scope"),
    )
    op.create_table(
        "credentials",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key_id", sa.Text, nullable=False, unique=True),
        sa.Column("integration_id", sa.Integer, nullable=False, index=True),
        sa.Column("secret_enc", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS),
        sa.Column("revoked_at", TS),
        sa.Column("revoked_reason", sa.Text),
    )
    _create_ledger_tables()
    _create_operations_tables()


def _create_ledger_tables() -> None:
    """Create receipts, jobs, attempts, conflicts and the demo balances."""
    op.create_table(
        "receipts",
        sa.Column("accepted_at", TS, nullable=False),
        sa.Column("completed_at", TS),
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("state", sa.SmallInteger, nullable=False),
        sa.Column("attempts", sa.SmallInteger, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("body_sha256", sa.LargeBinary(32), nullable=False),
        sa.Column("result_ref", sa.Text),
        sa.PrimaryKeyConstraint("scope_id", "event_id", name="pk_receipts"),
    )
    if op.get_bind().dialect.name == "postgresql":
        # Receipts arrive in time order, so a BRIN index finds purge and time-window
        # candidates for a few bytes per thousand rows (a btree costs ~22 B/row).
        op.execute("CREATE INDEX ix_receipts_accepted_brin ON receipts USING brin (accepted_at)")
    else:
        op.create_index("ix_receipts_accepted", "receipts", ["accepted_at"])
    # Only unfinished receipts (pending, failed) are indexed by state: complete
    # ones, the vast majority, cost nothing here.
    op.create_index("ix_receipts_open", "receipts", ["state", "accepted_at"],
                    postgresql_where=sa.text("state <> 1"), sqlite_where=sa.text("state <> 1"))
    op.create_table(
        "jobs",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("accepted_at", TS, nullable=False),
        sa.Column("run_at", TS, nullable=False),
        sa.Column("status", sa.SmallInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_token", sa.BigInteger, nullable=False),
        sa.Column("leased_by", sa.Text),
        sa.Column("leased_until", TS),
        sa.Column("payload", sa.Text),
        sa.PrimaryKeyConstraint("scope_id", "event_id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_due", "jobs", ["run_at"],
                    postgresql_where=sa.text("status = 0"), sqlite_where=sa.text("status = 0"))
    op.create_table(
        "unsigned_bodies",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("body_sha256", sa.LargeBinary(32), nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("accepted_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "body_sha256", name="pk_unsigned_bodies"),
    )
    op.create_table(
        "conflicts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("original_event_id", sa.Text, nullable=False),
        sa.Column("original_sha256", sa.LargeBinary(32), nullable=False),
        sa.Column("incoming_sha256", sa.LargeBinary(32), nullable=False),
        sa.Column("first_seen", TS, nullable=False),
        sa.Column("last_seen", TS, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("acknowledged_at", TS),
        sa.Column("acknowledged_by", sa.Text),
        sa.Column("ack_note", sa.Text),
        sa.UniqueConstraint("scope_id", "event_id", "incoming_sha256",
                            name="uq_conflicts_delivery"),
    )
    op.create_index("ix_conflicts_last_seen", "conflicts", ["last_seen"])
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.Text, nullable=False),
        sa.Column("lease_token", sa.BigInteger, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.Column("outcome", sa.Text),
        sa.Column("error", sa.Text),
    )
    op.create_index("ix_attempts_receipt", "attempts", ["scope_id", "event_id", "number"])
    if op.get_bind().dialect.name == "postgresql":
        # Attempts are inserted in time order: the retention purge finds the expired
        # ones by range (jobs/retention_receipts.py) instead of one probe per receipt.
        op.execute("CREATE INDEX ix_attempts_started_brin ON attempts USING brin (started_at)")
    op.create_table(
        "demo_balances",
        sa.Column("scope_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("balance", sa.BigInteger, nullable=False),
    )


def _create_operations_tables() -> None:
    """Create audit, operators, instances, scheduler and rollup tables."""
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("scope", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("request_id", sa.Text),
        sa.Column("detail", sa.Text),
        sa.Column("prev_hash", sa.Text, nullable=False),
        sa.Column("row_hash", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_at", "audit_log", ["at"])
    _forbid_audit_changes()
    op.create_table(
        "operators",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("username", sa.Text, nullable=False, unique=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("password_hash", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("disabled_at", TS),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("operator_id", sa.Integer, nullable=False, index=True),
        sa.Column("token_sha256", sa.LargeBinary(32), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS),
        sa.Column("last_used_at", TS),
    )
    op.create_table(
        "operator_sessions",
        sa.Column("id_sha256", sa.LargeBinary(32), primary_key=True),
        sa.Column("operator_id", sa.Integer, nullable=False, index=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("last_seen_at", TS, nullable=False),
        sa.Column("ended_at", TS),
    )
    op.create_table(
        "login_failures",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("at", TS, nullable=False),
    )
    op.create_index("ix_login_failures_key_at", "login_failures", ["key", "at"])
    op.create_table(
        "instances",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("hostname", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("heartbeat_at", TS, nullable=False),
        sa.Column("credentials_refreshed_at", TS),
    )
    op.create_table(
        "scheduler_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("period_start", TS, nullable=False),
        sa.Column("instance", sa.Text, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("rows_affected", sa.BigInteger),
        sa.Column("error", sa.Text),
        sa.UniqueConstraint("job", "period_start", name="uq_scheduler_runs_period"),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("first_seen", TS, nullable=False),
        sa.Column("last_seen", TS, nullable=False),
        sa.Column("resolved_at", TS),
        sa.UniqueConstraint("kind", "subject", name="uq_findings_subject"),
    )
    op.create_table(
        "scope_counts",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("state", sa.SmallInteger, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("oldest_accepted_at", TS),
        sa.Column("refreshed_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "state", name="pk_scope_counts"),
    )
    op.create_table(
        "hourly_series",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("hour", TS, nullable=False),
        sa.Column("accepted", sa.BigInteger, nullable=False),
        sa.Column("failed", sa.BigInteger, nullable=False),
        sa.Column("refreshed_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "hour", name="pk_hourly_series"),
    )


def _forbid_audit_changes() -> None:
    """Make the audit log append-only in the database itself."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION audit_log_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION 'audit_log is append-only';
            END $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE OR TRUNCATE "
            "ON audit_log FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
        )
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log "
                "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END"
            )


def downgrade() -> None:
    """Drop everything (development only)."""
    for table in ("hourly_series", "scope_counts", "findings", "scheduler_runs", "instances",
                  "login_failures", "operator_sessions", "api_tokens", "operators",
                  "demo_balances", "attempts", "conflicts", "unsigned_bodies", "jobs",
                  "receipts", "credentials", "integrations"):
        op.drop_table(table)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_log_no_change ON audit_log")
        op.execute("DROP FUNCTION audit_log_append_only()")
    op.drop_table("audit_log")
