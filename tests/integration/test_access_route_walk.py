"""No token, and no session without the password again, changes who may get in (CONTRACT
section 7): every state-changing route of the app's URL map is walked over real HTTP."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from flask import Flask
from sqlalchemy import select

from ledger.db.schema import api_tokens, credentials, integrations, operators
from tests.dashboard_helpers import (
    PASSWORD,
    add_conflict,
    fast_hashes,  # noqa: F401  (autouse fixture)
    make_operator,
    make_token,
)
from tests.helpers import Sender, make_sender
from tests.servers import thread_server

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
# Whatever lets someone in or decides who may: rows no token may ever change.
ACCESS_TABLES = (integrations, credentials, operators, api_tokens)
ACCESS_PREFIXES = ("/credentials", "/operators", "/tokens")
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
ATTACKER_SECRET = "whsec_attackerchosen0000000000000000"


# Bookkeeping a request may update without granting anything.
USE_MARKS = {"last_used_at", "wrote_at"}


def _access_rows(app: Flask) -> dict[str, list[tuple[Any, ...]]]:
    with app.extensions["ledger"].engine.connect() as conn:
        return {t.name: sorted(map(tuple, conn.execute(select(
                    *(c for c in t.columns if c.name not in USE_MARKS))).all()), key=repr)
                for t in ACCESS_TABLES}


def _state_changing_rules(app: Flask) -> list[tuple[str, str, Any]]:
    rules = [(rule.rule, method, app.view_functions[rule.endpoint])
             for rule in app.url_map.iter_rules()
             for method in sorted((rule.methods or set()) & UNSAFE)
             if not rule.rule.startswith("/hooks/")]  # senders sign; no operator there
    assert len(rules) >= 15, rules  # the walk really found the dashboard's forms
    return rules


def _fill(rule: str, values: dict[str, str]) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", lambda m: values[m.group(1)], rule)


@pytest.fixture
def world(app: Flask) -> Iterator[tuple[str, Sender, dict[str, str], dict[str, str]]]:
    """A served app with an integration, a conflict and a victim operator with a token."""
    sender = make_sender(app)
    make_operator(app, "victim", "viewer")
    make_token(app, "victim")
    with app.extensions["ledger"].engine.connect() as conn:
        token_id = conn.execute(select(api_tokens.c.public_id)).scalar_one()
    path_values = {"public_id": sender.public_id, "username": "victim", "token_id": token_id,
                   "conflict_id": str(add_conflict(app, sender.scope_id, "ev-c")),
                   "run_id": "abc123abc123"}
    form = {"password": PASSWORD, "account": "acme", "name": "evil", "profile": "stripe",
            "secret": ATTACKER_SECRET, "username": "intruder", "role": "admin", "write": "1",
            "key_id": sender.key_id, "confirm_last": "1", "reason": "because",
            "overlap": "0", "expires_in": "86400"}
    with thread_server(app) as base:
        yield base, sender, path_values, form


def test_a_write_token_changes_no_access_anywhere(app: Flask, world: Any) -> None:
    """The reported attack was POST /credentials/connect with a security write token."""
    base, _, path_values, form = world
    make_operator(app, "sec", "admin")
    bearer = {"Authorization": f"Bearer {make_token(app, 'sec', write=True)}"}
    for rule, method, view in _state_changing_rules(app):
        before = _access_rows(app)
        answer = requests.request(method, base + _fill(rule, path_values), data=form,
                                  headers=bearer, allow_redirects=False, timeout=30)
        assert answer.status_code < 500, (rule, answer.status_code)
        assert _access_rows(app) == before, f"{method} {rule} changed access with a token"
        if rule.startswith(ACCESS_PREFIXES) or getattr(view, "session_only", False):
            assert answer.status_code == 403, (rule, answer.status_code)
            assert answer.json() == {"error": "forbidden"}, rule


def _session(base: str, username: str) -> requests.Session:
    browser = requests.Session()
    page = browser.get(f"{base}/login", timeout=30).text
    answer = browser.post(f"{base}/login", timeout=30, allow_redirects=False, data={
        "username": username, "password": PASSWORD, "csrf_token": CSRF.findall(page)[0]})
    assert answer.status_code == 303
    return browser


def test_a_session_without_the_password_changes_no_access(app: Flask, world: Any) -> None:
    """Every session-only form asks for the password again, connecting a sender included."""
    base, _, path_values, form = world
    make_operator(app, "boss", "admin")
    session_only = [(r, m) for r, m, view in _state_changing_rules(app)
                    if getattr(view, "session_only", False)]
    assert ("/credentials/connect", "POST") in session_only
    for rule, method in session_only:
        browser = _session(base, "boss")  # a fresh one: wrong passwords end a session
        csrf = CSRF.findall(browser.get(f"{base}/", timeout=30).text)[0]
        for password in ("", "wrong password"):
            before = _access_rows(app)
            answer = browser.request(method, base + _fill(rule, path_values), timeout=30,
                                     allow_redirects=False,
                                     data={**form, "password": password, "csrf_token": csrf})
            assert answer.status_code == 403, (rule, password, answer.status_code)
            assert _access_rows(app) == before, f"{method} {rule} changed access"


def test_connect_with_the_password_works_and_is_audited(app: Flask, world: Any) -> None:
    """The form still connects a sender once the operator proves it is them."""
    base, _, _, form = world
    make_operator(app, "sec", "security")
    browser = _session(base, "sec")
    csrf = CSRF.findall(browser.get(f"{base}/", timeout=30).text)[0]
    answer = browser.post(f"{base}/credentials/connect", timeout=30,
                          data={**form, "csrf_token": csrf})
    assert answer.status_code == 200 and "Connected acme/evil (stripe)" in answer.text
