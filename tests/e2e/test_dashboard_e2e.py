"""The dashboard in a real browser (Debian's chromium, headless): log in, filter with htmx,
requeue a failure, revoke a credential with re-authentication, find the audit rows."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_helpers import PASSWORD, add_conflict, add_receipt, make_operator
from tests.helpers import Sender, deliver, make_sender
from tests.servers import sqlite_app, thread_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).parent / "screenshots"
TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class Live:
    """A running dashboard and what was seeded into it."""

    url: str
    sender: Sender
    other: Sender


def _seed(app: Any) -> tuple[Sender, Sender]:
    """Fill the ledger with receipts of every kind and a security operator."""
    sender = make_sender(app)
    other = make_sender(app, account="globex", name="github-app", profile="github")
    client = app.test_client()
    for i in range(6):
        deliver(client, sender, f"evt_ok_{i}", "order.paid" if i % 2 else "demo.credit")
    now = app.extensions["ledger"].clock.now()
    add_receipt(app, sender.scope_id, "evt_broken", state=2, event_type="demo.fail",
                error="RuntimeError: downstream said no")
    add_receipt(app, other.scope_id, "evt_old", state=0, accepted_at=now - timedelta(hours=3))
    add_conflict(app, sender.scope_id, "evt_ok_1")
    make_operator(app, "sam", "admin")
    return sender, other


@pytest.fixture(scope="module")
def dashboard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Serve the real app on a free loopback port over a seeded SQLite ledger."""
    with sqlite_app(tmp_path_factory.mktemp("e2e")) as app:
        sender, other = _seed(app)
        with thread_server(app) as url:
            yield Live(url=url, sender=sender, other=other)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Launch Debian's chromium headless."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (make test installs it: scripts/system-deps.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser page that records console errors and uncaught exceptions."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.console_errors = errors
    try:
        yield tab
    finally:
        context.close()


def _shot(page: Any, name: str) -> None:
    """Save a full-page screenshot of the current page."""
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def _login(page: Any, dashboard_server: Live) -> None:
    """Log in as the seeded admin."""
    page.goto(f"{dashboard_server.url}/receipts")
    assert "/login" in page.url
    _shot(page, "00-login")
    page.fill("input[name=username]", "sam")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/receipts$"))


def test_operator_journey(page: Any, dashboard_server: Live) -> None:
    from playwright.sync_api import expect

    _login(page, dashboard_server)
    # Filter receipts with htmx: the table is swapped in place and the URL follows.
    expect(page.locator("#receipts")).to_contain_text("evt_ok_0")
    _shot(page, "02-receipts")
    page.fill("input[name=event_type]", "order.paid")
    page.press("input[name=event_type]", "Enter")
    page.wait_for_url(re.compile(r".*event_type=order\.paid.*"))
    expect(page.locator("#receipts")).not_to_contain_text("evt_ok_0")
    expect(page.locator("#receipts")).to_contain_text("evt_ok_1")

    page.goto(f"{dashboard_server.url}/receipts/{dashboard_server.sender.public_id}/evt_broken")
    expect(page.locator("ol.timeline")).to_contain_text("downstream said no")
    _shot(page, "03-receipt-detail")

    # Requeue one failure.
    page.goto(f"{dashboard_server.url}/failures")
    _shot(page, "04-failures")
    row = page.locator("tr", has_text="evt_broken")
    row.locator("input[name=reason]").fill("downstream fixed")
    row.locator("button", has_text="Requeue").click()
    expect(row).to_contain_text("Requeued acme/stripe-prod:evt_broken")

    # Revoke a credential: it is the integration's last live key, so that is said and
    # confirmed first, and the password is asked again.
    page.goto(f"{dashboard_server.url}/credentials/{dashboard_server.sender.public_id}")
    page.on("dialog", lambda dialog: dialog.accept())
    cred = page.locator("tr", has_text=dashboard_server.sender.key_id)
    cred.locator("input[name=reason]").fill("leaked in CI logs")
    cred.locator("input[name=password]").fill(PASSWORD)
    cred.locator("button", has_text="Revoke").click()
    confirm = page.locator("form.confirm-last")
    expect(confirm).to_contain_text("last live key")
    expect(page.locator("tr", has_text=dashboard_server.sender.key_id)).to_contain_text("active")
    confirm.locator("input[name=password]").fill("wrong password")
    confirm.locator("button", has_text="Revoke the last key").click()
    expect(page.locator("#credentials")).to_contain_text("did not match")
    # The refused attempts answered 409 and 403 on purpose; the browser logs those only.
    assert [e for e in page.console_errors if "403" not in e and "409" not in e] == []
    page.console_errors.clear()
    confirm = page.locator("form.confirm-last")
    expect(confirm.locator("input[name=reason]")).to_have_value("leaked in CI logs")
    confirm.locator("input[name=password]").fill(PASSWORD)
    confirm.locator("button", has_text="Revoke the last key").click()
    revoked = f"Revoked {dashboard_server.sender.key_id}"
    expect(page.locator("#credentials")).to_contain_text(revoked)
    expect(page.locator("tr", has_text=dashboard_server.sender.key_id)).to_contain_text("revoked")
    _shot(page, "07-credentials")

    # Both actions are in the audit log, with actor, role and reason; the chain holds.
    page.goto(f"{dashboard_server.url}/audit")
    expect(page.locator("#chain")).to_contain_text("Hash chain verified")
    revoke = page.locator("#audit tr", has_text="credential.revoke")
    expect(revoke).to_contain_text("sam")
    expect(revoke).to_contain_text("leaked in CI logs")
    expect(page.locator("#audit tr", has_text="receipt.requeue")).to_contain_text(
        "downstream fixed")
    _shot(page, "08-audit")
    assert page.console_errors == []


def test_every_page_renders_without_console_errors(page: Any, dashboard_server: Live) -> None:
    from playwright.sync_api import expect

    _login(page, dashboard_server)
    for name, path, marker in (
        ("01-overview", "/", "Scopes"),
        ("05-stuck", "/stuck", "evt_old"),
        ("06-conflicts", "/conflicts", "evt_ok_1"),
        ("06b-integrations", "/credentials", "globex/github-app"),
        ("09-capacity", "/capacity", "Capacity"),
        ("10-operators", "/operators", "sam"),
    ):
        page.goto(f"{dashboard_server.url}{path}")
        expect(page.locator("main")).to_contain_text(marker)
        _shot(page, name)
    assert page.console_errors == []


def test_logout_ends_the_session(page: Any, dashboard_server: Live) -> None:
    _login(page, dashboard_server)
    page.click("text=Log out")
    page.wait_for_url(re.compile(r".*/login$"))
    page.goto(f"{dashboard_server.url}/")
    assert "/login" in page.url
    assert page.console_errors == []


def test_the_audit_page_verifies_the_chain_chunk_by_chunk(page: Any, dashboard_server: Live,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A long log is verified a few rows per request; the status continues to the verdict."""
    from playwright.sync_api import expect

    from ledger.access import audit

    monkeypatch.setattr(audit, "VERIFY_CHUNK", 2)  # the server runs in this process
    _login(page, dashboard_server)
    chunks: list[str] = []
    page.on("request", lambda r: chunks.append(r.url) if "/audit/verify" in r.url else None)
    page.goto(f"{dashboard_server.url}/audit")
    expect(page.locator("#chain")).to_contain_text("Hash chain verified")
    assert len(chunks) > 2 and any("after=" in url for url in chunks)
    assert page.locator("#chain").get_attribute("hx-get") is None  # the verdict stays put
    assert page.console_errors == []
