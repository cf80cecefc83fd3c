"""Evidence and ergonomics in a real browser (Debian's chromium, headless): the conflict diff,
exporting a filter, the leaked-key drill, 390 px phones, dark mode, local times and "/"."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_helpers import PASSWORD, add_receipt, make_operator
from tests.e2e.test_dashboard_e2e import CHROMIUM, SCREENSHOTS, TIMEOUT_MS, browser  # noqa: F401
from tests.helpers import deliver, make_sender
from tests.servers import sqlite_app, thread_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def evidence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """Serve the app on loopback over a SQLite ledger holding a conflict and failures."""
    with sqlite_app(tmp_path_factory.mktemp("e2e-evidence"),
                    LEDGER_REVOCATION_BOUND_SECONDS="2") as app:
        sender = make_sender(app)
        client = app.test_client()
        deliver(client, sender, "evt_order", "demo.credit", {"amount": 5, "currency": "EUR"})
        deliver(client, sender, "evt_order", "demo.credit", {"amount": 500, "note": "edited"})
        for i in range(12):
            add_receipt(app, sender.scope_id, f"evt_fail_{i:02d}", state=2,
                        event_type="demo.fail" if i % 3 else "demo.other",
                        error="RuntimeError: downstream said no, with a long message " * 2)
        make_operator(app, "sam", "admin")
        with thread_server(app) as url:
            yield url, sender


def _page(browser: Any, **context: Any) -> Any:  # noqa: F811
    """Open a logged-in page in a new context (viewport, colour scheme, zone as given)."""
    ctx = browser.new_context(**{"viewport": {"width": 1360, "height": 900}, **context})
    tab = ctx.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    tab.console_errors = []
    tab.on("pageerror", lambda e: tab.console_errors.append(str(e)))
    return tab


def _login(tab: Any, url: str, path: str) -> None:
    """Log in as the seeded admin and land on `path`."""
    tab.goto(f"{url}{path}")
    tab.fill("input[name=username]", "sam")
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url(re.compile(".*" + re.escape(path.split("?")[0]) + ".*"))


def _shot(tab: Any, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_conflict_diff_and_export_of_a_filter(browser: Any, evidence_server: tuple[str, Any],  # noqa: F811
                                              tmp_path: Path) -> None:
    from playwright.sync_api import expect

    url, _ = evidence_server
    tab = _page(browser, accept_downloads=True)
    _login(tab, url, "/conflicts")
    expect(tab.locator("#conflicts")).to_contain_text("(incoming body kept)")
    tab.click("#conflicts a:has-text('evt_order')")
    diff = tab.locator("#diff")
    expect(diff).to_contain_text("$.data.amount")
    expect(diff).to_contain_text("500")
    expect(diff.locator("tr.diff-added")).to_contain_text("$.data.note")
    expect(diff.locator("tr.diff-removed")).to_contain_text("$.data.currency")
    _shot(tab, "20-conflict-diff")

    tab.goto(f"{url}/failures")
    tab.fill("input[name=event_type]", "demo.other")
    tab.press("input[name=event_type]", "Enter")
    tab.wait_for_url(re.compile(r".*event_type=demo\.other.*"))
    with tab.expect_download() as download:
        tab.click("a[data-export]:has-text('CSV')")
    saved = tmp_path / "failures.csv"
    download.value.save_as(saved)
    rows = list(csv.DictReader(io.StringIO(saved.read_text())))
    assert sorted(r["event_id"] for r in rows) == ["evt_fail_00", "evt_fail_03", "evt_fail_06",
                                                    "evt_fail_09"]
    _shot(tab, "21-export-filter")
    assert tab.console_errors == []


def test_drill_runs_from_the_credentials_page(browser: Any,  # noqa: F811
                                              evidence_server: tuple[str, Any]) -> None:
    from playwright.sync_api import expect

    url, _ = evidence_server
    tab = _page(browser)
    _login(tab, url, "/credentials")
    tab.fill("#drill input[name=password]", PASSWORD)
    tab.click("#drill button[type=submit]")
    status = tab.locator("#drill-status")
    expect(status).to_contain_text("PASS", timeout=30_000)  # the first steps, while it runs
    expect(status).to_contain_text("passed", timeout=90_000)
    expect(status).to_contain_text("PASS cleanup")
    expect(status).not_to_contain_text("FAIL")
    _shot(tab, "22-drill-passed")
    tab.click("#drill-status a:has-text('audit log')")
    expect(tab.locator("#audit")).to_contain_text("drill.finish")
    assert tab.console_errors == []


def test_phone_width_dark_mode_local_times_and_slash(browser: Any, evidence_server: tuple[str, Any]  # noqa: F811
                                                    ) -> None:
    from playwright.sync_api import expect

    url, sender = evidence_server
    tab = _page(browser, viewport={"width": 390, "height": 844}, color_scheme="dark",
                timezone_id="Asia/Tokyo")
    _login(tab, url, "/failures")
    expect(tab.locator("#failures")).to_contain_text("evt_fail_00")
    # The page itself never scrolls sideways at 390 px: a wide table scrolls in its own box.
    width = tab.evaluate("document.documentElement.scrollWidth")
    wide = tab.evaluate("""[...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > 391 && !e.closest('table'))
        .map(e => e.tagName + '.' + e.className + ':'
                  + Math.round(e.getBoundingClientRect().right))
        .slice(0, 8)""")
    assert width <= 390, (width, wide)
    table = tab.locator("#failures table.grid").first
    assert table.evaluate("t => t.scrollWidth > t.clientWidth")
    background = tab.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(17, 24, 39)", background
    _shot(tab, "23-failures-390px-dark")

    tab.goto(f"{url}/receipts/{sender.public_id}/evt_fail_00")
    first_time = tab.locator("main time[datetime]").first
    expect(first_time).to_have_text(re.compile(r".*Z$"))
    # One time zone: lists and filters speak UTC in any browser; local time is a tooltip.
    expect(first_time).to_have_attribute("title", re.compile(r".*\+09:00$"))
    _shot(tab, "24-receipt-local-time-dark")

    tab.goto(f"{url}/receipts")
    tab.keyboard.press("/")
    focused = tab.evaluate("document.activeElement.name")
    assert focused  # the page's first filter input (or the header search when present)
    assert tab.evaluate("document.activeElement.closest('form.filters, header') !== null")
    assert tab.console_errors == []
