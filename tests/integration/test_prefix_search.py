"""Event id lookups across many scopes: the prefix list goes scope by scope in primary-key
order, each match once, its scan stopping at the page; the header search probes each scope's
key (EXPLAIN ANALYZE at 10,000 scopes)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from ledger.config import Settings
from ledger.db.engine import make_engine
from ledger.reads.receipts import ReceiptFilter, prefix_stmt
from ledger.reads.search import receipt_hits_stmt
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
)
from tests.helpers import make_sender
from tests.integration.pg_filled import filled_pg_ledger, insert_integrations

SCOPES = 10_000
ROWS = 100_000
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _pages(client: Any, query: str, limit: int) -> list[list[tuple[str, str]]]:
    """Follow next_cursor from the first page to the last; return every page's items."""
    pages: list[list[tuple[str, str]]] = []
    cursor = ""
    while True:
        response = client.get(f"/api/v1/receipts?limit={limit}&{query}{cursor}")
        assert response.status_code == 200, response.get_data(as_text=True)
        body = response.get_json()
        pages.append([(i["scope"], i["event_id"]) for i in body["items"]])
        if not body["next_cursor"]:
            return pages
        assert len(pages) < 50, "the cursor does not advance"
        cursor = f"&cursor={body['next_cursor']}"


def test_prefix_pages_go_scope_by_scope_and_cover_every_match_once(app) -> None:  # type: ignore[no-untyped-def]
    # Matches spread unevenly: a scope with none, one with more than a page, a page that
    # ends exactly at a scope's last match; ids that only look alike must stay out.
    senders = [make_sender(app, account=f"acct{n}", name="stripe") for n in range(5)]
    matches = {0: 3, 1: 0, 2: 7, 3: 1, 4: 2}
    expected: list[tuple[str, str]] = []
    for n, sender in enumerate(senders):
        for k in range(matches[n]):
            add_receipt(app, sender.scope_id, f"ord_{k:02d}", state=(1, 2, 0)[k % 3])
            expected.append((sender.scope, f"ord_{k:02d}"))
        for lookalike in ("orc_1", "ord", "ordx1", "ORD_1", "or_d_1", "ore_0"):
            add_receipt(app, sender.scope_id, lookalike)
    client = logged_in(app, "viewer")
    for limit in (3, 4, 50):
        pages = _pages(client, "prefix=ord_", limit)
        seen = [item for page in pages for item in page]
        assert seen == expected  # senders were created in order: scope ids ascend
        assert all(len(page) <= limit for page in pages)
    # `_` is a literal character of the prefix, not a LIKE wildcard.
    assert _pages(client, "prefix=or_", 10) == [[(s.scope, "or_d_1") for s in senders]]
    # One account, or one scope: only its receipts, in the same order.
    assert [i for p in _pages(client, "prefix=ord_&scope=acct2", 2) for i in p] == [
        e for e in expected if e[0] == senders[2].scope]
    assert [i for p in _pages(client, f"prefix=ord_&scope={senders[0].scope}", 2) for i in p] == [
        e for e in expected if e[0] == senders[0].scope]


