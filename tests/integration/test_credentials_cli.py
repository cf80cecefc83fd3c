"""`ledger credential rotate|revoke`, `ledger secrets rekey` per CONTRACT section 4."""

from __future__ import annotations

import getpass
import json
from datetime import datetime, timedelta

from cryptography.fernet import Fernet
from sqlalchemy import select

from ledger.access.secrets_box import SecretBox
from ledger.db.schema import audit_log, credentials
from tests.helpers import deliver, make_sender


def _json(result, code: int = 0) -> dict:  # type: ignore[no-untyped-def]
    assert result.exit_code == code, result.output
    return json.loads(result.output)


def _audit(app) -> list:  # type: ignore[no-untyped-def,type-arg]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(audit_log).order_by(audit_log.c.id)).all()


def test_rotate_prints_new_key_and_retiring_old_key(app, runner, client):
    sender = make_sender(app)
    before = len(_audit(app))
    out = _json(runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                    sender.public_id, "--overlap", "120", "--json"]))
    assert set(out) == {"key_id", "secret", "retiring"}
    assert out["key_id"].startswith("key_") and out["key_id"] != sender.key_id
    (retiring,) = out["retiring"]
    assert retiring["key_id"] == sender.key_id
    expires_at = datetime.fromisoformat(retiring["expires_at"])
    rows = _audit(app)[before:]
    assert [(r.action, r.actor) for r in rows] == [("credential.rotate",
                                                    f"cli:{getpass.getuser()}")]
    assert expires_at - rows[0].at == timedelta(seconds=120)
    # Both keys verify during the overlap, on the same scope.
    assert deliver(client, sender, "evt_old").status_code == 202
    app.extensions["ledger"].view.invalidate()
    assert deliver(client, sender, "evt_new", secret=out["secret"]).status_code == 202


def test_rotate_reads_the_secret_from_stdin_and_defaults_to_a_day(app, runner):
    sender = make_sender(app, profile="github", name="gh")
    out = _json(runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                    sender.public_id, "--secret-stdin", "--json"],
                              input="a-new-github-secret\n"))
    assert out["secret"] == "a-new-github-secret"
    (row,) = [r for r in _audit(app) if r.action == "credential.rotate"]
    expires_at = datetime.fromisoformat(out["retiring"][0]["expires_at"])
    assert expires_at - row.at == timedelta(days=1)


def test_rotate_usage_and_refusals_have_their_exit_codes(app, runner):
    sender = make_sender(app)
    bad_overlap = runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                      sender.public_id, "--overlap", "-5", "--json"])
    assert bad_overlap.exit_code == 2
    missing = runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                  "in_" + "0" * 22, "--json"])
    assert missing.exit_code == 1
    assert json.loads(missing.stdout)["error"] == "not_found"
    assert [r.action for r in _audit(app)] == ["integration.create", "credential.add"]


def test_revoke_prints_state_time_and_bound(app, runner):
    sender = make_sender(app)
    out = _json(runner.invoke(args=["ledger", "credential", "revoke", "--key-id",
                                    sender.key_id, "--reason", "leaked", "--json"]))
    assert out["key_id"] == sender.key_id and out["state"] == "revoked"
    assert out["propagation_bound_seconds"] == 30
    row = _audit(app)[-1]
    assert (row.action, row.reason, row.actor) == ("credential.revoke", "leaked",
                                                   f"cli:{getpass.getuser()}")
    assert datetime.fromisoformat(out["revoked_at"]) == row.at


def test_revoke_refusals_exit_1_and_missing_reason_exits_2(app, runner):
    sender = make_sender(app)
    args = ["ledger", "credential", "revoke", "--key-id", sender.key_id]
    assert runner.invoke(args=[*args, "--json"]).exit_code == 2  # --reason is required
    empty = runner.invoke(args=[*args, "--reason", " ", "--json"])
    assert empty.exit_code == 1 and "reason" in json.loads(empty.stdout)["detail"]
    _json(runner.invoke(args=[*args, "--reason", "leaked", "--json"]))
    again = runner.invoke(args=[*args, "--reason", "leaked", "--json"])
    assert again.exit_code == 1 and json.loads(again.stdout)["error"] == "refused"
    unknown = runner.invoke(args=["ledger", "credential", "revoke", "--key-id", "key_nope",
                                  "--reason", "x", "--json"])
    assert unknown.exit_code == 1 and json.loads(unknown.stdout)["error"] == "not_found"
    assert [r.action for r in _audit(app)].count("credential.revoke") == 1


def test_list_shows_lifecycle_without_secrets(app, runner):
    sender = make_sender(app)
    rotated = _json(runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                        sender.public_id, "--json"]))
    _json(runner.invoke(args=["ledger", "credential", "revoke", "--key-id", sender.key_id,
                              "--reason", "done", "--json"]))
    result = runner.invoke(args=["ledger", "credential", "list", "--integration",
                                 sender.public_id, "--json"])
    listing = _json(result)["credentials"]
    assert [(c["key_id"], c["state"]) for c in listing] == [
        (sender.key_id, "revoked"), (rotated["key_id"], "active")]
    assert sender.secret not in result.output and rotated["secret"] not in result.output


def test_secrets_rekey_reencrypts_under_newest_key_and_audits(app, runner, test_env):
    from app import create_app

    make_sender(app, name="one")
    make_sender(app, name="two")
    new_key = Fernet.generate_key().decode()
    rekeyed = create_app({**test_env,
                          "LEDGER_MASTER_KEY": f"{new_key},{test_env['LEDGER_MASTER_KEY']}"})
    try:
        cli = rekeyed.test_cli_runner()
        assert _json(cli.invoke(args=["ledger", "secrets", "rekey", "--json"])) == {
            "reencrypted": 2}
        assert _json(cli.invoke(args=["ledger", "secrets", "rekey", "--json"])) == {
            "reencrypted": 0}
    finally:
        rekeyed.extensions["ledger"].close()
    with app.extensions["ledger"].engine.connect() as conn:
        tokens = conn.execute(select(credentials.c.secret_enc)).scalars().all()
    assert all(SecretBox([new_key]).is_current(t) for t in tokens)
    rows = [r for r in _audit(app) if r.action == "secrets.rekey"]
    assert [json.loads(r.detail) for r in rows] == [{"reencrypted": 2}, {"reencrypted": 0}]
