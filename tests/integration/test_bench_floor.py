"""The bench's gunicorn floor claims like an intake: one receipt and one job per new id."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator

import psycopg
import pytest
from werkzeug.test import Client

from bench import floor_intake
from bench.schemas import create_thin_pg
from bench.thin_intake import KEY

BODY = json.dumps({"type": "demo.credit", "data": {"amount": 3}}).encode()


def _headers(event_id: str, key: bytes = KEY) -> dict[str, str]:
    signed = f"{event_id}.1700000000.".encode() + BODY
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": event_id, "webhook-timestamp": "1700000000",
            "webhook-signature": f"v1,{signature}"}


@pytest.fixture
def floor(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The floor's app on a fresh thin schema; yields the driver URL."""
    url = empty_db_url.replace("+psycopg", "")
    create_thin_pg(url)
    monkeypatch.setattr(floor_intake, "URL", url)
    monkeypatch.setattr(floor_intake, "LOCAL", threading.local())
    yield url
    conn = getattr(floor_intake.LOCAL, "conn", None)
    if conn is not None:
        conn.close()


@pytest.mark.parametrize("empty_db_url", ["postgresql"], indirect=True)
def test_a_new_id_is_claimed_once_a_replay_is_a_duplicate_a_forgery_refused(floor: str) -> None:
    client = Client(floor_intake.app)
    first = client.post("/hooks/in_x", data=BODY, headers=_headers("evt_floor_1"))
    assert first.status_code == 202 and first.json == {
        "status": "accepted", "event_id": "evt_floor_1", "state": "pending"}
    again = client.post("/hooks/in_x", data=BODY, headers=_headers("evt_floor_1"))
    assert again.status_code == 200 and again.json["status"] == "duplicate"
    forged = client.post("/hooks/in_x", data=BODY, headers=_headers("evt_floor_2", b"other"))
    assert forged.status_code == 401
    assert client.get("/healthz").json == {"status": "ok"}
    with psycopg.connect(floor) as conn:
        receipts = conn.execute("SELECT event_id FROM receipts").fetchall()
        jobs = conn.execute("SELECT event_id, event_type, payload FROM jobs").fetchall()
    assert receipts == [("evt_floor_1",)]
    assert jobs == [("evt_floor_1", "demo.credit", BODY.decode())]
