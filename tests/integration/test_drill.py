"""The leaked-key drill as a test (both databases) and as a command (real HTTP)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from sqlalchemy import func, insert, select

from jobs.rollup_series import retotal
from ledger.access import audit
from ledger.cli.drill_cmds import local_server
from ledger.db.schema import (
    audit_log,
    credentials,
    hourly_series,
    hourly_totals,
    integrations,
    jobs,
    receipts,
)
from ledger.drill.run import delete_sandbox_integrations, run_drill
from ledger.intake.signatures import PROFILES
from tests.helpers import deliver, make_sender
from tests.servers import BIN

STEPS = ["sandbox_accounts", "distinct_events_and_duplicates",
         "revoked_key_refused_within_bound", "revoked_key_changes_nothing",
         "other_account_keeps_accepting", "rotated_key_gets_original_outcome",
         "replay_after_retention_runs_again", "every_profile_revoked_within_bound", "cleanup"]
ACTOR = audit.Actor(name="drill-test", role="security")


@pytest.fixture
def drill_env(test_env):  # type: ignore[no-untyped-def]
    return {**test_env, "LEDGER_REVOCATION_BOUND_SECONDS": "2"}


@pytest.fixture
def drill_app(drill_env):  # type: ignore[no-untyped-def]
    from app import create_app

    application = create_app(drill_env)
    yield application
    application.extensions["ledger"].close()


def _rows(app, table, **where) -> list:  # type: ignore[no-untyped-def,type-arg]
    with app.extensions["ledger"].engine.connect() as conn:
        query = select(table)
        for column, value in where.items():
            query = query.where(table.c[column] == value)
        return [tuple(r) for r in conn.execute(query).all()]


def test_drill_passes_and_leaves_real_accounts_and_the_audit_trail(drill_app):
    real = make_sender(drill_app, account="acme", name="stripe-prod")
    client = drill_app.test_client()
    assert deliver(client, real, "evt_real").status_code == 202
    before = {t.name: _rows(drill_app, t) for t in (receipts, jobs, credentials, integrations)}
    with local_server(drill_app) as url:
        report = run_drill(url, drill_app.extensions["ledger"], actor=ACTOR)
    assert report.to_json()["passed"] is True, report.to_json()
    assert [s.name for s in report.steps] == STEPS
    after = {t.name: _rows(drill_app, t) for t in (receipts, jobs, credentials, integrations)}
    assert after == before  # the sandbox is gone and the real account is untouched
    actions = [row[4] for row in _rows(drill_app, audit_log, actor="drill-test")]
    # Two leaked-key accounts, and one integration per profile (every preset, v1a, hmac,
    # token).
    assert actions.count("integration.create") == 2 + len(PROFILES) + 3
    assert {"credential.revoke", "credential.rotate", "drill.cleanup"} <= set(actions)
    with drill_app.extensions["ledger"].engine.connect() as conn:
        assert audit.verify_chain(conn)["ok"] is True


def test_drill_fails_when_a_server_keeps_revoked_keys_longer_than_declared(
        drill_app, drill_env):
    from app import create_app

    # The server caches for 30 s / 2, but the drill holds it to the declared 2 s.
    lax = create_app({**drill_env, "LEDGER_REVOCATION_BOUND_SECONDS": "30"})
    try:
        with local_server(lax) as url:
            report = run_drill(url, drill_app.extensions["ledger"], actor=ACTOR)
    finally:
        lax.extensions["ledger"].close()
    outcome = {s.name: s.passed for s in report.steps}
    assert report.passed is False
    assert outcome["revoked_key_refused_within_bound"] is False
    assert "still accepted" in report.steps[2].detail
    assert outcome["cleanup"] is True
    assert _rows(drill_app, integrations) == []


def test_cleanup_never_deletes_a_real_integration(drill_app):
    real = make_sender(drill_app)
    with drill_app.extensions["ledger"].engine.begin() as conn:
        assert delete_sandbox_integrations(conn, [real.scope_id]) == {}
        remaining = conn.execute(select(func.count()).select_from(integrations)).scalar_one()
    assert remaining == 1


def test_cleanup_takes_the_sandbox_out_of_the_ledgers_hourly_totals(drill_app):
    """Capacity reads the ledger's last 24 hours from hourly_totals: once the sandbox's
    rows are gone, the totals count the real accounts' receipts only."""
    from ledger.access.integrations import create_integration

    svc = drill_app.extensions["ledger"]
    real = make_sender(drill_app)
    now = svc.clock.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    with svc.engine.begin() as conn:
        sandbox, _ = create_integration(conn, svc.box, ACTOR, account="sandbox", name="s1",
                                        profile="stripe", now=now, sandbox=True)
        for scope, accepted in ((real.scope_id, 5), (sandbox.id, 40)):
            conn.execute(insert(hourly_series).values(
                scope_id=scope, hour=hour, accepted=accepted, failed=1, settled=0,
                refreshed_at=now))
        retotal(conn, [hour])
        assert _totals(conn) == {hour: (45, 2)}
        delete_sandbox_integrations(conn, [sandbox.id])
        assert _totals(conn) == {hour: (5, 1)}


def _totals(conn):  # type: ignore[no-untyped-def]
    """Return hourly_totals as {hour: (accepted, failed)}."""
    return {r.hour: (r.accepted, r.failed) for r in conn.execute(select(hourly_totals))}


@pytest.fixture
def sqlite_env(sqlite_template, tmp_path):  # type: ignore[no-untyped-def]
    """The command on SQLite here; on PostgreSQL it runs in test_credentials_multiprocess."""
    from tests.conftest import TEST_MASTER_KEY

    path = tmp_path / "cli.sqlite3"
    shutil.copyfile(sqlite_template, path)
    return {"DATABASE_URL": f"sqlite:///{path}", "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "test",
            "LEDGER_REVOCATION_BOUND_SECONDS": "2"}


@pytest.mark.slow
def test_drill_command_starts_its_own_server_and_exits_0(sqlite_env):
    from app import create_app

    result = subprocess.run([str(BIN / "ledger"), "drill", "--json"], cwd="/",
                            env={**os.environ, **sqlite_env}, capture_output=True, text=True,
                            timeout=120)
    report = json.loads(result.stdout)  # one JSON object and nothing else on stdout
    assert result.returncode == 0, (report, result.stderr[-2000:])
    assert report["passed"] is True
    assert [s["name"] for s in report["steps"]] == STEPS
    assert all(set(s) == {"name", "passed", "detail"} for s in report["steps"])
    app = create_app(sqlite_env)
    try:
        assert _rows(app, integrations) == []
        assert {r[4] for r in _rows(app, audit_log)} >= {"credential.revoke", "drill.cleanup"}
    finally:
        app.extensions["ledger"].close()
