"""The server's HMAC-only ceiling: the thin intake without its database.

Read the body, check one Standard Webhooks HMAC, parse the JSON for its type,
answer 202. Served like the ledger (same gunicorn shape) and loaded with the same
pre-signed requests, it is what the web server and Flask cost on this machine before
any database work (bench/ceilings.py). THIN_SECRET is the whsec_ key.
"""

from __future__ import annotations

import base64
import hmac
import json
import os

from flask import Flask, request

app = Flask(__name__)
KEY = base64.b64decode(os.environ.get("THIN_SECRET", "whsec_").removeprefix("whsec_"))


@app.post("/hooks/<public_id>")
def receive(public_id: str):  # type: ignore[no-untyped-def]
    """Authenticate, parse, answer."""
    body = request.get_data()
    event_id = request.headers.get("webhook-id", "")
    signed = f"{event_id}.{request.headers.get('webhook-timestamp', '')}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.digest(KEY, signed, "sha256")).decode()
    if not hmac.compare_digest(expected, request.headers.get("webhook-signature", "")):
        return {"error": "unauthenticated"}, 401
    event_type = json.loads(body)["type"]
    return {"status": "accepted", "event_id": event_id, "type": event_type}, 202


@app.get("/healthz")
def healthz():  # type: ignore[no-untyped-def]
    """Answer while the process runs."""
    return {"status": "ok"}
