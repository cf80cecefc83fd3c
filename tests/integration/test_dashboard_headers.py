"""The dashboard refuses to be framed and runs no inline script (CONTRACT section 7); the
session cookie is Secure by default in production (CONTRACT section 5)."""

from __future__ import annotations

import re
from pathlib import Path

import requests
from flask import Flask

from app import create_app
from tests.dashboard_helpers import (
    PASSWORD,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    make_operator,
)
from tests.helpers import make_sender
from tests.servers import thread_server

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
INLINE_HANDLER = re.compile(r"\son[a-z]+\s*=", re.I)
INLINE_STYLE = re.compile(r"<style|\sstyle\s*=", re.I)


def _login(base: str, username: str) -> requests.Session:
    browser = requests.Session()
    csrf = CSRF.findall(browser.get(f"{base}/login", timeout=30).text)[0]
    answer = browser.post(f"{base}/login", timeout=30, allow_redirects=False, data={
        "username": username, "password": PASSWORD, "csrf_token": csrf})
    assert answer.status_code == 303
    return browser


def test_every_page_forbids_framing_and_inline_script(app: Flask) -> None:
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_failed", state=2)
    make_operator(app, "boss", "admin")
    pages = sorted(rule.rule for rule in app.url_map.iter_rules()
                   if "GET" in (rule.methods or ()) and not rule.arguments
                   and not rule.rule.startswith(("/static", "/hooks")))
    assert "/" in pages and "/login" in pages
    with thread_server(app) as base:
        browser = _login(base, "boss")
        for path in pages:
            answer = browser.get(f"{base}{path}", timeout=30)
            policy = answer.headers.get("Content-Security-Policy", "")
            assert answer.headers.get("X-Frame-Options") == "DENY", path
            assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, path
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, path
            if answer.headers.get("Content-Type", "").startswith("text/html"):
                assert not INLINE_SCRIPT.search(answer.text), path
                assert not INLINE_HANDLER.search(answer.text), path
                assert not INLINE_STYLE.search(answer.text), path


def test_no_template_carries_an_inline_script_handler_or_style() -> None:
    """Fragments swapped in by htmx are covered too, not only the pages walked above."""
    for template in TEMPLATES.rglob("*.html"):
        text = template.read_text()
        assert not INLINE_SCRIPT.search(text), template.name
        assert not INLINE_HANDLER.search(text), template.name
        assert not INLINE_STYLE.search(text), template.name


def test_the_session_cookie_is_secure_by_default_in_production(test_env) -> None:  # type: ignore[no-untyped-def]
    production = create_app({**test_env, "LEDGER_ENV": "production",
                             "LEDGER_LOG_HASH_KEY": "a-log-hash-key-for-tests"})
    try:
        with thread_server(production) as base:
            # The login form's CSRF token already lives in the session cookie.
            answer = requests.get(f"{base}/login", timeout=30)
        cookie = answer.headers["Set-Cookie"]
        assert "ledger_session=" in cookie and "Secure" in cookie and "HttpOnly" in cookie
    finally:
        production.extensions["ledger"].close()
