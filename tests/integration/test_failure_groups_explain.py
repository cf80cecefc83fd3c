"""EXPLAIN on PostgreSQL: the failure groups' reads and a group's requeue use their indexes,
at 100,000 stored failures in 2,000 groups over 50 scopes. Runs the exact SQL the read
functions produce."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from ledger.reads.groups import count_group_stmt, group_chunk_stmt, groups_stmt
from ledger.reads.receipts import ReceiptFilter
from tests.integration.pg_filled import filled_pg_ledger
from tests.integration.test_dashboard_explain import _plan

pytestmark = pytest.mark.postgres_only

MEMBERS = 100_000
GROUPS = 2_000
SCOPES = 50
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def stored_groups(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
                  ) -> Any:
    """A PostgreSQL ledger whose failures are stored in groups, with their counters, analysed."""
    yield from filled_pg_ledger(request, tmp_path_factory.mktemp("explain-groups"),
                                _fill_stored_groups)


def _fill_stored_groups(conn: Connection) -> None:
    """100,000 failures stored in 2,000 groups over 50 scopes, with their counters."""
    conn.execute(text(
        "INSERT INTO failure_members (scope_id, event_id, group_id, failed_at) "
        "SELECT 1 + (g / 7) % :scopes, 'evt_' || g,"
        " 'g' || lpad((CASE WHEN g % 2 = 0 THEN 7 ELSE g % :groups END)::text, 15, '0'),"
        " :now - make_interval(secs => g) FROM generate_series(1, :n) g"),
        {"now": NOW, "n": MEMBERS, "scopes": SCOPES, "groups": GROUPS})
    conn.execute(text(
        "INSERT INTO failure_signatures (id, event_type, signature, first_seen) "
        "SELECT DISTINCT group_id, 'demo.credit', 'E: ' || group_id, :now "
        "FROM failure_members"), {"now": NOW})
    conn.execute(text(
        "INSERT INTO failure_group_scopes (group_id, scope_id, count, first_seen, "
        "last_seen) SELECT group_id, scope_id, count(*), min(failed_at), max(failed_at)"
        " FROM failure_members GROUP BY group_id, scope_id"))


GID = "g" + "7".zfill(15)  # the largest group: half of every failure


def test_a_scope_or_account_reads_its_counters_by_index(stored_groups: Engine) -> None:
    for f in (ReceiptFilter(scope_id=7), ReceiptFilter(scope_ids=(3, 4, 5))):
        plan = _plan(stored_groups, groups_stmt(f))
        assert "ix_failure_group_scopes_scope" in plan, plan
        assert "Seq Scan on failure_members" not in plan, plan


def test_a_group_count_and_its_requeue_walk_use_the_group_index(stored_groups: Engine) -> None:
    plan = _plan(stored_groups, count_group_stmt(ReceiptFilter(), GID))
    assert "pk_failure_group_scopes" in plan, plan
    with stored_groups.connect() as conn:
        first = group_chunk_stmt(conn, ReceiptFilter(), GID, None, 100)
        later = group_chunk_stmt(conn, ReceiptFilter(scope_ids=(7, 8)), GID,
                                 (NOW - timedelta(days=1), 7, "evt_9"), 100)
    plan = _plan(stored_groups, first)  # the whole group, in the group index's own order
    assert "ix_failure_members_group" in plan and "Sort" not in plan, plan
    # An account's part of the group, past a position: the account's members by key
    # (the group index cannot give several scopes' rows in one order before PostgreSQL 17).
    plan = _plan(stored_groups, later)
    assert "Seq Scan" not in plan and "Index" in plan, plan
