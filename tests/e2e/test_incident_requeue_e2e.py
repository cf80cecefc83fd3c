"""A bulk requeue in a real browser: focus and announcement, the group gone at once, live
follow-through counts, and a group's link to its own members."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from ledger.worker.loop import Worker
from tests.dashboard_helpers import fast_hashes, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.e2e.incident import login
from tests.integration.test_dashboard_requeue_followup import seed_groups
from tests.servers import thread_server

browser, page, fast_hashes = base.browser, base.page, fast_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_requeue_a_group_and_follow_it_through(page: Any, app: Flask) -> None:
    from playwright.sync_api import expect

    gid = seed_groups(app)
    make_operator(app, "olga", "oncall")
    with thread_server(app) as url:
        login(page, url, "olga", "/failures/groups")
        row = page.locator(f"#groups-table tr[data-group='{gid}']")
        row.locator("a.group-members").click()
        page.wait_for_url(f"{url}/failures?*group={gid}*")
        expect(page.locator("#failures-table")).to_contain_text("evt_boom_2")
        expect(page.locator("#failures-table")).not_to_contain_text("evt_key")
        page.goto(f"{url}/failures/groups")
        row = page.locator(f"#groups-table tr[data-group='{gid}']")
        row.locator("input[name=reason]").fill("bad deploy rolled back")
        row.locator("button", has_text="Requeue group").click()
        confirm = page.locator("#bulk .confirm")
        expect(confirm).to_be_focused()
        expect(page.locator("#bulk")).to_have_attribute("aria-live", "polite")
        confirm.locator("button.danger").click()
        done = page.locator("#bulk .progress-box")
        expect(done).to_contain_text("Done: 3 requeued")
        expect(done).to_be_focused()
        expect(done).to_contain_text("3 pending")
        # The group leaves the table at once (no wait for the next refresh).
        expect(page.locator(f"#groups-table tr[data-group='{gid}']")).to_have_count(0)
        Worker(app.extensions["ledger"], worker_id="w-e2e").run(burst=True)
        expect(done).to_contain_text("3 complete", timeout=15_000)
        assert page.console_errors == []
