"""The audit chain is keyed (LEDGER_AUDIT_KEY): rewriting it takes the key, not only the
database; its head can be anchored elsewhere; a log from before the key is sealed."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from datetime import UTC, datetime

import pytest
import requests
from cryptography.fernet import Fernet
from sqlalchemy import insert, select, text

from app import create_app
from ledger.access import audit
from ledger.config import SettingsError
from ledger.db.schema import audit_log, credentials
from tests.dashboard_helpers import fast_hashes, make_operator, make_token  # noqa: F401
from tests.helpers import make_sender
from tests.servers import BIN, ROOT, gunicorn_server

ACTOR = audit.Actor(name="alice", role="security", request_id="req-1")
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _append(app, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.begin() as conn:
        return [audit.record(conn, ACTOR, "test.action", f"target-{i}", at=AT,
                             reason="because", detail={"n": i}) for i in range(count)]


def _cli(runner, *args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(args=["ledger", "audit", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def _without_triggers(conn) -> None:  # type: ignore[no-untyped-def]
    """Do what a database superuser can: switch the append-only triggers off."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER ALL"))
    else:
        conn.execute(text("DROP TRIGGER IF EXISTS audit_log_no_update"))
        conn.execute(text("DROP TRIGGER IF EXISTS audit_log_no_delete"))


