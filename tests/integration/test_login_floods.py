"""Sign-in floods (finding 6): rotating addresses does not escape a per-username limit, and
random usernames cannot run more than a few Argon2 checks at once in a process."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

import ledger.access.operators
from ledger.access.operators import MAX_CONCURRENT_HASHES
from ledger.access.sessions import USERNAME_LIMIT_FACTOR
from tests.dashboard_helpers import (
    CSRF,
    PASSWORD,
    fast_hashes,  # noqa: F401  (autouse fixture)
    make_operator,
)
from tests.servers import thread_server

WRONG = "a wrong password guess"


def _login(base: str, username: str, password: str, address: str | None = None) -> int:
    browser = requests.Session()
    headers = {"X-Forwarded-For": address} if address else {}
    csrf = CSRF.search(browser.get(f"{base}/login", timeout=30).text).group(1)  # type: ignore[union-attr]
    return browser.post(f"{base}/login", timeout=30, allow_redirects=False, headers=headers,
                        data={"username": username, "password": password,
                              "csrf_token": csrf}).status_code


def test_rotating_addresses_meets_a_per_username_limit(test_env) -> None:  # type: ignore[no-untyped-def]
    from app import create_app

    app = create_app({**test_env, "LEDGER_TRUSTED_PROXIES": "1"})
    try:
        make_operator(app, "sam", "security")
        limit = app.extensions["ledger"].settings.login_max_failures * USERNAME_LIMIT_FACTOR
        with thread_server(app) as base:
            for n in range(limit):  # each from a new address: the per-address limit never bites
                assert _login(base, "sam", WRONG, f"203.0.113.{n + 1}") == 401
            assert _login(base, "sam", PASSWORD, "198.51.100.200") == 429
            assert _login(base, "someone-else", WRONG, "198.51.100.200") == 401
    finally:
        app.extensions["ledger"].close()


def test_random_usernames_run_at_most_a_few_password_checks_at_once(
        app, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    running, most, answered = [0], [0], threading.Semaphore(0)
    release, lock = threading.Event(), threading.Lock()
    checked = ledger.access.operators.verify_password

    def slow_check(stored: str, password: str) -> bool:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(timeout=30)  # held until the refused sign-ins have been answered
        with lock:
            running[0] -= 1
        return checked(stored, password)

    monkeypatch.setattr(ledger.access.operators, "verify_password", slow_check)
    parallel = MAX_CONCURRENT_HASHES + 4
    with thread_server(app) as base:

        def attempt(n: int) -> int:
            status = _login(base, f"nobody-{n}", WRONG)
            answered.release()
            return status

        with ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(attempt, n) for n in range(parallel)]
            for _ in range(parallel - MAX_CONCURRENT_HASHES):
                assert answered.acquire(timeout=60)  # the excess answers without a slot
            release.set()
            statuses = sorted(f.result(timeout=60) for f in futures)
    assert most[0] == MAX_CONCURRENT_HASHES
    assert statuses == [401] * MAX_CONCURRENT_HASHES + [503] * (parallel - MAX_CONCURRENT_HASHES)
