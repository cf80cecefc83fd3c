"""The `ledger` CLI per CONTRACT section 4, on both databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from ledger.db.schema import audit_log, credentials
from tests.helpers import deliver, make_sender

LEDGER = str(Path(sys.executable).parent / "ledger")


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_integration_create_prints_the_contract_shape_and_audits(app, runner):
    out = _json(runner.invoke(args=["ledger", "integration", "create", "--account", "acme",
                                    "--name", "stripe-prod", "--profile", "stripe", "--json"]))
    assert set(out) == {"integration", "scope", "profile", "credential"}
    assert out["integration"].startswith("in_") and len(out["integration"]) == 25
    assert (out["scope"], out["profile"]) == ("acme/stripe-prod", "stripe")
    assert out["credential"]["key_id"].startswith("key_")
    assert out["credential"]["secret"].startswith("whsec_")
    with app.extensions["ledger"].engine.connect() as conn:
        stored = conn.execute(select(credentials.c.secret_enc)).scalar_one()
        actions = conn.execute(select(audit_log.c.action, audit_log.c.actor)).all()
    assert out["credential"]["secret"] not in stored  # encrypted at rest
    assert [a for a, _ in actions] == ["integration.create", "credential.add"]
    assert all(actor.startswith("cli:") for _, actor in actions)


def test_secret_from_stdin_is_used_and_verifies_deliveries(app, runner, client):
    secret = "It's a Secret to Everybody"
    out = _json(runner.invoke(args=["ledger", "integration", "create", "--account", "acme",
                                    "--name", "gh", "--profile", "github", "--secret-stdin",
                                    "--json"], input=secret + "\n"))
    assert out["credential"]["secret"] == secret
    from tests.helpers import Sender

    sender = Sender(out["integration"], "github", secret, out["scope"], 0, "")
    assert deliver(client, sender, "d-1", "push").status_code == 202


def test_refusals_exit_1_and_usage_errors_exit_2(app, runner):
    args = ["ledger", "integration", "create", "--account", "acme", "--name", "x",
            "--profile", "stripe", "--json"]
    assert runner.invoke(args=args).exit_code == 0
    again = runner.invoke(args=args)
    assert again.exit_code == 1
    assert "already exists" in again.output
    bad_slug = runner.invoke(args=["ledger", "integration", "create", "--account", "Bad Slug",
                                   "--name", "x", "--profile", "stripe"])
    assert bad_slug.exit_code == 1
    assert runner.invoke(args=["ledger", "integration", "create", "--account", "a",
                               "--name", "x", "--profile", "smtp"]).exit_code == 2
    assert runner.invoke(args=["ledger", "credential", "list"]).exit_code == 2
    bad_secret = runner.invoke(args=["ledger", "integration", "create", "--account", "acme",
                                     "--name", "std", "--profile", "standard-webhooks",
                                     "--secret-stdin"], input="not-a-whsec\n")
    assert bad_secret.exit_code == 1


def test_credential_add_and_list_never_show_secrets_again(app, runner):
    sender = make_sender(app)
    added = _json(runner.invoke(args=["ledger", "credential", "add", "--integration",
                                      sender.public_id, "--json"]))
    assert set(added) == {"key_id", "secret"}
    listed = _json(runner.invoke(args=["ledger", "credential", "list", "--integration",
                                       sender.public_id, "--json"]))
    rows = listed["credentials"]
    assert [r["key_id"] for r in rows] == [sender.key_id, added["key_id"]]
    assert set(rows[0]) == {"key_id", "state", "created_at", "expires_at", "revoked_at",
                            "fingerprint"}
    assert all(r["state"] == "active" for r in rows)
    text = json.dumps(listed)
    assert sender.secret not in text and added["secret"] not in text
    missing = runner.invoke(args=["ledger", "credential", "list", "--integration",
                                  "in_AAAAAAAAAAAAAAAAAAAAAA", "--json"])
    assert missing.exit_code == 1


def test_receipt_show_prints_the_contract_shape(app, runner, client):
    sender = make_sender(app)
    deliver(client, sender, "evt_1")
    out = _json(runner.invoke(args=["ledger", "receipt", "show", "--scope", sender.scope,
                                    "--event-id", "evt_1", "--json"]))
    assert set(out) == {"scope", "event_id", "event_type", "state", "attempts", "accepted_at",
                        "completed_at", "result_ref", "body_sha256", "last_error"}
    assert (out["scope"], out["event_id"], out["state"]) == (sender.scope, "evt_1", "pending")
    assert len(out["body_sha256"]) == 64
    unknown = runner.invoke(args=["ledger", "receipt", "show", "--scope", sender.scope,
                                  "--event-id", "evt_nope", "--json"])
    assert unknown.exit_code == 1


def test_a_receipt_lookup_starts_without_the_migration_tool_or_the_requeue_path(test_env,
                                                                                 runner):
    """`ledger receipt show` is what an on-call engineer types first: it loads what it reads."""
    assert runner.invoke(args=["ledger", "db", "upgrade"]).exit_code == 0
    script = ("import sys\n"
              "from ledger.cli import main\n"
              "try:\n"
              "    main(['receipt', 'show', '--scope', 'acme/shop', '--event-id', 'evt_x',"
              " '--json'])\n"
              "except SystemExit as done:\n"
              "    print('EXIT', done.code)\n"
              "print('LOADED', sorted(m for m in ('alembic', 'ledger.worker.requeue')"
              " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **test_env},
                          capture_output=True, text=True, timeout=60, check=False)
    assert "EXIT 1" in done.stdout, done.stdout + done.stderr  # no such scope: not found
    assert "LOADED []" in done.stdout, done.stdout


def test_console_script_works_from_any_directory_with_json_only_on_stdout(test_env, tmp_path):
    env = {**os.environ, **test_env}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([LEDGER, "db", "upgrade"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    created = subprocess.run(
        [LEDGER, "integration", "create", "--account", "acme", "--name", "cwd",
         "--profile", "standard-webhooks", "--json"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["scope"] == "acme/cwd"
    flask_group = subprocess.run(
        [str(Path(sys.executable).parent / "flask"), "--app", "app", "ledger", "receipt",
         "show", "--scope", "acme/cwd", "--event-id", "x", "--json"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        timeout=60)
    assert flask_group.returncode == 1
    assert json.loads(flask_group.stdout)["error"] == "not_found"
