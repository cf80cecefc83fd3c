"""/api/v1 reads with operator API tokens, and the `ledger operator` commands that make them."""

from __future__ import annotations

import json

from sqlalchemy import select

from ledger.db.schema import api_tokens, audit_log, operators
from tests.dashboard_helpers import (
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    make_operator,
    make_token,
)
from tests.helpers import deliver, make_sender


def _bearer(token: str) -> dict[str, str]:
    """Return the Authorization header of a token."""
    return {"Authorization": f"Bearer {token}"}


def test_reads_answer_json_for_a_token(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    deliver(app.test_client(), sender, "evt_ok")
    add_receipt(app, sender.scope_id, "evt_f", state=2, error="KeyError: amount")
    add_conflict(app, sender.scope_id, "evt_ok")
    make_operator(app, "robot", "viewer")
    headers = _bearer(make_token(app, "robot"))
    client = app.test_client()

    def get(path: str):  # type: ignore[no-untyped-def]
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.get_data(as_text=True))
        assert response.mimetype == "application/json"
        return response.get_json()

    overview = get("/api/v1/overview")
    assert overview["headline"]["failures_24h"] == 1
    assert overview["scopes"][0]["scope"] == sender.scope
    receipts = get("/api/v1/receipts")
    assert {r["event_id"] for r in receipts["items"]} == {"evt_ok", "evt_f"}
    assert receipts["next_cursor"] is None
    failures = get("/api/v1/failures")
    assert failures["total"] == 1 and failures["items"][0]["last_error"] == "KeyError: amount"
    detail = get(f"/api/v1/receipts/{sender.public_id}/evt_f")
    assert detail["state"] == "failed" and "payload" not in detail  # viewer: no payload
    assert len(detail["body_sha256"]) == 64 and detail["attempt_rows"][0]["number"] == 1
    assert get("/api/v1/conflicts")["items"][0]["event_id"] == "evt_ok"
    assert get("/api/v1/integrations")["items"][0]["public_id"] == sender.public_id
    creds = get(f"/api/v1/integrations/{sender.public_id}/credentials")["credentials"]
    assert creds[0]["key_id"] == sender.key_id and sender.secret not in json.dumps(creds)
    assert get("/api/v1/audit?action=integration.create")["items"][0]["scope"] == sender.scope
    assert get("/api/v1/audit/verify")["ok"] is True
    assert set(get("/api/v1/stuck")) >= {"pending", "overdue_jobs", "findings"}
    assert client.get("/api/v1/receipts/in_0000000000000000000000/x",
                      headers=headers).status_code == 404


def test_oncall_token_sees_the_retained_payload(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2, payload='{"data": {"amount": 9}}')
    make_operator(app, "pager", "oncall")
    detail = app.test_client().get(f"/api/v1/receipts/{sender.public_id}/evt_f",
                                   headers=_bearer(make_token(app, "pager"))).get_json()
    assert detail["payload"] == {"data": {"amount": 9}}


def test_a_session_also_reads_the_api(app) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(app, "viewer", "vera")
    assert client.get("/api/v1/me").get_json() == {"username": "vera", "role": "viewer"}


def test_operator_cli_creates_an_account_and_a_token(app, runner) -> None:  # type: ignore[no-untyped-def]
    created = runner.invoke(args=["ledger", "operator", "create", "--username", "dana",
                                  "--role", "security", "--password-stdin"],
                            input="a long enough password\n")
    assert created.exit_code == 0, created.output
    token_run = runner.invoke(args=["ledger", "operator", "token", "--username", "dana",
                                    "--json"])
    assert token_run.exit_code == 0
    body = json.loads(token_run.output)
    assert set(body) == {"username", "token", "token_id", "scopes", "expires_at"}
    assert body["username"] == "dana" and body["scopes"] == ["read"]
    me = app.test_client().get("/api/v1/me", headers=_bearer(body["token"]))
    assert me.get_json() == {"username": "dana", "role": "security"}
    with app.extensions["ledger"].engine.connect() as conn:
        stored = conn.execute(select(operators.c.password_hash)).scalar_one()
        digest = conn.execute(select(api_tokens.c.token_sha256)).scalar_one()
        actions = conn.execute(select(audit_log.c.action, audit_log.c.actor)
                               .where(audit_log.c.target == "dana")).all()
    assert stored.startswith("$argon2") and "a long enough password" not in stored
    assert len(bytes(digest)) == 32 and body["token"].encode() not in bytes(digest)
    assert [a for a, _ in actions] == ["operator.create", "operator.token"]
    assert all(actor.startswith("cli:") for _, actor in actions)


def test_operator_cli_refuses_bad_input(runner) -> None:  # type: ignore[no-untyped-def]
    short = runner.invoke(args=["ledger", "operator", "create", "--username", "eve",
                                "--role", "viewer", "--password-stdin"], input="short\n")
    assert short.exit_code == 1 and "password must be" in short.output
    role = runner.invoke(args=["ledger", "operator", "create", "--username", "eve",
                               "--role", "god"])
    assert role.exit_code == 2
    missing = runner.invoke(args=["ledger", "operator", "token", "--username", "ghost",
                                  "--json"])
    assert missing.exit_code == 1


def test_openapi_describes_the_intake_and_every_api_read(app, client) -> None:  # type: ignore[no-untyped-def]
    document = client.get("/openapi.json").get_json()
    assert document["openapi"].startswith("3.")
    assert "/hooks/{integration}" in document["paths"]
    api_rules = {r.rule for r in app.url_map.iter_rules() if r.rule.startswith("/api/v1/")}
    described = {p.replace("{integration}", "<public_id>").replace("{event_id}",
                                                                    "<path:event_id>")
                 for p in document["paths"]}
    assert api_rules <= described


def test_filters_with_control_characters_are_refused_not_500(app) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "robot", "viewer")
    headers = _bearer(make_token(app, "robot"))
    client = app.test_client()
    for path in ("/api/v1/conflicts?scope=acme%00/x", "/api/v1/receipts?scope=a%00b/c",
                 "/api/v1/audit?actor=a%00b", "/api/v1/audit?scope=%01",
                 "/api/v1/receipts?prefix=evt%00"):
        response = client.get(path, headers=headers)
        assert response.status_code == 400, (path, response.get_data(as_text=True))
        assert response.get_json()["error"]
