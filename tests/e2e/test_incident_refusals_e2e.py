"""Finding a refused delivery in a real browser: search by its event id, its key, its category."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.integration.test_dashboard_refusals import _seed
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_oncall_finds_a_refusal_by_its_event_id(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    sender, _ = _seed(app)
    make_operator(app, "olga", "oncall")
    with thread_server(app) as url:
        login(page, url, "olga")
        page.fill("header input[name=q]", "evt_after_revoke")
        page.press("header input[name=q]", "Enter")
        page.wait_for_url(re.compile(r".*/deliveries\?.*event_id=evt_after_revoke"))
        row = page.locator("#deliveries tbody tr", has_text="evt_after_revoke")
        expect(row).to_have_count(1)
        expect(row).to_contain_text(sender.key_id)
        expect(row).to_contain_text("signed")
        expect(row).to_contain_text("revoked_key")
        # A scope prefix narrows the log without the exact account/name.
        box = page.locator("form.filters input[name=integration]")
        box.fill("acme/shop")
        page.locator("form.filters input[name=event_id]").fill("")
        box.press("Enter")
        page.wait_for_url(re.compile(r".*integration=acme%2Fshop.*"))
        expect(page.locator("#deliveries")).to_contain_text("evt_fine")
        expect(page.locator("#deliveries")).not_to_contain_text("evt_stale")
        assert page.console_errors == []
