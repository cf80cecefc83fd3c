"""An ended session in a real browser: htmx pages go to login with a banner, never blank."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _log_out_elsewhere(page: Any, url: str) -> None:
    """Log out in a second tab of the same browser (it shares the cookie)."""
    other = page.context.new_page()
    other.goto(f"{url}/capacity")
    other.locator("form.who button").click()
    other.wait_for_url(re.compile(r".*/login$"))
    other.close()


def test_auto_refresh_after_logout_goes_to_login_with_a_banner(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    make_operator(app, "olga", "oncall")
    with thread_server(app) as url:
        page.clock.install()
        login(page, url, "olga", "/stuck")
        _log_out_elsewhere(page, url)
        # The Stuck list refreshes itself: the next refresh finds no session.
        page.clock.run_for(20_000)
        page.wait_for_url(re.compile(r".*/login\?.*expired=1"))
        expect(page.locator("main")).to_contain_text("session has ended")
        assert "unauthenticated" not in page.content()
        # Logging in again returns to the page the operator was on.
        page.fill("input[name=username]", "olga")
        page.fill("input[name=password]", base.PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/stuck$"))


def test_an_action_after_logout_goes_to_login_not_a_json_error(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    make_operator(app, "olga", "oncall")
    with thread_server(app) as url:
        login(page, url, "olga", "/receipts")
        _log_out_elsewhere(page, url)
        # A filter is an htmx request in place: it must not swap an error into the page.
        page.fill("input[name=event_type]", "order.paid")
        page.press("input[name=event_type]", "Enter")
        # Polled, not awaited as one navigation: the filter's htmx requests may each answer
        # with HX-Redirect, and a later redirect aborts an earlier one.
        expect(page).to_have_url(re.compile(r".*/login\?.*expired=1"), timeout=15_000)
        expect(page.locator("main")).to_contain_text("session has ended")
        # A form posted without a session is refused as unauthenticated, not as bad CSRF.
        response = page.request.post(f"{url}/failures/requeue", form={"reason": "x"},
                                     headers={"HX-Request": "true"}, max_redirects=0)
        assert response.status == 401
        assert "/login" in response.headers["hx-redirect"]
