"""CSV and JSON export of filtered lists: the page's filter, every page, the cap said so."""

from __future__ import annotations

import csv
import io

from ledger.web.dashboard import export
from tests.dashboard_helpers import (
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
)
from tests.helpers import make_sender


def test_receipts_export_follows_the_filter_across_pages(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    for i in range(230):  # more than one 200-row page
        add_receipt(app, sender.scope_id, f"evt_{i:03d}", state=2, event_type="demo.fail")
    add_receipt(app, sender.scope_id, "evt_done", state=1)
    client = logged_in(app, "viewer")
    answer = client.get(f"/export/receipts.csv?scope={sender.scope}&state=failed")
    assert answer.status_code == 200 and answer.mimetype == "text/csv"
    assert answer.headers["X-Export-Row-Limit"] == "100000"
    assert "attachment" in answer.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(answer.get_data(as_text=True))))
    assert len(rows) == 230 and {r["state"] for r in rows} == {"failed"}
    assert len({r["event_id"] for r in rows}) == 230
    assert "payload" not in rows[0]
    data = client.get(f"/export/failures.json?scope={sender.scope}").get_json()
    assert len(data["items"]) == 230 and data["truncated"] is False
    assert data["row_limit"] == 100000


def test_export_says_when_the_cap_cut_it(app, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    for i in range(5):
        add_receipt(app, sender.scope_id, f"evt_{i}", state=2)
    monkeypatch.setattr(export, "EXPORT_ROW_LIMIT", 3)
    client = logged_in(app, "viewer")
    text = client.get("/export/failures.csv").get_data(as_text=True)
    lines = text.strip().splitlines()
    assert len(lines) == 1 + 3 + 1 and lines[-1].startswith("# capped at 3 rows")
    data = client.get("/export/failures.json").get_json()
    assert len(data["items"]) == 3 and data["truncated"] is True


def test_conflicts_and_audit_export_and_bad_input(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_conflict(app, sender.scope_id, "evt_c")
    client = logged_in(app, "viewer")
    items = client.get("/export/conflicts.json").get_json()["items"]
    assert [i["event_id"] for i in items] == ["evt_c"] and "incoming_body" not in items[0]
    audit = client.get("/export/audit.csv?action=operator.create").get_data(as_text=True)
    assert "operator.create" in audit and "viewer-op" in audit
    assert client.get("/export/receipts.csv?since=yesterday").status_code == 400
    assert client.get("/export/secrets.csv").status_code == 404
    assert client.get("/export/receipts.xml").status_code == 404
    assert app.test_client().get("/export/receipts.csv").status_code == 302
    page = client.get("/failures").get_data(as_text=True)
    assert "/export/failures.csv" in page and "/export/failures.json" in page


def test_csv_cells_that_look_like_formulas_stay_text(app) -> None:  # type: ignore[no-untyped-def]
    """A reason typed as `=HYPERLINK(...)` must not run in the spreadsheet that opens it."""
    from ledger.access import audit as audit_log
    from tests.servers import thread_server

    svc = app.extensions["ledger"]
    hostile = ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)",
               "\tcmd", "\rcmd"]
    with svc.engine.begin() as conn:
        for n, reason in enumerate(hostile):
            audit_log.record(conn, audit_log.Actor(name="mallory", role="cli"), "test.csv",
                             f"t{n}", at=svc.clock.now(), reason=reason)
    client = logged_in(app, "viewer")
    cookie = client.get_cookie("ledger_session")
    assert cookie is not None
    import requests

    with thread_server(app) as base:
        text = requests.get(f"{base}/export/audit.csv?action=test.csv", timeout=30,
                            cookies={"ledger_session": cookie.value}).text
    reasons = {row["reason"] for row in csv.DictReader(io.StringIO(text))}
    assert reasons == {"'" + reason for reason in hostile}
