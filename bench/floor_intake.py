"""The gunicorn floor: the least an intake served by gunicorn onto PostgreSQL can do.

A plain WSGI callable (no Flask, no pool, no logs, no metrics): read the body,
check one Standard Webhooks HMAC (the thin intake's `verified_event_id`), parse the
JSON for its type, and claim receipt + job in **one autocommit statement** (a
data-modifying CTE, as the ledger's own claim) on the thread's own psycopg
connection; answer 202 or 200. It is served with the ledger's gunicorn shape and
loaded with the same pre-signed requests (bench/intake.py): whatever an intake does
beyond this, it cannot answer more accepted deliveries per second than this does on
the same machine, the same server and the same database. THIN_DATABASE_URL is the
thin schema's `postgresql://...`; THIN_SECRET the whsec_ key.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import psycopg

from bench.thin_intake import verified_event_id

URL = os.environ.get("THIN_DATABASE_URL", "")
LOCAL = threading.local()
CLAIM = ("WITH r AS (INSERT INTO receipts (accepted_at, scope_id, state, attempts, event_id,"
         " event_type, body_sha256) VALUES (%(now)s, 1, 0, 0, %(id)s, %(type)s, %(digest)s)"
         " ON CONFLICT DO NOTHING RETURNING event_id)"
         " INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status,"
         " attempts, lease_token, payload)"
         " SELECT 1, event_id, %(type)s, %(now)s, %(now)s, 0, 0, 0, %(payload)s FROM r")
Start = Callable[[str, list[tuple[str, str]]], Any]


def claim(event_id: str, event_type: str, body: bytes) -> bool:
    """Claim receipt and job in one autocommit statement; False for a duplicate."""
    conn = getattr(LOCAL, "conn", None)
    if conn is None:
        conn = LOCAL.conn = psycopg.connect(URL, autocommit=True)
    now = datetime.now(UTC)
    cursor = conn.execute(CLAIM, {"now": now, "id": event_id, "type": event_type,
                                  "digest": hashlib.sha256(body).digest(),
                                  "payload": body.decode()})
    return cursor.rowcount == 1


def _answer(start: Start, status: str, document: dict[str, str]) -> Iterable[bytes]:
    payload = json.dumps(document).encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
    return [payload]


def app(environ: dict[str, Any], start: Start) -> Iterable[bytes]:
    """Authenticate, claim, answer; /healthz answers ok."""
    if environ["PATH_INFO"] == "/healthz":
        return _answer(start, "200 OK", {"status": "ok"})
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    headers = {"webhook-id": environ.get("HTTP_WEBHOOK_ID", ""),
               "webhook-timestamp": environ.get("HTTP_WEBHOOK_TIMESTAMP", ""),
               "webhook-signature": environ.get("HTTP_WEBHOOK_SIGNATURE", "")}
    event_id = verified_event_id(body, headers)
    if event_id is None:
        return _answer(start, "401 Unauthorized", {"error": "unauthenticated"})
    event_type = json.loads(body)["type"]
    if claim(event_id, event_type, body):
        return _answer(start, "202 Accepted",
                       {"status": "accepted", "event_id": event_id, "state": "pending"})
    return _answer(start, "200 OK", {"status": "duplicate", "event_id": event_id})
