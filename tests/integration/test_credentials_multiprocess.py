"""A revoked key is refused within the bound by every process of a gunicorn server (PG)."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime

import pytest
import requests
from sqlalchemy import func, select

from ledger.access import audit
from ledger.access.credentials import revoke_credential
from ledger.db.schema import integrations, receipts
from ledger.scheduling.instances import live_instances
from tests.helpers import event_body, make_sender, signed_headers
from tests.servers import BIN, gunicorn_server

BOUND = 2
WORKERS = 3


@pytest.fixture
def pg_env(pg_url, tmp_path):  # type: ignore[no-untyped-def]
    from tests.conftest import TEST_MASTER_KEY

    # Log level ERROR: tests.servers pipes stderr without draining it, and every 401
    # below logs a warning; a full pipe would block the workers.
    return {"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "test",
            "LEDGER_REVOCATION_BOUND_SECONDS": str(BOUND), "LEDGER_LOG_LEVEL": "ERROR"}


@pytest.fixture
def admin_app(pg_env):  # type: ignore[no-untyped-def]
    from app import create_app

    application = create_app(pg_env)
    yield application
    application.extensions["ledger"].close()


def _web_instances(app) -> list:  # type: ignore[no-untyped-def,type-arg]
    svc = app.extensions["ledger"]
    with svc.engine.connect() as conn:
        return live_instances(conn, now=datetime.now(UTC), within_seconds=BOUND, kind="web")


def _until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _post(url: str, sender, event_id: str) -> int:  # type: ignore[no-untyped-def]
    body = event_body(sender.profile, event_id)
    # A fresh connection each time, so that the kernel spreads requests over the workers.
    return requests.post(url, data=body, headers={**signed_headers(sender, body, event_id),
                                                  "Connection": "close"}, timeout=10).status_code


@pytest.mark.slow
def test_revoked_key_is_refused_within_the_bound_on_every_process(admin_app, pg_env):
    sender = make_sender(admin_app)
    with gunicorn_server(pg_env, workers=WORKERS) as (base_url, _process):
        _until(lambda: requests.get(f"{base_url}/healthz", headers={"Connection": "close"},
                                    timeout=5).ok and len(_web_instances(admin_app)) == WORKERS,
               30, f"{WORKERS} registered web instances")
        url = f"{base_url}/hooks/{sender.public_id}"
        assert _post(url, sender, "evt_1") == 202
        assert all(_post(url, sender, "evt_1") == 202 for _ in range(20))  # cached everywhere
        svc = admin_app.extensions["ledger"]
        with svc.engine.begin() as conn:
            revoked = revoke_credential(conn, audit.Actor(name="t", role="security"),
                                        sender.key_id, reason="leaked", now=svc.clock.now())
        started = time.monotonic()
        answers: list[tuple[float, int]] = []
        while time.monotonic() < started + BOUND + 1.5:
            sent = time.monotonic() - started
            answers.append((sent, _post(url, sender, "evt_1")))
        late = [status for sent, status in answers if sent >= BOUND]
        assert len(late) >= 5 and set(late) == {401}, answers
        first_refusal = min(sent for sent, status in answers if status == 401)
        assert first_refusal <= BOUND
        _until(lambda: all(i.credentials_refreshed_at >= revoked.revoked_at
                           for i in _web_instances(admin_app)), 10,
               "every instance to report a view newer than the revocation")
        assert len(_web_instances(admin_app)) == WORKERS
        assert _post(url, sender, "evt_new") == 401
    with svc.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(receipts)).scalar_one() == 1


@pytest.mark.slow
def test_drill_command_against_a_running_multiprocess_server(admin_app, pg_env):
    with gunicorn_server(pg_env, workers=2) as (base_url, _process):
        result = subprocess.run(
            [str(BIN / "ledger"), "drill", "--url", base_url, "--json"], cwd="/",
            env={**pg_env, "PATH": str(BIN)}, capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout)
    assert result.returncode == 0, report
    assert report["passed"] is True
    assert [s["name"] for s in report["steps"]][-1] == "cleanup"
    with admin_app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(integrations)).scalar_one() == 0
