"""Credential lifecycle pieces that need no database."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.fernet import Fernet

from jobs.credential_jobs import lagging
from ledger.access.credentials import Rotation
from ledger.access.secrets_box import MasterKeyError, SecretBox
from ledger.domain import CredentialState
from ledger.drill.run import DrillReport, DrillStep
from ledger.intake.credential_view import KeyMaterial, ttl_for_bound
from ledger.scheduling.instances import Instance, beat_interval, new_instance_id

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TICK = timedelta(microseconds=1)


@pytest.mark.parametrize(("state", "expires_at", "now", "live"), [
    (CredentialState.ACTIVE, None, AT, True),
    (CredentialState.RETIRING, AT, AT - TICK, True),
    (CredentialState.RETIRING, AT, AT, False),
    (CredentialState.RETIRING, AT, AT + timedelta(days=1), False),
    (CredentialState.REVOKED, None, AT, False),
    (CredentialState.EXPIRED, AT + timedelta(days=1), AT, False),
])
def test_a_key_verifies_only_while_live(state, expires_at, now, live):
    assert KeyMaterial("key_x", "s", state, expires_at).is_live(now) is live


def test_rotation_json_is_the_contract_shape():
    rotation = Rotation(key_id="key_new", secret="s3cret", retiring=[("key_old", AT)])
    assert rotation.to_json() == {"key_id": "key_new", "secret": "s3cret",
                                  "retiring": [{"key_id": "key_old",
                                                "expires_at": "2026-11-30T12:00:00+00:00"}]}


def test_drill_report_passes_only_when_every_step_passed():
    assert DrillReport().passed is False  # nothing ran: nothing proven
    ok = DrillStep(name="a", passed=True, detail="fine")
    bad = DrillStep(name="b", passed=False, detail="broken")
    assert DrillReport(steps=[ok]).to_json() == {
        "passed": True, "steps": [{"name": "a", "passed": True, "detail": "fine"}]}
    assert DrillReport(steps=[ok, bad]).passed is False


def test_heartbeat_beats_four_times_per_bound_and_view_lives_half_of_it():
    assert ttl_for_bound(30) == 15
    assert beat_interval(30) == 7.5
    assert beat_interval(0) == 0.25  # never a busy loop


def test_instance_id_names_host_and_pid_and_is_unique():
    first, second = new_instance_id(), new_instance_id()
    host, pid, _ = first.split(":")
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert first != second


def _instance(refreshed_at: datetime | None) -> Instance:
    return Instance(id="h:1:x", kind="web", hostname="h", pid=1, started_at=AT,
                    heartbeat_at=AT, credentials_refreshed_at=refreshed_at)


def test_an_instance_lags_when_its_view_predates_the_revocation():
    assert lagging(_instance(AT - TICK), AT) is True
    assert lagging(_instance(None), AT) is True
    assert lagging(_instance(AT), AT) is False


def test_master_key_rotation_keeps_old_tokens_readable_until_rekeyed():
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    token = SecretBox([old]).encrypt("whsec_abc")
    both = SecretBox([new, old])
    assert both.decrypt(token) == "whsec_abc"
    assert both.is_current(token) is False
    rotated = both.rotate(token)
    assert both.is_current(rotated) is True
    assert SecretBox([new]).decrypt(rotated) == "whsec_abc"
    with pytest.raises(MasterKeyError):
        SecretBox([new]).decrypt(token)
