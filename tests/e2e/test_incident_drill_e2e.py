"""The drill in a real browser: its audit row tells the real outcome; a reload keeps it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from ledger.db.schema import audit_log
from tests.dashboard_helpers import PASSWORD, fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def app(test_env: dict[str, str]) -> Iterator[Flask]:
    """The app with a short revocation bound, so the drill's wait is short."""
    from app import create_app

    application = create_app({**test_env, "LEDGER_REVOCATION_BOUND_SECONDS": "2"})
    yield application
    application.extensions["ledger"].close()


def test_a_passed_drill_is_audited_as_passed_and_stays_shown(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    make_operator(app, "sam", "security")
    with thread_server(app) as url:
        login(page, url, "sam", "/credentials")
        page.locator("#drill input[name=password]").fill(PASSWORD)
        page.locator("#drill button", has_text="Run the drill").click()
        status = page.locator("#drill-status")
        expect(status).to_contain_text(re.compile("passed|FAILED"), timeout=60_000)
        expect(status).to_contain_text("passed")
        run_id = status.locator("code").first.inner_text()
        page.reload()
        expect(page.locator("#drill-status")).to_contain_text(run_id)
        expect(page.locator("#drill-status")).to_contain_text("passed")
    with app.extensions["ledger"].engine.connect() as conn:
        detail = conn.execute(select(audit_log.c.detail).where(
            audit_log.c.action == "drill.finish")).scalar_one()
    assert json.loads(detail)["passed"] is True
