"""No secret, signature or body ever reaches a log: intake + rotate + revoke + drill.

Every log record is captured at DEBUG (and the stderr of real CLI processes), then
searched for every secret, every signature header value and every body used.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess

import pytest

import ledger.drill.sandbox
from ledger.access import audit
from ledger.access.credentials import revoke_credential, rotate_credential
from ledger.access.integrations import get_integration
from ledger.cli.drill_cmds import local_server
from ledger.drill.run import run_drill
from ledger.intake.signatures import get_profile
from ledger.worker.loop import run_worker
from tests.helpers import event_body, make_sender, signed_headers
from tests.servers import BIN

SIGNATURE_HEADERS = ("stripe-signature", "webhook-signature", "x-hub-signature-256")
ADMIN = audit.Actor(name="alice", role="security")


class Sensitive:
    """Everything that must never appear in a log."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def add_delivery(self, secret: str, body: bytes, headers: dict[str, str]) -> None:
        """Remember a secret, a body and the signature values computed with them."""
        self.values.update({secret, body.decode()})
        for name, value in headers.items():
            if name.lower() in SIGNATURE_HEADERS:
                self.values.add(value)
                # Each signature alone, without the scheme prefix or timestamp.
                for part in value.replace(" ", ",").split(","):
                    piece = part.split("=", 1)[-1]
                    if len(piece) >= 20:
                        self.values.add(piece)

    def found_in(self, text: str) -> list[str]:
        """Return the sensitive values present in `text` (shortened for the report)."""
        return [v[:12] + "…" for v in self.values if v and v in text]


@pytest.fixture
def sensitive(monkeypatch) -> Sensitive:  # type: ignore[no-untyped-def]
    """Record every secret, body and signature the drill signs with."""
    seen = Sensitive()
    original = ledger.drill.sandbox.sign

    def spy(secret, body, event_id, now):  # type: ignore[no-untyped-def]
        headers = original(secret, body, event_id, now)
        seen.add_delivery(secret, body, headers)
        return headers

    monkeypatch.setattr(ledger.drill.sandbox, "sign", spy)
    monkeypatch.setattr(ledger.drill.run, "sign", spy)
    return seen


def _post(client, sender, event_id: str, seen: Sensitive, *, secret=None, data=None):  # type: ignore[no-untyped-def]
    body = event_body(sender.profile, event_id, data=data or {"amount": 3, "card": "4242"})
    headers = signed_headers(sender, body, event_id, secret=secret)
    seen.add_delivery(secret or sender.secret, body, headers)
    return client.post(f"/hooks/{sender.public_id}", data=body, headers=headers)


def _intake_rotate_revoke(app, seen: Sensitive) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    client = app.test_client()
    senders = [make_sender(app, name=f"n-{p}", profile=p)
               for p in ("stripe", "github", "standard-webhooks")]
    for sender in senders:
        assert _post(client, sender, "evt_1", seen).status_code == 202
        assert _post(client, sender, "evt_1", seen).status_code == 202  # duplicate
        assert _post(client, sender, "evt_1", seen, data={"amount": 9}).status_code == 409
        wrong = get_profile(sender.profile).generate_secret()
        assert _post(client, sender, "evt_2", seen, secret=wrong).status_code == 401
        assert _post(client, sender, "evt_3", seen, data={"fail_times": 1},
                     ).status_code == 202
    run_worker(svc, burst=True)
    stripe = senders[0]
    with svc.engine.begin() as conn:
        rotation = rotate_credential(conn, svc.box, ADMIN,
                                     get_integration(conn, stripe.public_id), now=svc.clock.now())
        revoke_credential(conn, ADMIN, stripe.key_id, reason="drill", now=svc.clock.now())
    seen.values.add(rotation.secret)
    svc.view.invalidate()
    assert _post(client, stripe, "evt_4", seen).status_code == 401  # revoked key
    assert _post(client, stripe, "evt_5", seen, secret=rotation.secret).status_code == 202


def test_logs_of_intake_rotation_revocation_and_drill_hold_no_secret(test_env, caplog,
                                                                     sensitive):
    from app import create_app

    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="ledger")
    app = create_app({**test_env, "LEDGER_REVOCATION_BOUND_SECONDS": "2"})
    try:
        _intake_rotate_revoke(app, sensitive)
        with local_server(app) as url:
            report = run_drill(url, app.extensions["ledger"], actor=ADMIN)
        assert report.passed, report.to_json()
    finally:
        app.extensions["ledger"].close()
    text = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    assert len(caplog.records) > 20  # the run did log: deliveries, refusals, worker, drill
    assert "delivery.unauthenticated" in text and "delivery.accepted" in text
    assert len(sensitive.values) > 30
    assert sensitive.found_in(text) == []
    assert "whsec_" not in text


def _cli(env: dict[str, str], *args: str, stdin: str | None = None):  # type: ignore[no-untyped-def]
    return subprocess.run([str(BIN / "ledger"), *args], cwd="/", env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def sqlite_env(sqlite_template, tmp_path):  # type: ignore[no-untyped-def]
    """One database is enough for the CLI processes (they share every code path)."""
    from tests.conftest import TEST_MASTER_KEY

    path = tmp_path / "cli.sqlite3"
    shutil.copyfile(sqlite_template, path)
    return {"DATABASE_URL": f"sqlite:///{path}", "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "test"}


@pytest.mark.slow
def test_cli_commands_write_no_secret_to_stderr(sqlite_env):
    env = {**os.environ, **sqlite_env, "LEDGER_LOG_LEVEL": "DEBUG",
           "LEDGER_REVOCATION_BOUND_SECONDS": "2"}
    created = _cli(env, "integration", "create", "--account", "acme", "--name", "hooks",
                   "--profile", "standard-webhooks", "--json")
    out = json.loads(created.stdout)
    secrets = {out["credential"]["secret"]}
    rotated = _cli(env, "credential", "rotate", "--integration", out["integration"],
                   "--secret-stdin", "--json", stdin="whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQ=\n")
    secrets.add(json.loads(rotated.stdout)["secret"])
    runs = [created, rotated,
            _cli(env, "credential", "revoke", "--key-id", out["credential"]["key_id"],
                 "--reason", "leaked", "--json"),
            _cli(env, "credential", "list", "--integration", out["integration"], "--json"),
            _cli(env, "secrets", "rekey", "--json"),
            _cli(env, "audit", "verify", "--json"),
            _cli(env, "drill", "--json")]
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr[-500:] for r in runs]
    stderr = "\n".join(r.stderr for r in runs)
    assert [s for s in secrets if s in stderr] == []
    assert "whsec_" not in stderr
    assert "whsec_" not in runs[3].stdout  # list shows fingerprints only
