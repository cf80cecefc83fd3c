"""No 5xx from any route (CONTRACT section 7): hostile text and integers in every route's
path, query and form fields, from an admin's session over real HTTP, on both databases.

The routes come from the app's URL map, so a new form is fuzzed the day it is added. A
4xx answer writes nothing; no answer is a 5xx.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import requests
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from ledger.db.schema import (
    api_tokens,
    audit_log,
    conflicts,
    credentials,
    integrations,
    jobs,
    operators,
    receipts,
)
from tests.dashboard_helpers import (
    PASSWORD,
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    make_operator,
)
from tests.helpers import make_sender, signed_headers
from tests.servers import thread_server

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
WATCHED = (receipts, jobs, conflicts, integrations, credentials, operators, api_tokens,
           audit_log)
# Ending the session would end the walk; the drill takes nothing but the password and runs
# a real drill: neither has a field to fuzz.
NOT_WALKED = {"/logout", "/credentials/drill"}
FIELDS = ("scope", "event_id", "reason", "note", "group", "event_type", "since", "until",
          "done", "skipped", "total", "after", "key_id", "confirm_last", "overlap",
          "expires_in", "username", "role", "write", "account", "name", "profile",
          "tolerance", "type_path", "url", "secret", "next", "cursor", "integration",
          "outcome", "state", "q", "limit", "page", "open", "hmac_algorithm")
SPECIALS = ("\x00", "a\x00b", "\ud800", "x\udfffy", "\r\nX: y", "/\r\nX: y", "//evil.example",
            "9223372036854775808", "-9223372036854775809", "2147483648", "1e400", "NaN",
            "0x10", "", " ", "%00", "../../etc/passwd", "\u202e", "\ufeff", "<script>",
            "' OR 1=1 --", "\\\\evil", "9" * 400, "\x7f", "\t", "acme/stripe-prod")
hostile_text = st.one_of(st.sampled_from(SPECIALS), st.text(max_size=40),
                         st.integers(-2**70, 2**70).map(str))


def _enc(text: str) -> bytes:
    """Bytes as a client would send them (a lone surrogate kept as its 3 bytes)."""
    return text.encode("utf-8", "surrogatepass")


def _counts(app: Flask) -> dict[str, int]:
    with app.extensions["ledger"].engine.connect() as conn:
        return {t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                for t in WATCHED}


def _routes(app: Flask) -> list[tuple[str, str, tuple[str, ...]]]:
    found = []
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith(("/hooks/", "/static/")) or rule.rule in NOT_WALKED:
            continue
        for method in sorted((rule.methods or set()) & {"GET", "POST"}):
            found.append((rule.rule, method, tuple(rule.arguments)))
    assert len(found) >= 40, found  # the walk sees the whole app
    return found


def _path(rule: str, values: dict[str, str]) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>",
                  lambda m: quote(_enc(values[m.group(1)]), safe=""), rule)


def _browser(base: str) -> tuple[requests.Session, str]:
    browser = requests.Session()
    page = browser.get(f"{base}/login", timeout=30).text
    answer = browser.post(f"{base}/login", allow_redirects=False, timeout=30, data={
        "username": "boss", "password": PASSWORD, "csrf_token": CSRF.findall(page)[0]})
    assert answer.status_code == 303
    return browser, CSRF.findall(browser.get(f"{base}/", timeout=30).text)[0]


def _request_route(browser: requests.Session, base: str, csrf: str, route: tuple[str, str, Any],
          values: dict[str, str], fields: dict[str, str]) -> requests.Response:
    """Send one request of `route` with these path values and query or form fields."""
    rule, method, _ = route
    url = f"{base}{_path(rule, values)}"
    if method == "GET":
        query = urlencode([(k, _enc(v)) for k, v in fields.items()])
        return browser.get(f"{url}?{query}", timeout=30, allow_redirects=False)
    body = urlencode([("csrf_token", csrf), ("password", PASSWORD),
                      *((k, _enc(v)) for k, v in fields.items())])
    return browser.post(url, data=body, timeout=30, allow_redirects=False,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})


@pytest.fixture
def served(app: Flask) -> Iterator[tuple[str, requests.Session, str]]:
    """A served app with a failed receipt, a conflict and an admin's browser session."""
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "ev-failed", state=2)
    add_conflict(app, sender.scope_id, "ev-conflict")
    make_operator(app, "boss", "admin")
    with thread_server(app) as base:
        yield (base, *_browser(base))


