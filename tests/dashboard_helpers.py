"""Helpers for dashboard and API tests: operators, logins, CSRF-carrying posts, seeded rows."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from argon2 import PasswordHasher
from flask import Flask
from sqlalchemy import insert

from ledger.access import audit
from ledger.access.operators import Operator, create_operator, issue_token
from ledger.db.schema import attempts, conflicts, jobs, receipts
from ledger.worker.failure_groups import record_failure

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def fast_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use cheap argon2 parameters in tests (production keeps the library defaults)."""
    import ledger.access.operators

    monkeypatch.setattr(ledger.access.operators, "_hasher",
                        PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def make_operator(app: Flask, username: str, role: str, password: str = PASSWORD) -> Operator:
    """Create an operator directly in the database."""
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        return create_operator(conn, audit.Actor(name="test", role="admin"), username=username,
                               role=role, password=password, now=svc.clock.now())


def make_token(app: Flask, username: str, *, write: bool = False,
               expires_in: int = 90 * 86400) -> str:
    """Issue an API token for an operator (read-only unless `write`)."""
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        return issue_token(conn, audit.Actor(name="test", role="admin"), username,
                           now=svc.clock.now(), write=write, expires_in=expires_in).token


def csrf_token(client: Any, path: str = "/login") -> str:
    """Fetch a page and return the CSRF token it carries."""
    html = client.get(path).get_data(as_text=True)
    match = CSRF.search(html)
    assert match, f"no CSRF token on {path}"
    return match.group(1)


def login(client: Any, username: str, password: str = PASSWORD) -> Any:
    """Log in through the form, CSRF token included; return the response."""
    token = csrf_token(client, "/login")
    return client.post("/login", data={"username": username, "password": password,
                                       "csrf_token": token})


def logged_in(app: Flask, role: str, username: str | None = None) -> Any:
    """Return a new test client logged in as a fresh operator with `role`."""
    username = username or f"{role}-op"
    make_operator(app, username, role)
    client = app.test_client()
    response = login(client, username)
    assert response.status_code == 303, response.get_data(as_text=True)
    return client


def post(client: Any, path: str, data: dict[str, str] | None = None,
         htmx: bool = False) -> Any:
    """POST a dashboard form with a fresh CSRF token from the overview."""
    payload = dict(data or {})
    payload["csrf_token"] = csrf_token(client, "/")
    headers = {"HX-Request": "true"} if htmx else {}
    return client.post(path, data=payload, headers=headers)


def add_receipt(app: Flask, scope_id: int, event_id: str, *, state: int = 1,
                event_type: str = "demo.credit", accepted_at: datetime | None = None,
                error: str | None = None, payload: str | None = None) -> None:
    """Insert a receipt (and for failed ones a failed job and an attempt) directly."""
    svc = app.extensions["ledger"]
    at = accepted_at or svc.clock.now()
    with svc.engine.begin() as conn:
        conn.execute(insert(receipts).values(
            scope_id=scope_id, event_id=event_id, event_type=event_type, state=state,
            attempts=1 if state != 0 else 0, accepted_at=at,
            completed_at=None if state == 0 else at + timedelta(seconds=1),
            body_sha256=b"\x01" * 32, result_ref="credit:1" if state == 1 else None))
        if state == 2:
            conn.execute(insert(jobs).values(
                scope_id=scope_id, event_id=event_id, event_type=event_type, accepted_at=at,
                run_at=at, status=1, attempts=1, lease_token=1,
                payload=payload or '{"data": {"amount": 1}}'))
            conn.execute(insert(attempts).values(
                scope_id=scope_id, event_id=event_id, number=1, worker_id="w-test",
                lease_token=1, started_at=at, finished_at=at, outcome="error",
                error=error or "RuntimeError: boom"))
            record_failure(conn, scope_id=scope_id, event_id=event_id, event_type=event_type,
                           error=error or "RuntimeError: boom",
                           failed_at=at + timedelta(seconds=1))
        if state == 0:
            conn.execute(insert(jobs).values(
                scope_id=scope_id, event_id=event_id, event_type=event_type, accepted_at=at,
                run_at=at, status=0, attempts=0, lease_token=0,
                payload=payload or '{"data": {"amount": 1}}'))


def add_conflict(app: Flask, scope_id: int, event_id: str) -> int:
    """Insert a conflict row and return its id."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        return int(conn.execute(insert(conflicts).values(
            scope_id=scope_id, event_id=event_id, kind="different_body",
            original_event_id=event_id, original_sha256=b"\x01" * 32,
            incoming_sha256=b"\x02" * 32, first_seen=now, last_seen=now, count=2)
            .returning(conflicts.c.id)).scalar_one())
