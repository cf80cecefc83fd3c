"""Baseline schemas: the thin intake's tables and the seed's naive receipts table."""

from __future__ import annotations

import sqlite3

import psycopg

# The thin intake stores what the ledger stores per delivery, with primary keys only.
THIN = """
CREATE TABLE receipts (
    accepted_at timestamptz NOT NULL, completed_at timestamptz, scope_id integer NOT NULL,
    state smallint NOT NULL, attempts smallint NOT NULL, event_id text NOT NULL,
    event_type text NOT NULL, body_sha256 bytea NOT NULL, result_ref text,
    PRIMARY KEY (scope_id, event_id));
CREATE TABLE jobs (
    scope_id integer NOT NULL, event_id text NOT NULL, event_type text NOT NULL,
    accepted_at timestamptz NOT NULL, run_at timestamptz NOT NULL, status smallint NOT NULL,
    attempts integer NOT NULL, lease_token bigint NOT NULL, leased_by text,
    leased_until timestamptz, payload text, PRIMARY KEY (scope_id, event_id));
"""

# The seed's SQLite-style table (text scope, text status), plus what the ledger
# also keeps per receipt (event type, attempts, body digest) so both hold the
# same information. Timestamps as timestamptz, not text, to be fair to it.
NAIVE = """
CREATE TABLE naive_receipts (
    consumer_scope text NOT NULL, event_id text NOT NULL, event_type text NOT NULL,
    status text NOT NULL CHECK (status IN ('pending', 'complete', 'failed')),
    attempts integer NOT NULL, accepted_at timestamptz NOT NULL, completed_at timestamptz,
    body_sha256 bytea NOT NULL, result_ref text,
    PRIMARY KEY (consumer_scope, event_id));
"""


def create_thin_pg(url: str) -> None:
    """Create the thin intake's tables on PostgreSQL."""
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(THIN)


def create_thin_sqlite(path: str) -> None:
    """Create the thin intake's tables on SQLite (WAL, like the ledger's default)."""
    ddl = (THIN.replace("timestamptz", "text").replace("bytea", "blob")
           .replace("smallint", "integer").replace("bigint", "integer"))
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(ddl)
        conn.commit()
    finally:
        conn.close()
