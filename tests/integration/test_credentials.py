"""Credential lifecycle on both databases: rotation boundary, revocation, expiry, rekey."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from jobs.credential_jobs import expire_credentials
from ledger.access import audit
from ledger.access.credentials import (
    list_credentials,
    rekey_secrets,
    revoke_credential,
    rotate_credential,
)
from ledger.access.integrations import get_integration
from ledger.access.secrets_box import SecretBox
from ledger.clock import FixedClock
from ledger.db.schema import audit_log, credentials
from ledger.domain import CredentialState
from ledger.errors import NotFound, Refused
from tests.helpers import ledger_counts, make_sender, send

START = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
ADMIN = audit.Actor(name="alice", role="security")


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(START)


def _rotate(app, sender, **kwargs):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        integration = get_integration(conn, sender.public_id)
        return rotate_credential(conn, svc.box, ADMIN, integration, now=svc.clock.now(),
                                 **kwargs)


def _states(app, sender) -> dict[str, tuple[str, datetime | None]]:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        creds = list_credentials(conn, get_integration(conn, sender.public_id))
    return {c.key_id: (c.state.value, c.expires_at) for c in creds}


def _audit_rows(app, action: str) -> list:  # type: ignore[type-arg]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(audit_log).where(audit_log.c.action == action)
                            .order_by(audit_log.c.id)).all()


def test_rotation_adds_replacement_on_same_scope_and_retires_old_key(clocked_app, clock):
    sender = make_sender(clocked_app)
    rotation = _rotate(clocked_app, sender, overlap_seconds=3600)
    assert rotation.retiring == [(sender.key_id, START + timedelta(seconds=3600))]
    assert _states(clocked_app, sender) == {
        sender.key_id: ("retiring", START + timedelta(seconds=3600)),
        rotation.key_id: ("active", None)}
    rows = _audit_rows(clocked_app, "credential.rotate")
    assert len(rows) == 1 and rows[0].target == rotation.key_id
    assert rows[0].scope == sender.scope and rows[0].actor == "alice"
    assert json.loads(rows[0].detail)["retiring"][0]["key_id"] == sender.key_id
    assert rotation.secret not in (rows[0].detail or "")


def test_old_key_verifies_until_the_instant_before_expiry_and_never_at_it(
        clocked_app, clock):
    sender = make_sender(clocked_app)
    rotation = _rotate(clocked_app, sender, overlap_seconds=600)
    expires_at = START + timedelta(seconds=600)
    clock.advance(600 - 1e-6)
    assert clock.now() == expires_at - timedelta(microseconds=1)
    assert send(clocked_app, sender, "evt_before").status_code == 202
    clock.advance(1e-6)
    assert clock.now() == expires_at
    assert send(clocked_app, sender, "evt_at").status_code == 401
    # The expiry job has not run: the row still says retiring, and still nothing verifies.
    assert _states(clocked_app, sender)[sender.key_id][0] == "retiring"
    clock.advance(3600)
    assert send(clocked_app, sender, "evt_later").status_code == 401
    assert send(clocked_app, sender, "evt_new", secret=rotation.secret).status_code == 202
    assert ledger_counts(clocked_app)["receipts"] == 2


def test_replay_under_replacement_key_finds_the_original_receipt(clocked_app, clock):
    sender = make_sender(clocked_app)
    assert send(clocked_app, sender, "evt_1").status_code == 202
    rotation = _rotate(clocked_app, sender, overlap_seconds=0)
    clocked_app.extensions["ledger"].view.invalidate()
    replay = send(clocked_app, sender, "evt_1", secret=rotation.secret)
    assert replay.status_code == 202
    assert replay.get_json() == {"status": "duplicate", "event_id": "evt_1",
                                 "state": "pending"}
    assert ledger_counts(clocked_app) == {"receipts": 1, "jobs": 1, "conflicts": 0}


def test_overlap_zero_stops_old_keys_now(clocked_app, clock):
    sender = make_sender(clocked_app)
    rotation = _rotate(clocked_app, sender, overlap_seconds=0)
    assert rotation.retiring == [(sender.key_id, START)]
    assert _states(clocked_app, sender)[sender.key_id] == ("expired", START)
    assert send(clocked_app, sender, "evt_1").status_code == 401


def test_rotating_again_never_extends_a_retiring_key(clocked_app, clock):
    sender = make_sender(clocked_app)
    first = _rotate(clocked_app, sender, overlap_seconds=600)
    clock.advance(60)
    second = _rotate(clocked_app, sender, overlap_seconds=86400)
    assert dict(second.retiring) == {sender.key_id: START + timedelta(seconds=600),
                                     first.key_id: clock.now() + timedelta(seconds=86400)}
    assert _states(clocked_app, sender)[second.key_id] == ("active", None)


@pytest.mark.parametrize("overlap", [-1, 30 * 86400 + 1])
def test_rotation_refuses_an_overlap_out_of_range(clocked_app, overlap):
    sender = make_sender(clocked_app)
    with pytest.raises(Refused):
        _rotate(clocked_app, sender, overlap_seconds=overlap)
    assert _audit_rows(clocked_app, "credential.rotate") == []
    assert _states(clocked_app, sender)[sender.key_id] == ("active", None)


def _revoke(app, key_id: str, reason: str = "leaked in a log"):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        return revoke_credential(conn, ADMIN, key_id, reason=reason, now=svc.clock.now())


def test_revocation_is_immediate_in_the_database_and_audited(clocked_app, clock):
    sender = make_sender(clocked_app)
    revoked = _revoke(clocked_app, sender.key_id)
    assert (revoked.state, revoked.revoked_at) == (CredentialState.REVOKED, START)
    with clocked_app.extensions["ledger"].engine.connect() as conn:
        reason = conn.execute(select(credentials.c.revoked_reason)).scalar_one()
    assert reason == "leaked in a log"
    (row,) = _audit_rows(clocked_app, "credential.revoke")
    assert (row.target, row.reason, row.scope) == (sender.key_id, "leaked in a log", sender.scope)


@pytest.mark.parametrize("reason", ["", "   "])
def test_revocation_needs_a_reason(clocked_app, reason):
    sender = make_sender(clocked_app)
    with pytest.raises(Refused, match="reason"):
        _revoke(clocked_app, sender.key_id, reason)
    assert _states(clocked_app, sender)[sender.key_id][0] == "active"
    assert _audit_rows(clocked_app, "credential.revoke") == []


def test_revoking_twice_or_an_unknown_key_is_refused(clocked_app):
    sender = make_sender(clocked_app)
    _revoke(clocked_app, sender.key_id)
    with pytest.raises(Refused, match="already revoked"):
        _revoke(clocked_app, sender.key_id)
    with pytest.raises(NotFound):
        _revoke(clocked_app, "key_" + "x" * 22)
    assert len(_audit_rows(clocked_app, "credential.revoke")) == 1


def test_revoked_key_is_refused_once_the_cached_view_expires(clocked_app, clock):
    sender = make_sender(clocked_app)
    assert send(clocked_app, sender, "evt_1").status_code == 202  # cached now
    _revoke(clocked_app, sender.key_id)
    ttl = clocked_app.extensions["ledger"].settings.revocation_bound_seconds / 2
    clock.advance(ttl)
    assert send(clocked_app, sender, "evt_2").status_code == 401
    assert send(clocked_app, sender, "evt_1").status_code == 401
    assert ledger_counts(clocked_app) == {"receipts": 1, "jobs": 1, "conflicts": 0}


def test_expiry_job_marks_due_retiring_keys_expired_as_scheduler(clocked_app, clock):
    sender = make_sender(clocked_app)
    _rotate(clocked_app, sender, overlap_seconds=600)
    engine = clocked_app.extensions["ledger"].engine
    clock.advance(599)
    assert expire_credentials(engine, clock) == 0
    clock.advance(1)
    assert expire_credentials(engine, clock) == 1
    assert _states(clocked_app, sender)[sender.key_id][0] == "expired"
    (row,) = _audit_rows(clocked_app, "credential.expire")
    assert (row.actor, row.target) == ("scheduler", sender.key_id)
    assert expire_credentials(engine, clock) == 0


def test_rekey_moves_secrets_to_the_new_master_key_and_old_key_can_go(
        clocked_app, clock, test_env):
    from app import create_app

    svc = clocked_app.extensions["ledger"]
    senders = [make_sender(clocked_app, name=f"s{i}") for i in range(3)]
    old_key = svc.settings.master_key
    new_key = Fernet.generate_key().decode()
    with svc.engine.begin() as conn:
        assert rekey_secrets(conn, SecretBox([new_key, old_key])) == 3
        assert rekey_secrets(conn, SecretBox([new_key, old_key])) == 0
        stored = list(conn.execute(select(credentials.c.secret_enc)
                                   .order_by(credentials.c.id)).scalars())
    assert [SecretBox([new_key]).decrypt(t) for t in stored] == [s.secret for s in senders]
    # A process restarted with only the new key (the old one removed) still verifies.
    restarted = create_app({**test_env, "LEDGER_MASTER_KEY": new_key}, clock=clock)
    try:
        for index, sender in enumerate(senders):
            assert send(restarted, sender, f"evt_{index}").status_code == 202
    finally:
        restarted.extensions["ledger"].close()
