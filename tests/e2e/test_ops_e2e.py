"""Issue 17 (ops) in a real browser (Debian's chromium, headless): group and requeue failures,
tell stuck from retrying, see a dead worker, find a delivery by account."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, update

from ledger.db.schema import attempts, instances, jobs
from tests.dashboard_helpers import PASSWORD, add_receipt, make_operator
from tests.e2e import test_dashboard_e2e as base
from tests.helpers import Sender, deliver, make_sender
from tests.servers import sqlite_app, thread_server

browser, page, _shot = base.browser, base.page, base._shot  # the browser fixtures, shared

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@dataclass(frozen=True, slots=True)
class Live:
    """A running dashboard and what was seeded into it."""

    url: str
    acme: Sender
    globex: Sender


def _seed_failures(app: Any, acme: Sender, globex: Sender) -> None:
    """Five failures: three of one cause over two scopes, two of others."""
    for sender, event_id, error in (
        (acme, "evt_f1", "ValueError: amount 7 too big for acct_42"),
        (acme, "evt_f2", "ValueError: amount 900 too big for acct_43"),
        (globex, "evt_f3", "ValueError: amount 12 too big for acct_9"),
        (acme, "evt_f4", "KeyError: 'customer'"),
        (globex, "evt_f5", "ConnectionError: ledger-db:5432 refused"),
    ):
        add_receipt(app, sender.scope_id, event_id, state=2, error=error)


def _seed_work(app: Any, acme: Sender) -> None:
    """A retrying job (attempt 2, next in 5 min), a job whose lease expired, a dead worker."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    add_receipt(app, acme.scope_id, "evt_retrying", state=0, accepted_at=now - timedelta(hours=2))
    add_receipt(app, acme.scope_id, "evt_stuck", state=0, accepted_at=now - timedelta(hours=1))
    with svc.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.event_id == "evt_retrying").values(
            attempts=2, run_at=now + timedelta(minutes=5)))
        conn.execute(insert(attempts).values(
            scope_id=acme.scope_id, event_id="evt_retrying", number=2, worker_id="w",
            lease_token=2, started_at=now, finished_at=now, outcome="error",
            error="TimeoutError: downstream took 31 s"))
        conn.execute(update(jobs).where(jobs.c.event_id == "evt_stuck").values(
            attempts=1, leased_by="worker-host:4711:dead", run_at=now - timedelta(minutes=20),
            leased_until=now - timedelta(minutes=20)))
        conn.execute(insert(instances).values(
            id="worker-host:4711:dead", kind="worker", hostname="worker-host", pid=4711,
            started_at=now - timedelta(hours=3), heartbeat_at=now - timedelta(minutes=20)))


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Serve the real app on a free loopback port over a seeded SQLite ledger."""
    with sqlite_app(tmp_path_factory.mktemp("e2e-ops")) as app:
        acme = make_sender(app)
        globex = make_sender(app, account="globex", name="shop")
        client = app.test_client()
        deliver(client, acme, "evt_acme_1")
        deliver(client, globex, "evt_globex_1")
        deliver(client, globex, "evt_globex_2")
        _seed_failures(app, acme, globex)
        _seed_work(app, acme)
        make_operator(app, "olga", "oncall")
        with thread_server(app) as url:
            yield Live(url=url, acme=acme, globex=globex)


def _login(page: Any, ops_server: Live) -> None:
    """Log in as the seeded on-call operator."""
    page.goto(f"{ops_server.url}/")
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def test_see_a_dead_worker(page: Any, ops_server: Live) -> None:
    from playwright.sync_api import expect

    _login(page, ops_server)
    expect(page.locator(".banner")).to_contain_text("Work is due and no worker is alive")
    expect(page.locator("#live-counts")).to_contain_text("0 worker")
    dead = page.locator("tr", has_text="worker-host:4711")
    expect(dead).to_have_class(re.compile("dead"))
    expect(dead).to_contain_text("dead (not counted)")
    _shot(page, "ops-01-dead-worker")
    assert page.console_errors == []


def test_tell_stuck_from_retrying(page: Any, ops_server: Live) -> None:
    from playwright.sync_api import expect

    _login(page, ops_server)
    page.click("header nav >> text=Stuck work")
    stuck = page.locator("#stuck-table tr", has_text="evt_stuck")
    expect(stuck).to_contain_text("no live worker")
    expect(stuck).to_contain_text("worker-host:4711:dead")
    retrying = page.locator("#retrying-table tr", has_text="evt_retrying")
    expect(retrying).to_contain_text("2 of 8")
    expect(retrying).to_contain_text("TimeoutError: downstream took 31 s")
    expect(page.locator("#stuck-table")).not_to_contain_text("evt_retrying")
    _shot(page, "ops-02-stuck-and-retrying")
    assert page.console_errors == []


def test_group_and_requeue_failures(page: Any, ops_server: Live) -> None:
    from playwright.sync_api import expect

    _login(page, ops_server)
    page.click("header nav >> text=Failures")
    group = page.locator("#groups-table tr", has_text="too big for <id>")
    expect(group).to_contain_text("3")
    expect(group).to_contain_text("acme/stripe-prod")
    expect(group).to_contain_text("globex/shop")
    _shot(page, "ops-03-failure-groups")
    group.locator("input[name=reason]").fill("limit raised downstream")
    group.locator("button", has_text="Requeue group").click()
    confirm = page.locator("#bulk .confirm")
    expect(confirm).to_contain_text("Requeue 3 failed receipts")
    confirm.locator("button", has_text="Yes, requeue 3").click()
    expect(page.locator("#bulk")).to_contain_text("Done: 3 requeued")
    _shot(page, "ops-04-group-requeued")
    page.goto(f"{ops_server.url}/failures/groups")
    expect(page.locator("#groups-table")).not_to_contain_text("too big for")
    other = page.locator("#groups-table tr", has_text="KeyError")
    other.locator("input[name=note]").fill("known: old customers")
    other.locator("button", has_text="Mute").click()
    expect(page.locator("#muted-groups")).to_contain_text("1 muted group")
    expect(page.locator("#groups-table")).not_to_contain_text("KeyError")
    page.click("text=Flat list of every failure")
    expect(page.locator("#failures")).to_contain_text("evt_f4")
    assert page.console_errors == []


def test_find_a_delivery_by_account(page: Any, ops_server: Live) -> None:
    from playwright.sync_api import expect

    _login(page, ops_server)
    search = page.locator("header form.search input[name=q]")
    search.fill("globex")
    search.press("Enter")
    page.wait_for_url(re.compile(r".*/receipts\?scope=globex$"))
    expect(page.locator("#receipts")).to_contain_text("evt_globex_2")
    expect(page.locator("#receipts")).not_to_contain_text("evt_acme_1")
    _shot(page, "ops-05-search-account")
    search = page.locator("header form.search input[name=q]")
    search.fill("evt_globex_1")
    search.press("Enter")
    page.wait_for_url(re.compile(rf".*/receipts/{ops_server.globex.public_id}/evt_globex_1$"))
    expect(page.locator("main")).to_contain_text("evt_globex_1")
    _shot(page, "ops-06-search-event")
    assert page.console_errors == []
