"""The next retention purge in a real browser: when, how many per scope, how long last time."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.integration.test_purge_preview import _seed
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_capacity_previews_the_next_purge(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    _seed(app)
    make_operator(app, "vic", "viewer")
    with thread_server(app) as url:
        login(page, url, "vic", "/capacity")
        preview = page.locator("#purge-preview")
        expect(preview).to_contain_text("Next run")
        expect(preview).to_contain_text("took 42s")
        expect(page.locator("#purge-scopes tr", has_text="acme/stripe-prod")).to_contain_text("3")
        expect(page.locator("#purge-scopes tr", has_text="globex/shop")).to_contain_text("1")
        assert "7.0035" not in page.content()