def _plain_hash(prev_hash: str, row: dict) -> str:  # type: ignore[type-arg]
    """The chain as anyone can compute it without the key: plain SHA-256."""
    canonical = json.dumps(audit._fields(row), sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(f"{prev_hash}\n{canonical}".encode()).hexdigest()


def _rewrite_from(conn, first_id: int, **changes: object) -> None:  # type: ignore[no-untyped-def]
    """Edit one row and recompute every hash from it to the end, without the key."""
    rows = [dict(r._mapping) for r in conn.execute(
        select(audit_log).where(audit_log.c.id >= first_id).order_by(audit_log.c.id))]
    prev = rows[0]["prev_hash"]
    rows[0].update(changes)
    for row in rows:
        row["at"] = row["at"].astimezone(UTC)
        row["prev_hash"], row["row_hash"] = prev, _plain_hash(prev, row)
        conn.execute(audit_log.update().where(audit_log.c.id == row["id"]).values(
            **{k: v for k, v in row.items() if k != "id"}))
        prev = row["row_hash"]


def test_rewriting_a_row_and_every_hash_after_it_is_detected(app, runner):
    ids = _append(app, 4)
    with app.extensions["ledger"].engine.begin() as conn:
        _without_triggers(conn)
        _rewrite_from(conn, ids[1], reason="routine")
    code, result = _cli(runner, "verify")
    assert (code, result) == (1, {"ok": False, "rows": 4, "first_bad": ids[1]})


def test_verifying_with_another_key_fails(app, test_env):
    _append(app, 3)
    other = create_app({**test_env, "LEDGER_AUDIT_KEY": "a-different-key"})
    try:
        code, result = _cli(other.test_cli_runner(), "verify")
    finally:
        other.extensions["ledger"].close()
    assert code == 1 and result["ok"] is False and result["first_bad"] is not None
    same = create_app(test_env)
    try:
        assert _cli(same.test_cli_runner(), "verify")[0] == 0
    finally:
        same.extensions["ledger"].close()


def test_head_prints_the_newest_row_for_anchoring(app, runner):
    assert _cli(runner, "head") == (0, {"id": None, "hash": None, "at": None})
    ids = _append(app, 3)
    code, result = _cli(runner, "head")
    with app.extensions["ledger"].engine.connect() as conn:
        newest = conn.execute(select(audit_log).where(audit_log.c.id == ids[-1])).one()
    assert code == 0
    assert result == {"id": ids[-1], "hash": newest.row_hash, "at": AT.isoformat()}
    assert result["hash"].startswith("hmac-sha256:")


def _legacy_log(app, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Write rows the way the release before the keyed chain did (plain SHA-256)."""
    ids, prev = [], audit.GENESIS
    with app.extensions["ledger"].engine.begin() as conn:
        for i in range(count):
            row = {"at": AT, "actor": "cli:old", "role": "cli", "action": "old.action",
                   "target": f"t{i}", "scope": None, "reason": None, "request_id": None,
                   "detail": None}
            digest = _plain_hash(prev, row)
            ids.append(conn.execute(insert(audit_log).values(**row, prev_hash=prev,
                                                             row_hash=digest)
                                    .returning(audit_log.c.id)).scalar_one())
            prev = digest
    return ids


def test_rechain_seals_a_log_written_before_the_key_with_a_recorded_row(app, runner):
    sender = make_sender(app)  # its credential.add row seals nothing yet: see below
    with app.extensions["ledger"].engine.begin() as conn:
        _without_triggers(conn)
        conn.execute(text("DELETE FROM audit_log"))
        # The fingerprint the previous release stored: a plain truncated SHA-256.
        old = "sha256:" + hashlib.sha256(sender.secret.encode()).hexdigest()[:16]
        conn.execute(credentials.update().values(fingerprint=old))
    ids = _legacy_log(app, 3)
    code, result = _cli(runner, "verify")
    assert (code, result) == (1, {"ok": False, "rows": 3, "first_bad": ids[0]})

    code, result = _cli(runner, "rechain")  # unkeyed rows are sealed on the operator's word
    assert code == 1 and "never keyed" in result["detail"]
    code, result = _cli(runner, "rechain", "--never-keyed")
    assert code == 0 and result["rechained"] == 3 and result["fingerprints"] == 1
    with app.extensions["ledger"].engine.connect() as conn:
        seal = conn.execute(select(audit_log).where(audit_log.c.id == result["audit_id"])).one()
        shown = conn.execute(select(credentials.c.fingerprint)).scalar_one()
        legacy_head = conn.execute(select(audit_log.c.row_hash)
                                   .where(audit_log.c.id == ids[-1])).scalar_one()
    assert seal.action == "audit.rechain" and seal.actor.startswith("cli:")
    assert seal.prev_hash == legacy_head and seal.row_hash.startswith("hmac-sha256:")
    assert json.loads(seal.detail)["legacy_head"] == {"id": ids[-1], "hash": legacy_head}
    assert shown.startswith("hmac:") and shown != old
    assert _cli(runner, "verify") == (0, {"ok": True, "rows": 4, "first_bad": None})
    assert _cli(runner, "rechain")[1] == {"rechained": 0, "fingerprints": 0, "audit_id": None}

    # Sealed: rewriting the old rows, hashes and all, now breaks the seal's link.
    with app.extensions["ledger"].engine.begin() as conn:
        _without_triggers(conn)
        conn.execute(audit_log.update().where(audit_log.c.id >= ids[0])
                     .where(audit_log.c.id <= ids[-1]).values(target="x"))
        prev = audit.GENESIS
        for row_id in ids:
            row = dict(conn.execute(select(audit_log).where(audit_log.c.id == row_id))
                       .one()._mapping)
            digest = _plain_hash(prev, {**row, "at": row["at"].astimezone(UTC)})
            conn.execute(audit_log.update().where(audit_log.c.id == row_id)
                         .values(prev_hash=prev, row_hash=digest))
            prev = digest
    code, result = _cli(runner, "verify")
    assert (code, result) == (1, {"ok": False, "rows": 4, "first_bad": seal.id})


def test_an_ordinary_action_after_the_upgrade_commits_to_the_old_rows_but_does_not_seal(
        app, runner):
    """Only `rechain` vouches for unkeyed rows: a dashboard action chaining onto them does not."""
    ids = _legacy_log(app, 2)
    assert _cli(runner, "verify")[0] == 1
    new = _append(app, 1)[0]
    assert _cli(runner, "verify") == (1, {"ok": False, "rows": 3, "first_bad": ids[0]})
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(audit_log.c.prev_hash).where(audit_log.c.id == new)
                            ).scalar_one() == conn.execute(
            select(audit_log.c.row_hash).where(audit_log.c.id == ids[-1])).scalar_one()
    assert _cli(runner, "rechain", "--never-keyed")[1]["rechained"] == 2
    assert _cli(runner, "verify") == (0, {"ok": True, "rows": 4, "first_bad": None})


def test_an_unkeyed_row_after_a_keyed_one_fails(app, runner):
    ids = _append(app, 2)
    with app.extensions["ledger"].engine.begin() as conn:
        head = conn.execute(select(audit_log.c.row_hash).where(audit_log.c.id == ids[-1])
                            ).scalar_one()
        row = {"at": AT, "actor": "mallory", "role": "cli", "action": "forged", "target": "t",
               "scope": None, "reason": None, "request_id": None, "detail": None}
        forged = conn.execute(insert(audit_log).values(
            **row, prev_hash=head, row_hash=_plain_hash(head, row))
            .returning(audit_log.c.id)).scalar_one()
    assert _cli(runner, "verify") == (1, {"ok": False, "rows": 3, "first_bad": forged})


def test_rechain_refuses_to_bless_a_broken_chain(app, runner):
    ids = _append(app, 2)
    with app.extensions["ledger"].engine.begin() as conn:
        _without_triggers(conn)
        conn.execute(audit_log.update().where(audit_log.c.id == ids[0]).values(reason="x"))
    result = runner.invoke(args=["ledger", "audit", "rechain", "--json"])
    assert result.exit_code == 1 and "broken at row" in json.loads(result.stdout)["detail"]
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(audit_log.c.action)
                            .where(audit_log.c.action == "audit.rechain")).first() is None


def test_fingerprints_are_keyed(app, test_env):
    sender = make_sender(app)
    with app.extensions["ledger"].engine.connect() as conn:
        shown = conn.execute(select(credentials.c.fingerprint)).scalar_one()
        added = json.loads(conn.execute(select(audit_log.c.detail).where(
            audit_log.c.action == "credential.add")).scalar_one())
    plain = hashlib.sha256(sender.secret.encode()).hexdigest()[:16]
    assert shown.startswith("hmac:") and plain not in shown
    assert added["fingerprint"] == shown
    other = create_app({**test_env, "LEDGER_AUDIT_KEY": "a-different-key"})
    try:
        from ledger.access.secrets_box import fingerprint

        with other.extensions["ledger"].engine.connect() as conn:
            assert fingerprint(sender.secret, audit.key_of(conn)) != shown
    finally:
        other.extensions["ledger"].close()


def test_production_refuses_to_start_without_an_audit_key(test_env, monkeypatch):
    monkeypatch.setenv("LEDGER_ENV", "production")
    env = {k: v for k, v in test_env.items() if k != "LEDGER_AUDIT_KEY"}
    env.update(LEDGER_SECRET_KEY="s", LEDGER_MASTER_KEY=Fernet.generate_key().decode(),
               LEDGER_LOG_HASH_KEY="h")
    with pytest.raises(SettingsError, match="requires LEDGER_AUDIT_KEY to be set") as caught:
        create_app(env)
    assert caught.value.name == "LEDGER_AUDIT_KEY"


def test_every_process_chains_with_the_development_key_from_var(test_env, tmp_path):
    """No key configured: the web processes and the CLI share the one generated into var/."""
    env = {k: v for k, v in test_env.items() if k != "LEDGER_AUDIT_KEY"}
    env["LEDGER_WEB_PRELOAD"] = "0"  # every worker process loads the key itself
    os.environ.pop("LEDGER_AUDIT_KEY", None)
    cli_env = {**os.environ, **env}
    subprocess.run([str(BIN / "ledger"), "operator", "create", "--username", "robot",
                    "--role", "viewer"], env=cli_env, cwd=str(ROOT), check=True,
                   capture_output=True)
    token = json.loads(subprocess.run(
        [str(BIN / "ledger"), "operator", "token", "--username", "robot", "--json"],
        env=cli_env, cwd=str(ROOT), check=True, capture_output=True, text=True).stdout)["token"]
    key_file = tmp_path / "audit.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    with gunicorn_server(env, workers=2) as (base_url, _process):
        answers = [requests.get(f"{base_url}/api/v1/audit/verify", timeout=10,
                                headers={"Authorization": f"Bearer {token}"}).json()
                   for _ in range(6)]
    assert answers == [{"ok": True, "rows": 2, "first_bad": None, "next": None}] * 6
