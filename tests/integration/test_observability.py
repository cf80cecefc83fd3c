"""Request ids, structured log fields and the no-secrets rule on every log line (both databases)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from ledger.access import audit
from ledger.access.credentials import revoke_credential, rotate_credential
from ledger.access.integrations import get_integration
from ledger.clock import unix
from ledger.scheduling.runner import default_jobs, run_once
from ledger.worker.loop import process_one
from tests.helpers import event_body, make_sender, send, signed_headers

MARKER = "payload-marker-7f3a"  # a value only the bodies carry
DATA = {"amount": 3, "note": MARKER}


class _Lines(logging.Handler):
    """Collect every JSON log line written under the `ledger` logger."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.raw: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the rendered line."""
        self.raw.append(record.getMessage())

    def parsed(self) -> list[dict[str, Any]]:
        """Return the lines as JSON objects."""
        return [json.loads(line) for line in self.raw]

    def named(self, name: str) -> list[dict[str, Any]]:
        """Return the lines whose event is `name`."""
        return [line for line in self.parsed() if line.get("event") == name]


@pytest.fixture
def lines() -> Iterator[_Lines]:
    """Capture the ledger's log lines for one test."""
    handler = _Lines()
    logger = logging.getLogger("ledger")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)


@pytest.fixture
def clocked_env(test_env):
    """Jobs fail terminally on their first error."""
    return {**test_env, "LEDGER_MAX_ATTEMPTS": "1"}


def test_request_id_is_echoed_generated_and_logged(client, lines):
    """A sane caller id comes back and tags the log; a missing or unsafe one is replaced."""
    given = client.post("/hooks/in_0000000000000000000000", data=b"{}",
                        headers={"X-Request-Id": "trace-42.a"})
    assert given.status_code == 404
    assert given.headers["X-Request-Id"] == "trace-42.a"
    logged = [line for line in lines.named("http.request") if line["status"] == 404]
    assert logged and logged[-1]["request_id"] == "trace-42.a"
    assert logged[-1]["route"] == "/hooks/<public_id>"

    unsafe = client.get("/healthz", headers={"X-Request-Id": 'x" injected=1'})
    fresh_a = client.get("/healthz")
    fresh_b = client.get("/healthz")
    for response in (unsafe, fresh_a, fresh_b):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-Id"])
    assert fresh_a.headers["X-Request-Id"] != fresh_b.headers["X-Request-Id"]
    assert client.get("/healthz", headers={"X-Request-Id": "a" * 200}).headers[
        "X-Request-Id"] != "a" * 200


def test_web_worker_and_scheduler_lines_carry_their_fields(clocked_app, lines):
    """Intake, worker and scheduler lines name scope, event ref, type, attempt, age, outcome."""
    app = clocked_app
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    response = send(app, sender, "evt_fields_1", data=DATA)
    assert response.status_code == 202
    svc.clock.advance(7)
    assert process_one(svc, "w-fields")

    accepted = lines.named("delivery.accepted")[-1]
    assert accepted["request_id"] == response.headers["X-Request-Id"]
    for field in ("scope", "event_ref", "event_type", "outcome", "latency_ms", "http_status"):
        assert field in accepted, field
    assert accepted["scope"] == sender.scope and accepted["outcome"] == "accepted"

    done = [line for line in lines.named("job.transition") if line.get("to_state") == "complete"]
    assert len(done) == 1
    for field in ("scope", "event_ref", "event_type", "attempt", "event_age_seconds",
                  "from_state", "to_state", "outcome", "latency_ms"):
        assert field in done[0], field
    assert done[0]["event_ref"] == accepted["event_ref"]
    assert done[0]["event_age_seconds"] == pytest.approx(7, abs=0.01)
    # The request's context ended with the request: worker lines carry no request id.
    assert "request_id" not in done[0]

    rollups = next(j for j in default_jobs(svc.settings) if j.name == "rollups")
    run_once(svc.engine, svc.settings, svc.clock, rollups, instance="obs-test")
    ran = lines.named("scheduled job ran")[-1]
    assert ran["job"] == "rollups" and ran["outcome"] == "ok" and "latency_ms" in ran


def _secrets_flow(app) -> tuple[list[str], list[str]]:
    """Drive every logging path; return (strings that must never be logged, event ids)."""
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    forbidden = [sender.secret, MARKER]
    ids = ["evt_secret_ok", "evt_secret_fail"]
    body = event_body(sender.profile, ids[0], data={"amount": 2, "note": MARKER})
    headers = signed_headers(sender, body, ids[0], timestamp=unix(svc.clock.now()))
    forbidden.append(headers["Stripe-Signature"])
    client = app.test_client()
    assert client.post(f"/hooks/{sender.public_id}", data=body, headers=headers).status_code == 202
    assert send(app, sender, ids[0], data={"amount": 9, "note": MARKER}).status_code == 409
    assert send(app, sender, ids[1], "demo.fail", DATA).status_code == 202
    assert send(app, sender, "evt_bad_sig", data=DATA, secret="whsec_wrong").status_code == 401
    assert client.post(f"/hooks/{sender.public_id}", data=b'{"id": 1}',
                       headers=headers).status_code in (400, 401)
    actor = audit.Actor(name="test", role="admin")
    with svc.engine.begin() as conn:
        integration = get_integration(conn, sender.public_id)
        rotation = rotate_credential(conn, svc.box, actor, integration, now=svc.clock.now(),
                                     overlap_seconds=0)
        revoke_credential(conn, actor, rotation.key_id, reason="leak drill",
                          now=svc.clock.now())
    forbidden.append(rotation.secret)
    svc.view.invalidate()
    assert send(app, sender, "evt_revoked", data=DATA, secret=rotation.secret).status_code == 401
    while process_one(svc, "w-secrets"):
        pass
    svc.clock.advance(svc.settings.retention_seconds + 60)
    for job in default_jobs(svc.settings):
        run_once(svc.engine, svc.settings, svc.clock, job, instance="obs-secrets")
    return forbidden, [*ids, "evt_bad_sig", "evt_revoked"]


def test_no_log_line_carries_secrets_signatures_payloads_or_event_ids(clocked_app, lines):
    """Every line written along intake, worker, credentials, scheduler and purge is clean."""
    forbidden, event_ids = _secrets_flow(clocked_app)
    text = "\n".join(lines.raw)
    kinds = {line["event"] for line in lines.parsed()}
    # The flow really went through each path (a capture of nothing proves nothing).
    assert {"delivery.accepted", "delivery.conflict", "delivery.unauthenticated",
            "job.transition", "scheduled job ran"} <= kinds
    for value in forbidden:
        assert value not in text
    for event_id in event_ids:
        assert f'"{event_id}"' not in text and f" {event_id}" not in text
    master_key = clocked_app.extensions["ledger"].settings.master_key
    assert master_key and master_key not in text
