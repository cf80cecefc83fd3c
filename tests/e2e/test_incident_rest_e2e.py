"""The rest of the incident list in a real browser: no sideways scroll at 390 px and a small
header on phones, one time zone with relative ages, plain numbers, axes on charts, audit rows
with detail, address and request id, and their noise grouped."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import update

from jobs import rollups
from ledger.access import audit
from ledger.db.schema import jobs
from tests.dashboard_helpers import add_conflict, add_receipt, fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.helpers import deliver, make_sender
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PAGES = ("/", "/receipts", "/stuck", "/failures", "/failures/groups", "/deliveries",
         "/conflicts", "/credentials", "/audit", "/capacity", "/operators")


def _seed(app: Flask) -> tuple[str, int]:
    """Deliveries, failures, a retrying job past a lowered limit, a conflict, drill rows."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    sender = make_sender(app)
    client = app.test_client()
    for i in range(3):
        deliver(client, sender, f"evt_ok_{i}")
    for i in range(4):
        add_receipt(app, sender.scope_id, f"evt_fail_{i}", state=2,
                    error="RuntimeError: downstream said no to a very long request id "
                          "0f8fad5b-d9cb-469f-a165-70867728950e")
    add_receipt(app, sender.scope_id, "evt_retry", state=0, accepted_at=now - timedelta(hours=1))
    with svc.engine.begin() as conn:  # six attempts, though the limit is now 4
        conn.execute(update(jobs).where(jobs.c.event_id == "evt_retry").values(
            attempts=6, run_at=now + timedelta(minutes=5)))
        for step in range(3):
            audit.record(conn, audit.Actor(name="drill", role="sandbox"), "credential.add",
                         f"key_sandbox_{step}", at=now, scope="sandbox/drill")
    conflict_id = add_conflict(app, sender.scope_id, "evt_ok_1")
    make_operator(app, "sam", "admin")
    rollups.run(svc.engine, svc.settings, svc.clock)  # the Overview's counts and charts
    return sender.public_id, conflict_id


@pytest.fixture
def app(test_env: dict[str, str]) -> Any:
    """The app with the attempt limit lowered to 4 after some jobs went further."""
    from app import create_app

    application = create_app({**test_env, "LEDGER_MAX_ATTEMPTS": "4"})
    yield application
    application.extensions["ledger"].close()


def test_every_page_fits_a_phone(browser: Any, app: Flask) -> None:
    public_id, conflict_id = _seed(app)
    context = browser.new_context(viewport={"width": 390, "height": 844})
    tab = context.new_page()
    tab.set_default_timeout(base.TIMEOUT_MS)
    try:
        with thread_server(app) as url:
            login(tab, url, "sam")
            header = tab.evaluate("document.querySelector('header.top').offsetHeight")
            assert header <= 140, header  # of 844 px; it took 255 before
            for path in (*PAGES, f"/receipts/{public_id}/evt_fail_0", f"/credentials/{public_id}",
                         f"/conflicts/{conflict_id}", "/search?q=nothing-here"):
                tab.goto(f"{url}{path}")
                width = tab.evaluate("document.documentElement.scrollWidth")
                wide = tab.evaluate("""[...document.querySelectorAll('body *')]
                    .filter(e => e.getBoundingClientRect().right > 391
                                 && !e.closest('table, .scroll, pre, nav'))
                    .map(e => e.tagName + '.' + e.className).slice(0, 5)""")
                probe = tab.evaluate("""[...document.querySelectorAll('main *')]
                    .filter(e => e.getBoundingClientRect().right > 391 && !e.closest('table'))
                    .map(e => e.tagName + '.' + e.className).slice(0, 8)""")
                assert width <= 390, (path, width, wide, probe)
    finally:
        context.close()


def test_times_numbers_charts_and_audit_read_plainly(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    _seed(app)
    with thread_server(app) as url:
        login(page, url, "sam", "/stuck")
        retry = page.locator("#retrying-table tr", has_text="evt_retry")
        expect(retry).to_contain_text("limit now 4")
        assert not re.search(r"\b6 of 4\b", retry.inner_text())
        for path in ("/receipts", "/deliveries", "/audit", "/failures"):
            page.goto(f"{url}{path}")
            assert page.locator("input[type=datetime-local]").count() == 0, path
            first = page.locator("main time[datetime]").first
            expect(first).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$"))
            expect(page.locator("main .age").first).to_contain_text("ago")
        page.goto(f"{url}/")
        spark = page.locator("svg.spark").first
        expect(spark.locator("line.axis-line")).to_have_count(1)
        expect(spark.locator("text.axis", has_text="now")).to_have_count(1)
        # A requeue from the dashboard: its audit row says from where, with what, which request.
        page.goto(f"{url}/failures")
        row = page.locator("#failures-table tr", has_text="evt_fail_0")
        row.locator("input[name=reason]").fill("downstream fixed")
        row.locator("button", has_text="Requeue").click()
        expect(row).to_contain_text("Requeued")
        page.goto(f"{url}/audit")
        requeue = page.locator("#audit-table tr", has_text="receipt.requeue").first
        expect(requeue).to_contain_text("127.0.0.1")
        expect(requeue).to_contain_text("attempts_before")
        expect(requeue).to_contain_text("req")
        group = page.locator("#audit-table tr.audit-group", has_text="drill sandbox: 3 rows")
        expect(group).to_have_count(1)
        assert page.console_errors == []
