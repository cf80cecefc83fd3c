"""The audit log: append-only on both databases, hash-chained, tampering detected."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import select, text

from ledger.access import audit
from ledger.db.schema import audit_log

ACTOR = audit.Actor(name="alice", role="security", request_id="req-1")
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _append(app, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.begin() as conn:
        return [audit.record(conn, ACTOR, "test.action", f"target-{i}", at=AT, scope="a/b",
                             reason="because", detail={"n": i}) for i in range(count)]


def _verify(app) -> dict:  # type: ignore[no-untyped-def,type-arg]
    with app.extensions["ledger"].engine.connect() as conn:
        return audit.verify_chain(conn)


def test_rows_carry_who_what_why_and_chain_to_each_other(app):
    ids = _append(app, 3)
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    assert [r.id for r in rows] == ids
    first = rows[0]
    assert (first.actor, first.role, first.action, first.target, first.scope, first.reason,
            first.request_id, first.at) == ("alice", "security", "test.action", "target-0",
                                            "a/b", "because", "req-1", AT)
    assert first.prev_hash == audit.GENESIS
    assert [r.prev_hash for r in rows[1:]] == [r.row_hash for r in rows[:-1]]
    assert _verify(app) == {"ok": True, "rows": 3, "first_bad": None}


def test_empty_log_verifies(app):
    assert _verify(app) == {"ok": True, "rows": 0, "first_bad": None}


def test_a_non_utc_instant_still_verifies(app):
    with app.extensions["ledger"].engine.begin() as conn:
        audit.record(conn, ACTOR, "test.action", "t", at=AT.astimezone(timezone(timedelta(
            hours=2))))
    assert _verify(app)["ok"] is True


@pytest.mark.parametrize("statement", [
    "UPDATE audit_log SET reason = 'nothing happened'",
    "DELETE FROM audit_log",
])
def test_database_refuses_to_change_or_delete_audit_rows(app, statement):
    _append(app, 2)
    engine = app.extensions["ledger"].engine
    with pytest.raises(sa_exc.DatabaseError, match="append-only"), engine.begin() as conn:
        conn.execute(text(statement))
    assert _verify(app) == {"ok": True, "rows": 2, "first_bad": None}


def _as_tamperer(app, statement: str, **params: object) -> None:  # type: ignore[no-untyped-def]
    """Change the log behind the application's back, as a superuser would."""
    engine = app.extensions["ledger"].engine
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER ALL"))
            conn.execute(text(statement), params)
            conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER ALL"))
        else:
            conn.execute(text("DROP TRIGGER audit_log_no_update"))
            conn.execute(text("DROP TRIGGER audit_log_no_delete"))
            conn.execute(text(statement), params)


def test_an_edited_row_is_reported_as_first_bad(app):
    ids = _append(app, 5)
    _as_tamperer(app, "UPDATE audit_log SET reason = 'routine' WHERE id = :id", id=ids[2])
    assert _verify(app) == {"ok": False, "rows": 5, "first_bad": ids[2]}


def test_a_deleted_row_breaks_the_chain_at_its_successor(app):
    ids = _append(app, 5)
    _as_tamperer(app, "DELETE FROM audit_log WHERE id = :id", id=ids[1])
    assert _verify(app) == {"ok": False, "rows": 4, "first_bad": ids[2]}


def test_rehashing_an_edited_row_with_the_key_still_breaks_the_next_link(app):
    ids = _append(app, 3)
    with app.extensions["ledger"].engine.connect() as conn:
        row = conn.execute(select(audit_log).where(audit_log.c.id == ids[1])).one()
        key = audit.key_of(conn)
    forged = {**audit._fields(row), "reason": "routine"}
    forged_hash = audit._row_hash(row.prev_hash, forged, key)
    _as_tamperer(app, "UPDATE audit_log SET reason = 'routine', row_hash = :h WHERE id = :id",
                 h=forged_hash, id=ids[1])
    assert _verify(app) == {"ok": False, "rows": 3, "first_bad": ids[2]}


def test_audit_verify_command_reports_and_exits_1_when_broken(app, runner):
    ids = _append(app, 3)
    ok = runner.invoke(args=["ledger", "audit", "verify", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout) == {"ok": True, "rows": 3,
                                                           "first_bad": None}
    _as_tamperer(app, "UPDATE audit_log SET actor = 'mallory' WHERE id = :id", id=ids[0])
    bad = runner.invoke(args=["ledger", "audit", "verify", "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.stdout) == {"ok": False, "rows": 3, "first_bad": ids[0]}


def test_concurrent_appenders_keep_one_chain(app):
    errors: list[BaseException] = []

    def append() -> None:
        try:
            for _ in range(5):
                _append(app, 1)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=append) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert _verify(app) == {"ok": True, "rows": 20, "first_bad": None}
