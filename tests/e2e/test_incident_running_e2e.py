"""Work in flight in a real browser: the real blocker is named, throughput is on Overview."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.integration.test_dashboard_running import seed_in_flight
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_slow_handler_is_named_as_the_blocker(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    seed_in_flight(app)
    make_operator(app, "olga", "oncall")
    with thread_server(app) as url:
        login(page, url, "olga", "/stuck")
        running = page.locator("#running-table tr", has_text="evt_slow")
        expect(running).to_contain_text("w:1:live")
        expect(running).to_contain_text("past its lease")
        expect(page.locator("#stuck-table tr", has_text="evt_slow")).to_contain_text(
            "held by live worker w:1:live past its lease")
        expect(page.locator("#stuck-table tr", has_text="evt_gone")).to_contain_text(
            "lease expired, not retaken")
        running.locator("a", has_text="evt_slow").click()
        expect(page.locator("#job-state")).to_contain_text("running now")
        expect(page.locator("#job-state")).not_to_contain_text("waiting for a worker")
        page.goto(f"{url}/")
        card = page.locator("#throughput")
        expect(card).to_contain_text("completed / min")
        expect(card).to_contain_text("waited 14m")
        expect(card.locator("svg line.axis-line")).to_have_count(2)
        assert page.console_errors == []
