"""Revocation propagation: instance heartbeats, the lag check, dead-key use."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import insert, select

from jobs.credential_jobs import check_revocation_propagation
from ledger import metrics
from ledger.access import audit
from ledger.access.credentials import revoke_credential, rotate_credential
from ledger.access.integrations import get_integration
from ledger.clock import FixedClock, unix
from ledger.db.schema import audit_log, findings, instances
from ledger.metrics.export import render_metrics
from tests.helpers import deliver, ledger_counts, make_sender

START = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
ADMIN = audit.Actor(name="alice", role="security")


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(START)


@pytest.fixture
def clocked_env(test_env):  # type: ignore[no-untyped-def]
    return {**test_env, "LEDGER_REVOCATION_BOUND_SECONDS": "10"}


def _instance(app, instance_id: str, *, heartbeat_at, refreshed_at) -> None:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(insert(instances).values(
            id=instance_id, kind="web", hostname="h", pid=1, started_at=START,
            heartbeat_at=heartbeat_at, credentials_refreshed_at=refreshed_at))


def _revoke(app, key_id: str) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        revoke_credential(conn, ADMIN, key_id, reason="leaked", now=svc.clock.now())


def _check(app, clock) -> int:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    return check_revocation_propagation(svc.engine, svc.settings, clock)


def test_stalled_instance_is_flagged_with_finding_audit_and_metric(clocked_app, clock):
    sender = make_sender(clocked_app)
    _revoke(clocked_app, sender.key_id)
    clock.advance(11)  # revocation + bound (10 s) has passed
    now = clock.now()
    _instance(clocked_app, "h:1:stalled", heartbeat_at=now, refreshed_at=START - timedelta(
        hours=1))
    _instance(clocked_app, "h:2:healthy", heartbeat_at=now, refreshed_at=now)
    _instance(clocked_app, "h:3:gone", heartbeat_at=now - timedelta(hours=1),
              refreshed_at=START - timedelta(hours=2))
    assert _check(clocked_app, clock) == 1
    with clocked_app.extensions["ledger"].engine.connect() as conn:
        found = conn.execute(select(findings)).all()
        rows = conn.execute(select(audit_log).where(
            audit_log.c.action == "instance.revocation_lag")).all()
    assert [(f.kind, f.subject, f.resolved_at) for f in found] == [
        ("revocation_lag", "h:1:stalled", None)]
    assert json.loads(found[0].detail)["revoked_at"] == START.isoformat()
    assert [(r.actor, r.target) for r in rows] == [("scheduler", "h:1:stalled")]
    svc = clocked_app.extensions["ledger"]
    exposition = render_metrics(svc.engine, clock, revocation_bound_seconds=10)[0].decode()
    ages = {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in exposition.splitlines()
            if line.startswith("ledger_credential_view_age_seconds{")}
    assert ages == {"h:1:stalled": pytest.approx(3600 + 11), "h:2:healthy": 0.0}


def test_lag_is_not_flagged_before_the_bound_and_resolves_when_caught_up(clocked_app, clock):
    sender = make_sender(clocked_app)
    _instance(clocked_app, "h:1:slow", heartbeat_at=START,
              refreshed_at=START - timedelta(seconds=1))
    _revoke(clocked_app, sender.key_id)
    clock.advance(9)
    _touch(clocked_app, "h:1:slow", heartbeat_at=clock.now())
    assert _check(clocked_app, clock) == 0  # still inside the bound: not yet a violation
    clock.advance(2)
    _touch(clocked_app, "h:1:slow", heartbeat_at=clock.now())
    assert _check(clocked_app, clock) == 1
    assert _check(clocked_app, clock) == 1  # still lagging: the finding is refreshed...
    with clocked_app.extensions["ledger"].engine.connect() as conn:
        opened = conn.execute(select(audit_log).where(
            audit_log.c.action == "instance.revocation_lag")).all()
    assert len(opened) == 1  # ...but audited once, when it opened
    _touch(clocked_app, "h:1:slow", heartbeat_at=clock.now(),
           credentials_refreshed_at=clock.now())
    assert _check(clocked_app, clock) == 0
    with clocked_app.extensions["ledger"].engine.connect() as conn:
        resolved = conn.execute(select(findings.c.resolved_at)).scalar_one()
    assert resolved == clock.now()


def _touch(app, instance_id: str, **values: object) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import update

    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(update(instances).where(instances.c.id == instance_id).values(**values))


def test_no_revocation_means_nothing_to_flag(clocked_app, clock):
    _instance(clocked_app, "h:1:old", heartbeat_at=START, refreshed_at=START - timedelta(
        days=1))
    assert _check(clocked_app, clock) == 0


def test_instances_silent_for_a_day_are_forgotten(clocked_app, clock):
    _instance(clocked_app, "h:1:crashed", heartbeat_at=START, refreshed_at=START)
    _instance(clocked_app, "h:2:alive", heartbeat_at=START, refreshed_at=START)
    clock.advance(86400 + 1)
    _touch(clocked_app, "h:2:alive", heartbeat_at=clock.now())
    _check(clocked_app, clock)
    with clocked_app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(instances.c.id)).scalars().all() == ["h:2:alive"]


def _wait_for_instance(app, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with app.extensions["ledger"].engine.connect() as conn:
            row = conn.execute(select(instances)).first()
        if row is not None:
            return row
        time.sleep(0.05)
    raise AssertionError("the web process never registered itself")


def test_serving_process_registers_and_beats_and_leaves_on_close(test_env, clock):
    from app import create_app

    app = create_app(test_env, clock=clock)
    svc = app.extensions["ledger"]
    try:
        with svc.engine.connect() as conn:
            assert conn.execute(select(instances)).all() == []  # not before serving
        assert app.test_client().get("/healthz").status_code == 200
        row = _wait_for_instance(app)
        assert (row.kind, row.pid) == ("web", os.getpid())
        assert row.id.split(":")[1] == str(os.getpid())
        assert row.heartbeat_at == START and row.credentials_refreshed_at == START
    finally:
        svc.close()
    with svc.engine.connect() as conn:
        assert conn.execute(select(instances)).all() == []
    svc.engine.dispose()


def test_a_failing_heartbeat_never_fails_a_delivery(clocked_app, clock, monkeypatch):
    import ledger.scheduling.instances

    def broken(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("database away")

    monkeypatch.setattr(ledger.scheduling.instances, "beat", broken)
    client = clocked_app.test_client()
    sender = make_sender(clocked_app)
    assert deliver(client, sender, "evt_1", timestamp=unix(clock.now())).status_code == 202
    clock.advance(60)  # the view is stale: this request refreshes it and wakes the heartbeat
    assert deliver(client, sender, "evt_2", timestamp=unix(clock.now())).status_code == 202


def _dead_key_count(state: str) -> float:
    return REGISTRY.get_sample_value("ledger_dead_key_use_total", {"state": state}) or 0.0


@pytest.mark.parametrize("how", ["revoked", "expired"])
def test_dead_key_use_is_logged_with_key_and_scope_and_counted(clocked_app, clock, caplog,
                                                               how):
    client = clocked_app.test_client()
    sender = make_sender(clocked_app)
    make_sender(clocked_app, name="other")
    svc = clocked_app.extensions["ledger"]
    if how == "revoked":
        _revoke(clocked_app, sender.key_id)
    else:
        with svc.engine.begin() as conn:
            rotate_credential(conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
                              now=clock.now(), overlap_seconds=5)
    clock.advance(60)
    before = _dead_key_count(how)
    caplog.set_level(logging.DEBUG)
    response = deliver(client, sender, "evt_1", timestamp=unix(clock.now()))
    assert response.status_code == 401
    assert response.get_json() == {"error": "unauthenticated"}
    assert _dead_key_count(how) == before + 1
    (line,) = [json.loads(r.getMessage()) for r in caplog.records
               if "delivery.unauthenticated" in r.getMessage()]
    assert (line["reason"], line["key_id"], line["scope"]) == (f"{how}_key", sender.key_id,
                                                                sender.scope)
    assert sender.secret not in caplog.text
    assert ledger_counts(clocked_app) == {"receipts": 0, "jobs": 0, "conflicts": 0}
    assert metrics.DEAD_KEY_USE is not None
