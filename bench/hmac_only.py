"""The server's HMAC-only ceiling: the thin intake without its database.

Read the body, check one Standard Webhooks HMAC, parse the JSON for its type,
answer 202. Served like the ledger (same gunicorn shape) and loaded with the same
pre-signed requests, it is what the web server and Flask cost on this machine before
any database work (bench/ceilings.py). THIN_SECRET is the whsec_ key; the check is
the thin intake's own (`verified_event_id`).
"""

from __future__ import annotations

import json

from flask import Flask, request

from bench.thin_intake import verified_event_id

app = Flask(__name__)


@app.post("/hooks/<public_id>")
def receive(public_id: str):  # type: ignore[no-untyped-def]
    """Authenticate, parse, answer."""
    body = request.get_data()
    event_id = verified_event_id(body, request.headers)
    if event_id is None:
        return {"error": "unauthenticated"}, 401
    event_type = json.loads(body)["type"]
    return {"status": "accepted", "event_id": event_id, "type": event_type}, 202


@app.get("/healthz")
def healthz():  # type: ignore[no-untyped-def]
    """Answer while the process runs."""
    return {"status": "ok"}
