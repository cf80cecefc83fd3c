"""Connecting senders from the CLI (CONTRACT section 4): hmac options, whpk_ keys, type settings."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from nacl.signing import SigningKey
from sqlalchemy import select

from ledger.db.schema import receipts
from tests.helpers import ledger_counts
from tests.profile_keys import V1A, V1A_OTHER

CREATE = ["ledger", "integration", "create", "--account", "acme", "--json"]


def _create(runner: Any, *args: str, stdin: str | None = None) -> dict[str, Any]:
    result = runner.invoke(args=[*CREATE, *args], input=stdin)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _v1a_delivery(client: Any, public_id: str, seed_key: str, msg_id: str) -> Any:
    """POST a Standard Webhooks delivery signed only with v1a (ed25519)."""
    body = b'{"type": "demo.credit", "data": {"amount": 1}}'
    now = str(int(time.time()))
    seed = base64.b64decode(seed_key.removeprefix("whsk_"))
    signature = SigningKey(seed).sign(f"{msg_id}.{now}.".encode() + body).signature
    return client.post(f"/hooks/{public_id}", data=body, headers={
        "webhook-id": msg_id, "webhook-timestamp": now,
        "webhook-signature": "v1a," + base64.b64encode(signature).decode()})


def test_whpk_key_from_stdin_is_a_public_credential_that_verifies_v1a(app, runner, client):
    """A whpk_ key prints secret null, verifies v1a, rotates and revokes like a secret."""
    out = _create(runner, "--name", "resend", "--profile", "standard-webhooks",
                  "--secret-stdin", stdin=V1A.stored + "\n")
    assert out["credential"]["secret"] is None
    public_id = out["integration"]
    assert _v1a_delivery(client, public_id, V1A.signing, "msg_1").status_code == 202
    rotated = runner.invoke(args=["ledger", "credential", "rotate", "--integration", public_id,
                                  "--secret-stdin", "--overlap", "0", "--json"],
                            input=V1A_OTHER.stored + "\n")
    assert rotated.exit_code == 0, rotated.output
    assert json.loads(rotated.output)["secret"] is None
    app.extensions["ledger"].view.invalidate()  # the CLI ran beside this web process
    assert _v1a_delivery(client, public_id, V1A.signing, "msg_2").status_code == 401  # expired
    assert _v1a_delivery(client, public_id, V1A_OTHER.signing, "msg_3").status_code == 202
    new_key = json.loads(rotated.output)["key_id"]
    revoked = runner.invoke(args=["ledger", "credential", "revoke", "--key-id", new_key,
                                  "--reason", "drill", "--json"])
    assert revoked.exit_code == 0, revoked.output
    app.extensions["ledger"].view.invalidate()
    assert _v1a_delivery(client, public_id, V1A_OTHER.signing, "msg_4").status_code == 401
    assert ledger_counts(app)["receipts"] == 2


def test_hmac_profile_from_cli_flags(app, runner, client):
    """An unknown sender described by flags is connected and verified as described."""
    out = _create(runner, "--name", "acme-hooks", "--profile", "hmac",
                  "--signature-header", "X-Acme-Signature", "--signature-prefix", "sha256=",
                  "--signed-content", "{timestamp}.{body}", "--timestamp-header", "X-Acme-Time",
                  "--id-path", "event.id", "--type-path", "event.kind", "--secret-stdin",
                  stdin="acme-secret\n")
    assert out["profile"] == "hmac" and out["credential"]["secret"] == "acme-secret"
    body = b'{"event": {"id": "ev_1", "kind": "acme.created"}}'
    now = str(int(time.time()))
    digest = hmac.new(b"acme-secret", f"{now}.".encode() + body, hashlib.sha256).hexdigest()
    headers = {"X-Acme-Signature": "sha256=" + digest, "X-Acme-Time": now}
    response = client.post(f"/hooks/{out['integration']}", data=body, headers=headers)
    assert response.status_code == 202, response.get_json()
    with app.extensions["ledger"].engine.connect() as conn:
        row = conn.execute(select(receipts.c.event_id, receipts.c.event_type)).one()
    assert tuple(row) == ("ev_1", "acme.created")


def test_profile_settings_that_cannot_work_are_refused(app, runner):
    """Missing hmac options, a missing URL, a public-key sender without its key: exit 1."""
    cases = [
        (["--name", "a", "--profile", "hmac"], "signature-header"),
        (["--name", "b", "--profile", "hmac", "--signature-header", "X-S"], "id-header"),
        (["--name", "c", "--profile", "hmac", "--signature-header", "X-S", "--id-path", "id",
          "--signed-content", "{timestamp}{body}"], "timestamp"),
        (["--name", "d", "--profile", "twilio"], "--url"),
        (["--name", "e", "--profile", "stripe", "--url", "https://x.example/h"], "--url"),
        (["--name", "f", "--profile", "discord"], "public key"),
        (["--name", "g", "--profile", "sendgrid"], "public key"),
        (["--name", "h", "--profile", "stripe", "--event-type", "bad type"], "event-type"),
        (["--name", "i", "--profile", "stripe", "--type-path", "a..b"], "type-path"),
    ]
    for args, words in cases:
        result = runner.invoke(args=[*CREATE, *args])
        assert result.exit_code == 1, (args, result.output)
        assert words in result.output, (args, result.output)
    both = runner.invoke(args=[*CREATE, "--name", "j", "--profile", "stripe", "--type-path",
                               "a", "--event-type", "b"])
    assert both.exit_code == 2
    flags_elsewhere = runner.invoke(args=[*CREATE, "--name", "k", "--profile", "stripe",
                                          "--signature-header", "X-S"])
    assert flags_elsewhere.exit_code == 2


def test_url_signing_and_public_key_senders_connect_with_what_they_need(app, runner):
    """Twilio with --url, Discord with its public key on stdin: created; the key is no secret."""
    twilio = _create(runner, "--name", "sms", "--profile", "twilio", "--url",
                     "https://hooks.example.com/hooks/sms", "--secret-stdin",
                     stdin="auth-token\n")
    assert twilio["credential"]["secret"] == "auth-token"
    discord = _create(runner, "--name", "bot", "--profile", "discord", "--secret-stdin",
                      stdin="ab" * 32 + "\n")
    assert discord["credential"]["secret"] is None
    wrong = runner.invoke(args=[*CREATE, "--name", "bot2", "--profile", "discord",
                                "--secret-stdin"], input="not-a-key\n")
    assert wrong.exit_code == 1 and "ed25519" in wrong.output
