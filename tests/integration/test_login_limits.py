"""Login limits (issue 14, finding 2): nobody can lock a logged-in operator out of confirming
an action; the client address honours LEDGER_TRUSTED_PROXIES; the limit check and the
failure record are one atomic step across processes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from argon2 import PasswordHasher
from sqlalchemy import create_engine, text

import ledger.access.operators
from ledger.access.sessions import LOGIN_LOCK_CLASS, login_key, recent_failures
from ledger.config import Settings
from tests.conftest import TEST_AUDIT_KEY, TEST_MASTER_KEY
from tests.dashboard_helpers import (
    CSRF,
    PASSWORD,
    csrf_token,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    login,
    make_operator,
    post,
)
from tests.helpers import make_sender
from tests.servers import gunicorn_server

WRONG = "a wrong password guess"
PARALLEL = 16


def _revoke_form(key_id: str, password: str = PASSWORD) -> dict[str, str]:
    return {"key_id": key_id, "reason": "leaked", "confirm_last": "1", "password": password}


def test_login_failures_elsewhere_never_block_a_logged_in_operators_password(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    sam = logged_in(app, "security", "sam")
    attacker = app.test_client()  # same address as sam: behind one proxy, all are
    for _ in range(8):
        login(attacker, "sam", WRONG)
    assert login(attacker, "sam").status_code == 429  # the login form is limited ...
    answer = post(sam, f"/credentials/{sender.public_id}/revoke", _revoke_form(sender.key_id),
                  htmx=True)
    # ... but sam, already signed in, still revokes with the right password.
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert f"Revoked {sender.key_id}" in answer.get_data(as_text=True)


def test_password_reentry_is_limited_per_session(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    first = logged_in(app, "security", "sam")
    second = app.test_client()
    assert login(second, "sam").status_code == 303
    rotate = f"/credentials/{sender.public_id}/rotate"
    answers = [post(first, rotate, {"reason": "r", "overlap": "0", "password": WRONG},
                    htmx=True).get_data(as_text=True) for _ in range(5)]
    assert all("did not match" in a for a in answers[:4])
    assert "Too many wrong passwords in this session" in answers[4]
    assert first.get("/").status_code == 302  # that session ended: sign in again
    # Another session of the same operator is untouched, and so is the login form.
    answer = post(second, rotate, {"reason": "r", "overlap": "0", "password": PASSWORD},
                  htmx=True)
    assert answer.status_code == 200 and "Rotated" in answer.get_data(as_text=True)
    assert login(app.test_client(), "sam").status_code == 303


def test_a_good_password_resets_the_sessions_count(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    sam = logged_in(app, "security", "sam")
    rotate = f"/credentials/{sender.public_id}/rotate"
    for _ in range(3):
        for _ in range(4):
            post(sam, rotate, {"reason": "r", "password": WRONG})
        assert post(sam, rotate, {"reason": "r", "password": PASSWORD}).status_code == 200
    assert sam.get("/").status_code == 200


def _proxied_app(test_env: dict[str, str], proxies: str):  # type: ignore[no-untyped-def]
    from app import create_app

    return create_app({**test_env, "LEDGER_TRUSTED_PROXIES": proxies})


def test_trusted_proxy_gives_each_client_its_own_limit(test_env) -> None:  # type: ignore[no-untyped-def]
    app = _proxied_app(test_env, "1")
    try:
        make_operator(app, "sam", "security")
        attacker, sam = app.test_client(), app.test_client()
        attacker.environ_base["HTTP_X_FORWARDED_FOR"] = "203.0.113.9"
        sam.environ_base["HTTP_X_FORWARDED_FOR"] = "198.51.100.7"
        for _ in range(5):
            assert login(attacker, "sam", WRONG).status_code == 401
        assert login(attacker, "sam").status_code == 429
        assert login(sam, "sam").status_code == 303
    finally:
        app.extensions["ledger"].close()


def test_without_trusted_proxies_the_forwarded_header_is_ignored(test_env) -> None:  # type: ignore[no-untyped-def]
    app = _proxied_app(test_env, "0")
    try:
        make_operator(app, "sam", "security")
        attacker = app.test_client()
        for n in range(5):  # a fresh forged address each time buys nothing
            attacker.environ_base["HTTP_X_FORWARDED_FOR"] = f"10.0.0.{n}"
            assert login(attacker, "sam", WRONG).status_code == 401
        attacker.environ_base["HTTP_X_FORWARDED_FOR"] = "10.0.0.99"
        assert login(attacker, "sam").status_code == 429
    finally:
        app.extensions["ledger"].close()


def test_the_intake_fast_path_sees_the_forwarded_client_too(test_env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ledger.web.ingest as ingest

    seen: list[str] = []

    def spy(_services: Any, _public_id: str, environ: dict[str, Any]) -> Any:
        seen.append(environ.get("REMOTE_ADDR", ""))
        return ingest.HookAnswer(404, {"error": "unknown_integration"})

    monkeypatch.setattr(ingest, "answer_delivery", spy)
    for proxies, expected in (("1", "203.0.113.9"), ("0", "127.0.0.1")):
        app = _proxied_app(test_env, proxies)
        try:
            app.test_client().post("/hooks/in_0000000000000000000000", data=b"{}",
                                   headers={"X-Forwarded-For": "203.0.113.9"})
        finally:
            app.extensions["ledger"].close()
        assert seen.pop() == expected


@pytest.mark.parametrize("raw", ["-1", "two", "1.5"])
def test_trusted_proxies_setting_is_strict(raw: str) -> None:
    with pytest.raises(ValueError, match="LEDGER_TRUSTED_PROXIES"):
        Settings.from_env({"LEDGER_TRUSTED_PROXIES": raw})


def test_trusted_proxies_defaults_to_zero() -> None:
    assert Settings.from_env({}).trusted_proxies == 0
    assert Settings.from_env({"LEDGER_TRUSTED_PROXIES": "2"}).trusted_proxies == 2


def test_a_burst_on_one_key_past_the_lock_timeout_is_a_rate_limit_not_an_outage(  # type: ignore[no-untyped-def]
        pg_url, tmp_path) -> None:
    """PostgreSQL serializes the sign-ins of one key on an advisory lock. A sign-in that
    waits past lock_timeout behind the others of its key is refused as too many (429,
    Retry-After), not as storage trouble (503), and nothing of it is recorded."""
    from app import create_app

    env = {"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
           "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY, "LEDGER_VAR_DIR": str(tmp_path),
           "LEDGER_SECRET_KEY": "test-secret-key", "LEDGER_DB_LOCK_TIMEOUT_MS": "200"}
    app = create_app(env)
    try:
        make_operator(app, "sam", "security")
        client = app.test_client()
        token = csrf_token(client, "/login")
        key = login_key("sam", "127.0.0.1")
        holder = create_engine(pg_url)
        try:
            with holder.begin() as conn:  # another sign-in of the key, still being checked
                conn.execute(text("SELECT pg_advisory_xact_lock(:cls, hashtext(:key))"),
                             {"cls": LOGIN_LOCK_CLASS, "key": key})
                answer = client.post("/login", data={"username": "sam", "password": PASSWORD,
                                                     "csrf_token": token})
        finally:
            holder.dispose()
        assert answer.status_code == 429
        assert answer.headers["Retry-After"] == "2"
        assert "being checked" in answer.get_data(as_text=True)
        svc = app.extensions["ledger"]
        with svc.engine.connect() as conn:
            assert recent_failures(conn, key, svc.clock.now(), 3600) == 0
        # Once the other sign-in is done, the same form signs in.
        assert login(client, "sam").status_code == 303
    finally:
        app.extensions["ledger"].close()


# Real HTTP against a multi-process gunicorn, on both databases.

def _session(base_url: str, forwarded_for: str | None = None) -> tuple[requests.Session, str]:
    """Return a browser-like session with the CSRF token of the login page."""
    session = requests.Session()
    if forwarded_for:
        session.headers["X-Forwarded-For"] = forwarded_for
    match = CSRF.search(session.get(f"{base_url}/login", timeout=10).text)
    assert match
    return session, match.group(1)


def _http_login(base_url: str, username: str, password: str,
                forwarded_for: str | None = None) -> tuple[requests.Session, int]:
    session, token = _session(base_url, forwarded_for)
    answer = session.post(f"{base_url}/login", timeout=30, allow_redirects=False,
                          data={"username": username, "password": password, "csrf_token": token})
    return session, answer.status_code


def test_parallel_wrong_logins_are_evaluated_at_most_limit_times(test_env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from app import create_app

    # The real argon2 cost, so each guess takes long enough for the others to race it.
    monkeypatch.setattr(ledger.access.operators, "_hasher", PasswordHasher())
    app = create_app(test_env)
    make_operator(app, "sam", "security")
    app.extensions["ledger"].close()
    env = {**test_env, "LEDGER_LOG_LEVEL": "WARNING", "LEDGER_DB_POOL_SIZE": "8"}
    with gunicorn_server(env, workers=4) as (base_url, _process):
        prepared = [_session(base_url) for _ in range(PARALLEL)]
        barrier = threading.Barrier(PARALLEL)

        def guess(n: int) -> int:
            session, token = prepared[n]
            barrier.wait(timeout=30)
            return session.post(f"{base_url}/login", timeout=60, allow_redirects=False,
                                data={"username": "sam", "password": f"{WRONG} {n}",
                                      "csrf_token": token}).status_code

        with ThreadPoolExecutor(PARALLEL) as pool:
            statuses = sorted(pool.map(guess, range(PARALLEL)))
    # Exactly the limit of guesses took a reservation: each reached the password check
    # (401) or found every hashing slot of its process taken (503, the cap on concurrent
    # argon2 runs); the rest were refused before any of that (429).
    assert statuses.count(401) + statuses.count(503) == 5, statuses
    assert statuses.count(401) >= 1, statuses
    assert statuses.count(429) == PARALLEL - 5, statuses


@pytest.mark.parametrize("proxies", ["0", "1"])
def test_an_attacker_cannot_lock_the_revoker_out_behind_a_proxy(test_env, proxies: str) -> None:  # type: ignore[no-untyped-def]
    """The reported scenario: five wrong logins for `security` from anywhere."""
    from app import create_app

    app = create_app(test_env)
    sender = make_sender(app)
    make_operator(app, "security", "security")
    app.extensions["ledger"].close()
    env = {**test_env, "LEDGER_LOG_LEVEL": "WARNING", "LEDGER_TRUSTED_PROXIES": proxies}
    with gunicorn_server(env, workers=2) as (base_url, _process):
        # The proxy (nginx) appends the real client to X-Forwarded-For.
        operator, status = _http_login(base_url, "security", PASSWORD, "198.51.100.7")
        assert status == 303
        for _ in range(6):
            _http_login(base_url, "security", WRONG, "203.0.113.9")
        assert _http_login(base_url, "security", PASSWORD, "203.0.113.9")[1] == 429
        page = operator.get(f"{base_url}/credentials/{sender.public_id}", timeout=10).text
        token = CSRF.search(page).group(1)  # type: ignore[union-attr]
        answer = operator.post(f"{base_url}/credentials/{sender.public_id}/revoke",
                               data={**_revoke_form(sender.key_id), "csrf_token": token},
                               headers={"HX-Request": "true"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert f"Revoked {sender.key_id}" in answer.text
        # With the proxy trusted, the real operator's own login is not limited either.
        # Without it every client is the proxy's address, so the login form is shared.
        expected = 303 if proxies == "1" else 429
        assert _http_login(base_url, "security", PASSWORD, "198.51.100.7")[1] == expected
