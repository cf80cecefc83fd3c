"""Baseline: the least a durable webhook consumer must do, served like the ledger.

Read the body, check one Standard Webhooks HMAC, insert receipt + job in one
transaction, answer after commit. No framework beyond Flask, no pool, no logs.
THIN_DATABASE_URL is `postgresql://...` or `sqlite:///path`; THIN_SECRET a whsec_ key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sqlite3
import threading
from datetime import UTC, datetime
from typing import Any

from flask import Flask, request

app = Flask(__name__)
KEY = base64.b64decode(os.environ.get("THIN_SECRET", "whsec_").removeprefix("whsec_"))
URL = os.environ.get("THIN_DATABASE_URL", "")
LOCAL = threading.local()
RECEIPT = ("INSERT INTO receipts (accepted_at, scope_id, state, attempts, event_id, event_type,"
           " body_sha256) VALUES (%s, 1, 0, 0, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1")
JOB = ("INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status,"
       " attempts, lease_token, payload) VALUES (1, %s, %s, %s, %s, 0, 0, 0, %s)")


def connection():  # type: ignore[no-untyped-def]
    """Return this thread's connection (opened once)."""
    if not hasattr(LOCAL, "conn"):
        if URL.startswith("sqlite"):
            LOCAL.conn = sqlite3.connect(URL.split("///", 1)[1], isolation_level=None,
                                         timeout=10, check_same_thread=False)
            LOCAL.conn.execute("PRAGMA journal_mode=WAL")
            LOCAL.conn.execute("PRAGMA synchronous=FULL")
        else:
            import psycopg

            LOCAL.conn = psycopg.connect(URL)
    return LOCAL.conn


def claim(event_id: str, event_type: str, body: bytes) -> bool:
    """Insert receipt and job in one transaction; False for a duplicate."""
    conn, now, digest = connection(), datetime.now(UTC), hashlib.sha256(body).digest()
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN IMMEDIATE")
        new = conn.execute(RECEIPT.replace("%s", "?"), (now.isoformat(), event_id,
                           event_type, digest)).fetchone() is not None
        if new:
            conn.execute(JOB.replace("%s", "?"), (event_id, event_type, now.isoformat(),
                         now.isoformat(), body.decode()))
        conn.execute("COMMIT")
        return new
    with conn.transaction():
        new = conn.execute(RECEIPT, (now, event_id, event_type, digest)).fetchone() is not None
        if new:
            conn.execute(JOB, (event_id, event_type, now, now, body.decode()))
    return new


def verified_event_id(body: bytes, headers: Any) -> str | None:
    """Return the event id when the request's one Standard Webhooks HMAC holds, else None."""
    event_id = headers.get("webhook-id", "")
    signed = f"{event_id}.{headers.get('webhook-timestamp', '')}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.digest(KEY, signed, "sha256")).decode()
    if not hmac.compare_digest(expected, headers.get("webhook-signature", "")):
        return None
    return str(event_id)


@app.post("/hooks/<public_id>")
def receive(public_id: str):  # type: ignore[no-untyped-def]
    """Authenticate, claim, answer."""
    body = request.get_data()
    event_id = verified_event_id(body, request.headers)
    if event_id is None:
        return {"error": "unauthenticated"}, 401
    event_type = json.loads(body)["type"]
    if claim(event_id, event_type, body):
        return {"status": "accepted", "event_id": event_id, "state": "pending"}, 202
    return {"status": "duplicate", "event_id": event_id}, 200


@app.get("/healthz")
def healthz():  # type: ignore[no-untyped-def]
    """Answer while the process runs."""
    return {"status": "ok"}
