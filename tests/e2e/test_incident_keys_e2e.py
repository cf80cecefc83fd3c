"""Keys in a real browser: a label on a new key, and which key a leaked secret is."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import PASSWORD, fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.helpers import make_sender
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_label_a_key_and_identify_a_leaked_secret(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    sender = make_sender(app)
    make_operator(app, "sam", "security")
    with thread_server(app) as url:
        login(page, url, "sam", f"/credentials/{sender.public_id}")
        add = page.locator("form", has=page.locator("h2", has_text="Add a key"))
        add.locator("input[name=reason]").fill("second sender")
        add.locator("input[name=label]").fill("Zapier bridge")
        add.locator("input[name=password]").fill(PASSWORD)
        add.locator("button[type=submit]").click()
        expect(page.locator("#credentials .key-label", has_text="Zapier bridge")).to_have_count(1)
        page.goto(f"{url}/credentials")
        form = page.locator("#identify form")
        form.locator("input[name=secret]").fill(sender.secret)
        form.locator("input[name=password]").fill(PASSWORD)
        form.locator("button[type=submit]").click()
        result = page.locator("#identify-result")
        expect(result).to_contain_text(sender.key_id)
        expect(result).to_contain_text("acme/stripe-prod")
        expect(result).to_be_focused()
        assert sender.secret not in page.content()
        assert page.console_errors == []
