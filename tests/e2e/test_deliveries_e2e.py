"""The delivery log in a real browser: a security engineer sees a refused delivery with its key.

"Who still signs with key K, from where?": from the Credentials page (uses after
revocation) to the Deliveries page filtered by that key, with the refusal's reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.dashboard_helpers import PASSWORD, make_operator
from tests.e2e.test_dashboard_e2e import _shot, browser, page  # noqa: F401  (fixtures)
from tests.helpers import Sender, deliver, make_sender
from tests.servers import sqlite_app, thread_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@dataclass(frozen=True, slots=True)
class Leak:
    """A running dashboard whose integration's first key was revoked and then used."""

    url: str
    sender: Sender


@pytest.fixture(scope="module")
def leak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leak]:
    """Serve the app over SQLite with a revoked key still signing deliveries."""
    from ledger.access import audit
    from ledger.access.credentials import revoke_credential

    with sqlite_app(tmp_path_factory.mktemp("e2e-deliveries")) as app:
        svc = app.extensions["ledger"]
        sender = make_sender(app)
        client = app.test_client()
        deliver(client, sender, "evt_before_the_leak")
        with svc.engine.begin() as conn:
            revoke_credential(conn, audit.Actor(name="test", role="admin"), sender.key_id,
                              reason="leaked in a paste", now=svc.clock.now())
        svc.view.invalidate()
        assert deliver(client, sender, "evt_after_the_leak").status_code == 401
        svc.delivery_log.flush(everything=True)
        make_operator(app, "sec", "security")
        with thread_server(app) as url:
            yield Leak(url=url, sender=sender)

def test_security_sees_a_refused_delivery_with_its_key(page: Any, leak: Leak) -> None:  # noqa: F811
    from playwright.sync_api import expect

    page.goto(f"{leak.url}/credentials/{leak.sender.public_id}")
    page.fill("input[name=username]", "sec")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/credentials/in_.*"))
    row = page.locator(f"tr:has(code:text-is('{leak.sender.key_id}'))")
    expect(row.locator(".bad-use")).to_have_text("1")  # one use after the revocation
    row.locator(f"a[href*='key_id={leak.sender.key_id}']").click()
    page.wait_for_url(re.compile(rf".*/deliveries\?key_id={leak.sender.key_id}$"))
    table = page.locator("#deliveries")
    refused = table.locator("tr.delivery-unauthenticated")
    expect(refused).to_have_count(1)
    expect(refused).to_contain_text(leak.sender.key_id)
    expect(refused).to_contain_text("401")
    expect(refused).to_contain_text("revoked_key")
    expect(refused).to_contain_text("127.0.0.1")
    expect(table.locator("tr.delivery-accepted")).to_contain_text("evt_before_the_leak")
    # Narrow to refusals with htmx: the table is swapped in place and the URL follows.
    page.select_option("select[name=outcome]", "unauthenticated")
    page.wait_for_url(re.compile(r".*outcome=unauthenticated.*"))
    expect(table.locator("tr.delivery-accepted")).to_have_count(0)
    expect(refused).to_have_count(1)
    _shot(page, "20-deliveries-refused-key")
    assert page.console_errors == []
