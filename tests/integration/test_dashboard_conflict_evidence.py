"""Conflicts: the incoming body and the original's facts always; a diff after completion only
with the forensic window (LEDGER_CONFLICT_BODY_SECONDS), whose bodies the purge drops."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from flask import Flask
from sqlalchemy import func, select

from jobs.retention_payloads import drop_expired_forensic_bodies
from ledger.db.schema import conflict_bodies, conflicts
from ledger.worker.loop import Worker
from tests.dashboard_helpers import fast_hashes, logged_in
from tests.helpers import deliver, event_body, make_sender

__all__ = ["fast_hashes"]


def _conflict_after_completion(app: Flask) -> int:
    """Deliver evt_1, let the worker complete it, then deliver evt_1 with another body."""
    sender = make_sender(app)
    client = app.test_client()
    assert deliver(client, sender, "evt_1", data={"amount": 5}).status_code == 202
    Worker(app.extensions["ledger"], worker_id="w-test").run(burst=True)
    other = event_body(sender, "evt_1", data={"amount": 500})
    assert deliver(client, sender, "evt_1", body=other).status_code == 409
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(conflicts.c.id)).scalar_one())


def _bodies(app: Flask) -> int:
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(conflict_bodies)).scalar_one())


def test_without_the_window_the_page_still_shows_what_is_known(app: Flask) -> None:
    conflict_id = _conflict_after_completion(app)
    assert _bodies(app) == 0  # off by default: nothing kept
    page = logged_in(app, "oncall").get(f"/conflicts/{conflict_id}").get_data(as_text=True)
    assert 'id="incoming-body"' in page and "500" in page
    assert "complete" in page and "credit" in page  # the original's state and result
    assert 'id="diff"' not in page and "LEDGER_CONFLICT_BODY_SECONDS" in page
    listing = logged_in(app, "viewer", "vic").get("/conflicts").get_data(as_text=True)
    assert "(incoming body kept)" in listing and "leaves with its work item" in listing
    viewer = logged_in(app, "viewer", "val").get(f"/conflicts/{conflict_id}")
    assert 'id="incoming-body"' not in viewer.get_data(as_text=True)


@pytest.fixture
def windowed(test_env: dict[str, str]) -> Iterator[Flask]:
    """The app with a one-hour forensic window."""
    from app import create_app

    application = create_app({**test_env, "LEDGER_CONFLICT_BODY_SECONDS": "3600"})
    yield application
    application.extensions["ledger"].close()


def test_the_window_keeps_the_original_for_a_diff_then_drops_it(windowed: Flask) -> None:
    conflict_id = _conflict_after_completion(windowed)
    assert _bodies(windowed) == 1
    page = logged_in(windowed, "oncall").get(f"/conflicts/{conflict_id}").get_data(as_text=True)
    assert 'id="diff"' in page and "$.data.amount" in page
    assert "forensic window" in page
    capacity = logged_in(windowed, "viewer").get("/capacity").get_data(as_text=True)
    assert "1 bodies" in capacity or "1 body" in capacity
    svc = windowed.extensions["ledger"]
    assert drop_expired_forensic_bodies(svc.engine, svc.clock.now(), 100) == 0
    later = svc.clock.now() + timedelta(hours=2)
    assert drop_expired_forensic_bodies(svc.engine, later, 100) == 1
    assert _bodies(windowed) == 0
