"""Revocation evidence in a real browser: propagation per revocation, use since, receipts."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.integration.test_dashboard_revocations import seed_revocation
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_revocation_says_where_it_propagated_and_what_got_through(page: Any,
                                                                      app: Flask) -> None:
    from playwright.sync_api import expect

    sender = seed_revocation(app)
    make_operator(app, "sam", "security")
    with thread_server(app) as url:
        login(page, url, "sam", f"/credentials/{sender.public_id}")
        panel = page.locator(f"#revocation-{sender.key_id}")
        expect(panel.locator(".propagation")).to_contain_text("Refreshed on 2 of 2")
        expect(panel).to_contain_text("1 accepted")
        expect(panel).to_contain_text("2 refused")
        panel.locator("table.accepted-after a", has_text="evt_late").click()
        page.wait_for_url(f"{url}/receipts/{sender.public_id}/evt_late")
        assert page.console_errors == []
