"""The leaked-key drill from the Credentials page: security only, password, live steps, audit."""

from __future__ import annotations

import json
import re
import time

import pytest
from sqlalchemy import select

from ledger.db.schema import audit_log, integrations
from ledger.web.dashboard.drill_page import drill_runs
from tests.dashboard_helpers import (
    PASSWORD,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    post,
)
from tests.helpers import make_sender

RUN = re.compile(r"/credentials/drill/([0-9a-f]+)")


@pytest.fixture
def app(test_env):  # type: ignore[no-untyped-def]
    """The app with a short revocation bound, so the drill's wait is short."""
    from app import create_app

    application = create_app({**test_env, "LEDGER_REVOCATION_BOUND_SECONDS": "2"})
    yield application
    application.extensions["ledger"].close()


def _audit(app, action):  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(audit_log).where(audit_log.c.action == action)).all()


def _wait_done(client, run_id: str) -> str:  # type: ignore[no-untyped-def]
    """Poll the status fragment like htmx does until it stops asking to be polled."""
    seen_running = False
    for _ in range(600):
        html = client.get(f"/credentials/drill/{run_id}",
                          headers={"HX-Request": "true"}).get_data(as_text=True)
        if "hx-trigger" not in html:
            return html + ("<!--was-running-->" if seen_running else "")
        seen_running = seen_running or "running…" in html
        time.sleep(0.1)
    raise AssertionError("the drill did not finish in 60 s")


def test_security_runs_the_drill_and_watches_it_pass(app) -> None:  # type: ignore[no-untyped-def]
    make_sender(app)  # a real account the drill must leave alone
    security = logged_in(app, "security", "sam")
    assert "Run the drill" in security.get("/credentials").get_data(as_text=True)
    wrong = post(security, "/credentials/drill", {"password": "nope"}, htmx=True)
    assert wrong.status_code == 403 and "did not match" in wrong.get_data(as_text=True)
    assert _audit(app, "drill.start") == []

    started = post(security, "/credentials/drill", {"password": PASSWORD}, htmx=True)
    assert started.status_code == 202
    run_id = RUN.search(started.get_data(as_text=True)).group(1)  # type: ignore[union-attr]
    second = post(security, "/credentials/drill", {"password": PASSWORD}, htmx=True)
    if not drill_runs(app).get(run_id).done:  # type: ignore[union-attr]
        assert second.status_code == 409 and "already running" in second.get_data(as_text=True)
    html = _wait_done(security, run_id)
    assert "passed" in html and "FAIL" not in html, html
    for step in ("sandbox_accounts", "revoked_key_refused_within_bound",
                 "rotated_key_gets_original_outcome", "cleanup"):
        assert f"PASS</strong> {step}" in html
    assert "audit log" in html
    finish = _audit(app, "drill.finish")
    assert len(finish) == 1 and finish[0].actor == "sam" and run_id in finish[0].target
    assert '"passed": true' in finish[0].detail or '"passed":true' in finish[0].detail
    assert [r.target for r in _audit(app, "drill.start")] == [f"drill:{run_id}"]
    with app.extensions["ledger"].engine.connect() as conn:
        left = conn.execute(select(integrations.c.account)).scalars().all()
    assert left == ["acme"]  # the sandbox is gone, the real account stays
    audit_page = security.get("/audit?action=drill.finish").get_data(as_text=True)
    assert f"drill:{run_id}" in audit_page
    # Another gunicorn worker has no memory of the run: it answers from the audit rows.
    app.extensions.pop("ledger_drills")
    elsewhere = security.get(f"/credentials/drill/{run_id}",
                             headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "passed" in elsewhere and "PASS</strong> cleanup" in elsewhere
    assert "hx-trigger" not in elsewhere


def test_the_drill_is_for_security_with_a_session(app) -> None:  # type: ignore[no-untyped-def]
    oncall = logged_in(app, "oncall")
    assert "Run the drill" not in oncall.get("/credentials").get_data(as_text=True)
    assert post(oncall, "/credentials/drill", {"password": PASSWORD}).status_code == 403
    assert oncall.get("/credentials/drill/abc").status_code == 403
    assert logged_in(app, "security").get("/credentials/drill/abc").status_code == 404
    assert _audit(app, "drill.start") == []


def test_the_last_run_stays_on_the_page(app) -> None:  # type: ignore[no-untyped-def]
    security = logged_in(app, "security", "sam")
    assert "Run <code>" not in security.get("/credentials").get_data(as_text=True)
    started = post(security, "/credentials/drill", {"password": PASSWORD}, htmx=True)
    run_id = RUN.search(started.get_data(as_text=True)).group(1)  # type: ignore[union-attr]
    _wait_done(security, run_id)
    finish = _audit(app, "drill.finish")
    assert json.loads(finish[0].detail)["passed"] is True
    # A reload, here or in a process that never ran it, shows the newest run's result.
    for _ in range(2):
        page = security.get("/credentials").get_data(as_text=True)
        assert f"<code>{run_id}</code>" in page and "passed" in page and "FAILED" not in page
        app.extensions.pop("ledger_drills")