def test_a_cursor_from_another_list_is_refused(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    for k in range(3):
        add_receipt(app, sender.scope_id, f"evt_{k}")
    client = logged_in(app, "viewer")
    by_time = client.get("/api/v1/receipts?limit=1").get_json()["next_cursor"]
    assert by_time
    response = client.get(f"/api/v1/receipts?prefix=evt_&limit=1&cursor={by_time}")
    assert response.status_code == 400


@pytest.fixture(scope="module")
def many_scopes(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
                ) -> Any:
    """A PostgreSQL ledger of 100,000 receipts over 10,000 scopes, analysed."""
    yield from filled_pg_ledger(request, tmp_path_factory.mktemp("prefix"), _fill_many_scopes)


def _fill_many_scopes(conn: Connection) -> None:
    """100,000 receipts over 10,000 scopes."""
    insert_integrations(conn, SCOPES, NOW)
    conn.execute(text(
        "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, "
        "event_id, event_type, body_sha256, result_ref) "
        "SELECT :now - make_interval(secs => :n - g), :now, 1 + g % :scopes, 1, 1,"
        " 'evt_' || md5(g::text), 'demo.credit', decode(md5(g::text), 'hex'), 'ok' "
        "FROM generate_series(1, :n) g"), {"now": NOW, "n": ROWS, "scopes": SCOPES})


def _analyze(engine: Engine, stmt: Any) -> dict[str, Any]:
    """Run EXPLAIN (ANALYZE, FORMAT JSON) on a statement with its real bound values."""
    compiled = stmt.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    with engine.connect() as conn:
        raw = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled),
                                   compiled.params).scalar_one()
    plan = raw if isinstance(raw, list) else json.loads(raw)
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Return a plan node and every node under it."""
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


@pytest.mark.postgres_only
def test_a_prefix_page_over_10000_scopes_reads_about_one_page(many_scopes: Engine) -> None:
    # 'evt_a' matches 1/16 of the ids (md5 hex): 6,250 receipts; 'evt_abcdef' almost none.
    # A page must come from the primary key in its own order and stop after the page (at
    # most the page plus the last scope's rows), not read every match and sort them; a
    # prefix that matches nothing costs one probe per scope, never a scan of the table.
    for prefix, scope_ids, after in (("evt_a", None, None), ("evt_a", [4_321], (4_321, "evt_a0")),
                                     ("evt_a", None, (5_000, "evt_a8")),
                                     ("evt_a", list(range(1, SCOPES + 1)), None),
                                     ("evt_abcdef", None, None)):
        plan = _analyze(many_scopes, prefix_stmt(ReceiptFilter(prefix=prefix), scope_ids,
                                                 after, 51))
        nodes = _nodes(plan)
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plan
        # One range of the primary key per scope (an index or bitmap scan of it).
        scans = [n for n in nodes if n.get("Index Name") == "pk_receipts"]
        assert scans, plan
        assert all("scope_id = integrations.id" in n["Index Cond"] for n in scans), plan
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) <= 2 * 51, plan
        assert all(n["Actual Loops"] <= SCOPES for n in scans), plan


@pytest.mark.postgres_only
def test_the_header_search_probes_each_scope_never_scans_receipts(many_scopes: Engine) -> None:
    with many_scopes.connect() as conn:
        wanted = conn.execute(text("SELECT event_id FROM receipts WHERE scope_id = 4321"
                                   " LIMIT 1")).scalar_one()
    for q, found in ((wanted, 1), ("evt_nowhere", 0)):
        plan = _analyze(many_scopes, receipt_hits_stmt(q, lateral=True))
        nodes = _nodes(plan)
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plan
        scans = [n for n in nodes if n.get("Index Name") == "pk_receipts"]
        assert scans and all("scope_id = integrations.id" in n["Index Cond"] for n in scans), plan
        assert plan["Actual Rows"] == found


def test_sqlite_reads_a_prefix_page_scope_by_scope_from_the_primary_key(
        sqlite_template: Path, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copyfile(sqlite_template, path)
    engine = make_engine(Settings(database_url=f"sqlite:///{path}", var_dir=tmp_path))
    with engine.begin() as conn:
        conn.execute(text(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :n) "
            "INSERT INTO integrations (public_id, account, name, profile, tolerance_seconds,"
            " sandbox, created_at) SELECT 'in_' || printf('%022d', n), 'acct' || n, 'stripe',"
            " 'stripe', 300, 0, '2026-11-30 12:00:00' FROM g"), {"n": SCOPES})
    for scope_ids, after in ((None, None), ([4_321], (4_321, "evt_a0"))):
        stmt = prefix_stmt(ReceiptFilter(prefix="evt_a"), scope_ids, after, 51, lateral=False)
        compiled = stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True})
        with engine.connect() as conn:
            plan = " / ".join(r[-1] for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + str(compiled)))
        assert "TEMP B-TREE" not in plan, plan  # the index gives the order: no sort
        assert "SEARCH receipts USING INDEX sqlite_autoindex_receipts_1 (scope_id=? AND" \
               " event_id>? AND event_id<?)" in plan, plan
    engine.dispose()