# The reported classes, each put in every field of every route at once.
SWEPT = ("a\x00b", "x\ud800y", "9223372036854775808", "/\r\nX: y")


@pytest.mark.parametrize("hostile", SWEPT, ids=["nul", "surrogate", "int64", "crlf"])
def test_every_route_refuses_the_reported_classes_without_5xx(app: Flask, served: Any,
                                                              hostile: str) -> None:
    """NUL, lone surrogates, out-of-range ids and CR/LF: 4xx (or a harmless 2xx/3xx)."""
    base, browser, csrf = served
    for route in _routes(app):
        before = _counts(app)
        answer = _request_route(browser, base, csrf, route, dict.fromkeys(route[2], hostile),
                       dict.fromkeys(FIELDS, hostile))
        assert answer.status_code < 500, (route, hostile)
        if answer.status_code >= 400:
            assert _counts(app) == before, (route, hostile)
        location = answer.headers.get("Location", "")
        assert "\r" not in location and "\n" not in location and "X: y" not in answer.headers


def test_hostile_paths_queries_and_forms_never_answer_5xx(app: Flask, served: Any) -> None:
    """Random hostile text and integers in any field of any route."""
    base, browser, csrf = served

    @settings(max_examples=120, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(route=st.sampled_from(_routes(app)), data=st.data())
    def probe(route: tuple[str, str, tuple[str, ...]], data: Any) -> None:
        values = {name: data.draw(hostile_text) for name in route[2]}
        fields = data.draw(st.dictionaries(st.sampled_from(FIELDS), hostile_text,
                                           max_size=8))
        before = _counts(app)
        answer = _request_route(browser, base, csrf, route, values, fields)
        assert answer.status_code < 500, (route, values, fields)
        if answer.status_code >= 400:
            assert _counts(app) == before, (route, values, fields)

    probe()


@pytest.mark.parametrize("target", ["/\r\nX: y", "/\\evil.example", "/ok\x00", "/\ud800"])
def test_login_with_a_hostile_next_lands_on_the_overview(app: Flask, target: str) -> None:
    """The reported 500 came after the session row and cookie were written."""
    make_operator(app, "boss", "admin")
    with thread_server(app) as base:
        browser = requests.Session()
        csrf = CSRF.findall(browser.get(f"{base}/login", timeout=30).text)[0]
        body = urlencode([("username", "boss"), ("password", PASSWORD),
                          ("csrf_token", csrf), ("next", _enc(target))])
        answer = browser.post(f"{base}/login", data=body, timeout=30, allow_redirects=False,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert answer.status_code in (303, 400), answer.status_code
        assert "X" not in answer.headers and "\n" not in answer.headers.get("Location", "")
        if answer.status_code == 303:  # a local path, percent-encoded: never another host
            location = answer.headers["Location"]
            assert location.startswith("/") and not location.startswith("//"), location
            assert "\\" not in location and "%0D" not in location.upper(), location


def test_a_signed_body_with_a_lone_surrogate_is_refused_at_intake(app: Flask) -> None:
    """Accepted, it made its receipt and conflict pages answer 500 (UnicodeEncodeError)."""
    sender = make_sender(app)
    before = _counts(app)
    body = b'{"id": "evt_surrogate", "type": "demo.credit", "data": {"note": "\\ud800"}}'
    with thread_server(app) as base:
        answer = requests.post(f"{base}/hooks/{sender.public_id}", data=body, timeout=30,
                               headers=signed_headers(sender, body, "evt_surrogate"))
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_event"
    assert _counts(app) == before
