"""Concurrent identical deliveries through a multi-process server end with one receipt."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sqlalchemy import create_engine, func, select

from ledger.db.schema import jobs, receipts
from tests.helpers import event_body, make_sender, signed_headers
from tests.servers import gunicorn_server

CLIENTS = 50
EVENTS = 20


@pytest.fixture
def pg_env(pg_url, tmp_path):
    from tests.conftest import TEST_MASTER_KEY

    return {"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "test",
            "LEDGER_DB_POOL_SIZE": "10", "LEDGER_LOG_LEVEL": "WARNING"}


def _race(url: str, body: bytes, headers: dict[str, str]) -> list[tuple[int, dict]]:
    """POST the same delivery from CLIENTS threads released together by a barrier."""
    barrier = threading.Barrier(CLIENTS)

    def one() -> tuple[int, dict]:
        with requests.Session() as session:
            barrier.wait(timeout=30)
            response = session.post(url, data=body, headers=headers, timeout=30)
            return response.status_code, response.json()

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [f.result() for f in [pool.submit(one) for _ in range(CLIENTS)]]


@pytest.mark.slow
def test_fifty_concurrent_identical_deliveries_make_one_receipt(pg_env):
    from app import create_app

    app = create_app(pg_env)
    sender = make_sender(app)
    app.extensions["ledger"].close()
    with gunicorn_server(pg_env, workers=4) as (base_url, _process):
        for n in range(EVENTS):
            event_id = f"evt_race_{n}"
            body = event_body("stripe", event_id)
            answers = _race(f"{base_url}/hooks/{sender.public_id}", body,
                            signed_headers(sender, body, event_id))
            accepted = [a for a in answers if a == (202, {"status": "accepted",
                                                          "event_id": event_id,
                                                          "state": "pending"})]
            duplicates = [a for a in answers if a == (202, {"status": "duplicate",
                                                            "event_id": event_id,
                                                            "state": "pending"})]
            assert len(accepted) == 1, answers
            assert len(duplicates) == CLIENTS - 1, answers
    engine = create_engine(pg_env["DATABASE_URL"])
    with engine.connect() as conn:
        per_event = conn.execute(
            select(receipts.c.event_id, func.count()).group_by(receipts.c.event_id)).all()
        job_count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
    engine.dispose()
    assert len(per_event) == EVENTS
    assert all(count == 1 for _, count in per_event)
    assert job_count == EVENTS


@pytest.mark.slow
def test_concurrent_overlapping_batches_neither_deadlock_nor_double_claim(pg_env):
    """SendGrid batches sharing events in opposite orders: one receipt each, no 5xx."""
    import json

    from app import create_app
    from tests.profile_keys import KEYS

    app = create_app(pg_env)
    sender = make_sender(app, name="sg", profile="sendgrid", secret=KEYS["sendgrid"].stored,
                         signing_key=KEYS["sendgrid"].signing)
    app.extensions["ledger"].close()
    events = [{"sg_event_id": f"sg_{n}", "event": "delivered"} for n in range(10)]
    bodies = [json.dumps(order).encode() for order in (events, events[::-1])]
    clients = 20
    barrier = threading.Barrier(clients)
    with gunicorn_server(pg_env, workers=4) as (base_url, _process):
        def one(index: int) -> int:
            body = bodies[index % 2]
            headers = signed_headers(sender, body, "batch")
            with requests.Session() as session:
                barrier.wait(timeout=30)
                return session.post(f"{base_url}/hooks/{sender.public_id}", data=body,
                                    headers=headers, timeout=30).status_code

        with ThreadPoolExecutor(clients) as pool:
            statuses = list(pool.map(one, range(clients)))
    assert statuses == [202] * clients
    engine = create_engine(pg_env["DATABASE_URL"])
    with engine.connect() as conn:
        per_event = conn.execute(
            select(receipts.c.event_id, func.count()).group_by(receipts.c.event_id)).all()
        job_count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
    engine.dispose()
    assert sorted(per_event) == [(f"sg_{n}", 1) for n in range(10)]
    assert job_count == 10
