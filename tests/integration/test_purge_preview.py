"""What the next retention purge will do: `ledger purge --preview --json` and Capacity."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from flask import Flask
from sqlalchemy import insert

from ledger.db.schema import scheduler_runs
from tests.dashboard_helpers import add_receipt, fast_hashes, logged_in
from tests.helpers import make_sender

__all__ = ["fast_hashes"]


def _seed(app: Flask) -> datetime:
    """Old receipts in two scopes (3 and 1), a pending old one, a fresh one, a past run."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    old = now - timedelta(seconds=svc.settings.retention_seconds + 7200)
    acme, globex = make_sender(app), make_sender(app, account="globex", name="shop")
    for i in range(3):
        add_receipt(app, acme.scope_id, f"evt_old_{i}", accepted_at=old)
    add_receipt(app, globex.scope_id, "evt_old_g", state=2, accepted_at=old)
    add_receipt(app, acme.scope_id, "evt_pending", state=0, accepted_at=old)
    add_receipt(app, acme.scope_id, "evt_new")
    with svc.engine.begin() as conn:
        conn.execute(insert(scheduler_runs).values(
            job="retention", period_start=now - timedelta(hours=1), instance="s1",
            started_at=now - timedelta(hours=1), outcome="ok",
            finished_at=now - timedelta(hours=1) + timedelta(seconds=42), rows_affected=0))
    return now


def test_cli_preview_json(app: Flask) -> None:
    now = _seed(app)
    result = app.test_cli_runner().invoke(args=["ledger", "purge", "--preview", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"next_run_at", "expired_receipts", "payloads_dropped", "by_scope"}
    assert out["expired_receipts"] == 4
    assert out["by_scope"] == [{"scope": "acme/stripe-prod", "expired_receipts": 3},
                               {"scope": "globex/shop", "expired_receipts": 1}]
    next_run = datetime.fromisoformat(out["next_run_at"])
    assert now < next_run <= now + timedelta(hours=1)
    assert out["payloads_dropped"] >= 1  # the failed one's payload is past review
    text = app.test_cli_runner().invoke(args=["ledger", "purge", "--preview"]).output
    assert "acme/stripe-prod: 3" in text


def test_capacity_page_shows_the_next_purge(app: Flask) -> None:
    _seed(app)
    page = logged_in(app, "viewer").get("/capacity").get_data(as_text=True)
    assert 'id="purge-preview"' in page and "took 42s" in page
    assert "acme/stripe-prod" in page and "globex/shop" in page
    assert "7.0035" not in page
