"""Conflicts in a real browser: the incoming body and the original's facts are always there;
with the forensic window a conflict after completion still has its diff."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.integration.test_dashboard_conflict_evidence import _conflict_after_completion
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def windowed(test_env: dict[str, str]) -> Iterator[Flask]:
    """The app with a one-hour forensic window."""
    from app import create_app

    application = create_app({**test_env, "LEDGER_CONFLICT_BODY_SECONDS": "3600"})
    yield application
    application.extensions["ledger"].close()


def test_a_completed_original_still_shows_what_is_known(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    conflict_id = _conflict_after_completion(app)
    make_operator(app, "olga", "oncall")
    with thread_server(app) as url:
        login(page, url, "olga", "/conflicts")
        expect(page.locator("#kept-note")).to_contain_text("leaves with its work item")
        page.locator("#conflicts a", has_text="evt_1").first.click()
        page.wait_for_url(f"{url}/conflicts/{conflict_id}")
        expect(page.locator("#incoming-body")).to_contain_text("500")
        expect(page.locator("#original-facts")).to_contain_text("complete")
        expect(page.locator("#diff-unavailable")).to_contain_text("LEDGER_CONFLICT_BODY_SECONDS")


def test_the_forensic_window_gives_a_diff_and_its_cost(page: Any, windowed: Flask) -> None:
    from playwright.sync_api import expect

    conflict_id = _conflict_after_completion(windowed)
    make_operator(windowed, "olga", "oncall")
    with thread_server(windowed) as url:
        login(page, url, "olga", f"/conflicts/{conflict_id}")
        expect(page.locator("#diff")).to_contain_text("$.data.amount")
        expect(page.locator("#original-facts")).to_contain_text("forensic window")
        page.goto(f"{url}/capacity")
        expect(page.locator("#forensic-cost")).to_contain_text("1 bodies")
