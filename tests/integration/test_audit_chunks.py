"""The dashboard and /api/v1 verify the audit chain a chunk of rows per request: walked to
the end, the chunks give the whole-chain verdict, tampering found wherever it is."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text

from ledger.access import audit
from ledger.db.schema import audit_log
from tests.dashboard_helpers import fast_hashes, logged_in, make_operator, make_token  # noqa: F401
from tests.integration.test_audit_keyed import _legacy_log, _plain_hash

ACTOR = audit.Actor(name="alice", role="security", request_id="req-1")
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CHUNK = 4
_NEXT = re.compile(r'hx-get="[^"]*/audit/verify\?after=(\d+)"')


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few rows per request, so a short log takes several."""
    monkeypatch.setattr(audit, "VERIFY_CHUNK", CHUNK)


def _append(app, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.begin() as conn:
        return [audit.record(conn, ACTOR, "test.action", f"target-{i}", at=AT,
                             reason="because", detail={"n": i}) for i in range(count)]


def _tamper(app, statement: str, **params: object) -> None:  # type: ignore[no-untyped-def]
    """Change the log behind the application's back, as a database superuser can."""
    with app.extensions["ledger"].engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER ALL"))
        else:
            conn.execute(text("DROP TRIGGER IF EXISTS audit_log_no_update"))
            conn.execute(text("DROP TRIGGER IF EXISTS audit_log_no_delete"))
        conn.execute(text(statement), params)
        if conn.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER ALL"))


def _whole(app) -> dict:  # type: ignore[no-untyped-def,type-arg]
    with app.extensions["ledger"].engine.connect() as conn:
        return audit.verify_chain(conn)


def _readers(app):  # type: ignore[no-untyped-def]
    """An API token's headers and a dashboard session (their audit rows come first)."""
    make_operator(app, "robot", "viewer")
    return {"Authorization": f"Bearer {make_token(app, 'robot')}"}, logged_in(app, "viewer")


def _api_walk(app, headers) -> tuple[dict, int]:  # type: ignore[no-untyped-def,type-arg]
    """Follow /api/v1/audit/verify's `next` to the end; the last answer and the requests."""
    client, after, requests = app.test_client(), None, 0
    while True:
        path = "/api/v1/audit/verify" + (f"?after={after}" if after is not None else "")
        answer = client.get(path, headers=headers)
        assert answer.status_code == 200
        body, requests = answer.get_json(), requests + 1
        if body["next"] is None:
            return body, requests
        assert body["ok"] is None and body["first_bad"] is None  # no verdict yet
        after = body["next"]


def _page_walk(client) -> str:  # type: ignore[no-untyped-def]
    """Follow the audit page's status widget as htmx does, until it stops continuing."""
    page = client.get("/audit").get_data(as_text=True)
    assert 'hx-get="/audit/verify"' in page
    html = client.get("/audit/verify", headers={"HX-Request": "true"}).get_data(as_text=True)
    for _ in range(100):
        found = _NEXT.search(html)
        if found is None:
            return html
        html = client.get(f"/audit/verify?after={found.group(1)}",
                          headers={"HX-Request": "true"}).get_data(as_text=True)
    raise AssertionError("the widget never stopped")


def _verdict(body: dict) -> dict:  # type: ignore[type-arg]
    return {k: body[k] for k in ("ok", "rows", "first_bad")}


def test_a_good_chain_verifies_in_chunks_as_one_walk(app):
    headers, session = _readers(app)
    _append(app, 3 * CHUNK + 1)
    body, requests = _api_walk(app, headers)
    assert _verdict(body) == _whole(app) and body["ok"] is True
    assert requests >= 4
    html = _page_walk(session)
    assert "Hash chain verified" in html and "BROKEN" not in html


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_an_edited_row_in_any_chunk_is_the_first_bad(app, where):
    headers, session = _readers(app)
    _append(app, 3 * CHUNK + 2)
    with app.extensions["ledger"].engine.connect() as conn:
        ids = list(conn.execute(select(audit_log.c.id).order_by(audit_log.c.id)).scalars())
    edited = {"first": ids[1], "middle": ids[len(ids) // 2], "last": ids[-1]}[where]
    assert ids.index(edited) // CHUNK == {"first": 0, "middle": 2, "last": len(ids) // CHUNK
                                          - (len(ids) % CHUNK == 0)}[where]
    _tamper(app, "UPDATE audit_log SET reason = 'routine' WHERE id = :id", id=edited)
    body, _ = _api_walk(app, headers)
    assert _verdict(body) == _whole(app) and body["ok"] is False
    assert body["first_bad"] == edited
    html = _page_walk(session)
    assert f"BROKEN at row {edited} " in html and "Hash chain verified" not in html


def test_a_row_deleted_at_a_chunk_edge_breaks_its_successor(app):
    headers, _session = _readers(app)
    ids = _append(app, 3 * CHUNK)
    _tamper(app, "DELETE FROM audit_log WHERE id = :id", id=ids[CHUNK - 1])
    body, _ = _api_walk(app, headers)
    assert body["ok"] is False and body["first_bad"] == ids[CHUNK] == _whole(app)["first_bad"]
    # Deleted after the first chunk passed it: the next chunk links to the row before it.
    with app.extensions["ledger"].engine.connect() as conn:
        answer = audit.verify_chunk(conn, ids[CHUNK - 1])
    assert (answer["ok"], answer["first_bad"]) == (False, ids[CHUNK])


def test_rehashed_rows_without_the_key_fail_in_a_later_chunk(app):
    headers, _session = _readers(app)
    ids = _append(app, 3 * CHUNK)
    with app.extensions["ledger"].engine.begin() as conn:
        row = dict(conn.execute(select(audit_log).where(audit_log.c.id == ids[-2])).one()
                   ._mapping)
    forged = _plain_hash(row["prev_hash"], {**row, "at": row["at"].astimezone(UTC),
                                             "reason": "routine"})
    _tamper(app, "UPDATE audit_log SET reason = 'routine', row_hash = :h WHERE id = :id",
            h=forged, id=ids[-2])
    body, _ = _api_walk(app, headers)
    assert body["ok"] is False and body["first_bad"] == ids[-2] == _whole(app)["first_bad"]


def test_unkeyed_rows_fail_until_sealed_then_verify_across_chunks(app, runner):
    legacy = _legacy_log(app, CHUNK + 1)  # they open the log and span two chunks
    headers, session = _readers(app)  # keyed rows chaining onto them seal nothing
    _append(app, CHUNK)
    body, _ = _api_walk(app, headers)
    assert _verdict(body) == _whole(app) == {**_verdict(body), "ok": False,
                                             "first_bad": legacy[0]}
    assert runner.invoke(args=["ledger", "audit", "rechain", "--never-keyed"]).exit_code == 0
    _append(app, 2 * CHUNK)  # the walk goes on past the seal's chunk
    body, _ = _api_walk(app, headers)
    assert body["ok"] is True and _verdict(body) == _whole(app)
    assert "Hash chain verified" in _page_walk(session)


def test_an_after_that_is_not_a_row_id_is_a_bad_request(app):
    headers, session = _readers(app)
    answer = app.test_client().get("/api/v1/audit/verify?after=x", headers=headers)
    assert answer.status_code == 400 and answer.get_json()["error"] == "bad_request"
    page = session.get("/audit/verify?after=-1",
                                        headers={"HX-Request": "true"})
    assert page.status_code == 400
