"""Real payloads nobody here wrote, signed as their sender signs them and sent over HTTP in
bulk on both databases: every one accepted with the id and type the sender means.

Corpora: `@octokit/webhooks-examples` (tests/js, `make js-deps`), GitHub's own webhook
payloads for every event and action (the suite runs one example per event, alternating
JSON and form bodies); and every event type the `stripe` package lists for webhook
endpoints, each as an event signed by stripe's own `generate_signature_header` (the
suite runs every tenth type). The whole corpora run with

    LEDGER_SENDER_CORPUS=full .venv/bin/python -m pytest -n 0 \
        tests/integration/test_sender_corpus.py
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
import stripe
from sqlalchemy import select

from ledger.db.schema import receipts
from tests.helpers import make_sender

ROOT = Path(__file__).resolve().parents[2]
OCTOKIT = ROOT / "tests/js/node_modules/@octokit/webhooks-examples/api.github.com/index.json"
SECRET = "corpus-github-secret"
FULL = os.environ.get("LEDGER_SENDER_CORPUS") == "full"


def github_examples() -> list[tuple[str, dict[str, Any]]]:
    """Return (event name, payload) pairs: all of them, or the first of each event."""
    if not OCTOKIT.exists():
        missing = "@octokit/webhooks-examples is not installed: run `make js-deps`"
        if os.environ.get("CI") == "true":  # make test installs it: absent is a failure
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(missing)
    corpus = json.loads(OCTOKIT.read_text())
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for event in corpus:
        for example in event["examples"] if FULL else event["examples"][:1]:
            # The corpus repeats a few payloads verbatim; GitHub never sends one body under
            # two delivery ids, and the ledger rightly answers such a body as a duplicate.
            found.setdefault(json.dumps(example, sort_keys=True), (event["name"], example))
    return list(found.values())


def expected_type(name: str, payload: dict[str, Any]) -> str:
    """The type GitHub means: the event, and its action when it has one."""
    action = payload.get("action")
    return f"{name}.{action}" if isinstance(action, str) and action else name


def test_octokit_github_examples_are_accepted_as_github_means(app, live) -> None:
    """Each payload, as JSON or as GitHub's form body, gets the delivery id and event type."""
    examples = github_examples()
    sender = make_sender(app, name="gh-corpus", profile="github", secret=SECRET)
    expected: dict[str, str] = {}
    refused: list[tuple[str, int, str]] = []
    with requests.Session() as session:
        for index, (name, payload) in enumerate(examples):
            text = json.dumps(payload)
            form = index % 2 == 1
            body = (("payload=" + quote(text, safe="")) if form else text).encode()
            delivery = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{index}"))
            headers = {
                "X-GitHub-Event": name, "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body,
                                                            hashlib.sha256).hexdigest(),
                "Content-Type": ("application/x-www-form-urlencoded" if form
                                 else "application/json")}
            answer = session.post(f"{live}/hooks/{sender.public_id}", data=body,
                                  headers=headers, timeout=60)
            if answer.status_code != 202 or answer.json().get("event_id") != delivery:
                refused.append((name, answer.status_code, answer.text[:200]))
            expected[delivery] = expected_type(name, payload)
    assert refused == []
    with app.extensions["ledger"].engine.connect() as conn:
        recorded = dict(conn.execute(select(receipts.c.event_id, receipts.c.event_type)).all())
    assert recorded == expected
    assert len(recorded) == len(examples)


def stripe_event_types() -> list[str]:
    """Return the event types the stripe package lists for webhook endpoints."""
    source = Path(stripe.__file__).parent / "params" / "_webhook_endpoint_create_params.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "enabled_events"):
            types = sorted({leaf.value for leaf in ast.walk(node.annotation)
                            if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str)
                            and leaf.value != "*"})
            return types if FULL else types[::10]
    raise AssertionError("the stripe package no longer lists enabled_events")


def test_every_stripe_event_type_is_accepted_with_its_id_and_type(app, live) -> None:
    """Events of every type Stripe lists, signed by the stripe library, over HTTP."""
    types = stripe_event_types()
    assert len(types) >= (250 if FULL else 25)
    secret = "whsec_corpus_stripe_secret"
    sender = make_sender(app, name="stripe-corpus", profile="stripe", secret=secret)
    refused: list[tuple[str, int]] = []
    with requests.Session() as session:
        for index, event_type in enumerate(types):
            body = json.dumps({"id": f"evt_corpus{index:04d}", "object": "event",
                               "api_version": "2025-01-27.acacia", "created": int(time.time()),
                               "type": event_type, "livemode": False, "pending_webhooks": 1,
                               "data": {"object": {"id": f"obj_{index}"}}}).encode()
            header = stripe.WebhookSignature.generate_signature_header(
                body.decode(), secret, timestamp=int(time.time()))
            answer = session.post(f"{live}/hooks/{sender.public_id}", data=body, timeout=60,
                                  headers={"Stripe-Signature": header,
                                           "Content-Type": "application/json"})
            if answer.status_code != 202:
                refused.append((event_type, answer.status_code))
    assert refused == []
    with app.extensions["ledger"].engine.connect() as conn:
        recorded = dict(conn.execute(select(receipts.c.event_id, receipts.c.event_type)).all())
    assert recorded == {f"evt_corpus{i:04d}": t for i, t in enumerate(types)}

