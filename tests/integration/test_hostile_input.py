"""Hostile input answers 400 with the documented body, never 500, and writes nothing:
strict JSON at the intake, unreadable bodies, cursors and dates out of range, and stored
payloads from before the intake was strict (over real HTTP, gunicorn with two workers)."""

from __future__ import annotations

import base64
import json
import socket
from urllib.parse import urlsplit

import pytest
import requests

from ledger import strict_json
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    make_operator,
    make_token,
    post,
)
from tests.helpers import ledger_counts, make_sender, signed_headers
from tests.servers import gunicorn_server


@pytest.fixture
def served(app, test_env):  # type: ignore[no-untyped-def]
    """A multi-process gunicorn on the test database."""
    with gunicorn_server(test_env, workers=2) as (base_url, _process):
        yield base_url


def _nested(depth: int) -> str:
    """Return a stripe body whose `data` nests `depth` levels in all (the body is level 1)."""
    inner = '{"x": 1}' if depth >= 2 else "1"
    for _ in range(depth - 2):
        inner = '{"x": ' + inner + "}"
    return f'{{"id": "evt_{depth}", "type": "demo.credit", "data": {inner}}}'


HOSTILE = {
    "nested 65 deep": (_nested(65), "deeper than 64"),
    "nested 1000 deep": (_nested(1000), "deeper than 64"),
    "a number that overflows": ('{"id": "evt_big", "type": "demo.credit", "x": 1e400}',
                                "too large"),
    "a negative overflow": ('{"id": "evt_neg", "type": "demo.credit", "x": -1e400}',
                            "too large"),
    "a duplicate key": ('{"id": "evt_dup", "type": "demo.credit", "id": "evt_other"}',
                        "duplicate key"),
    "a nested duplicate": ('{"id": "evt_dup2", "type": "demo.credit", '
                           '"data": {"amount": 1, "amount": 100}}', "duplicate key"),
    "NaN": ('{"id": "evt_nan", "type": "demo.credit", "x": NaN}', "not valid JSON"),
}


def test_the_intake_refuses_what_parsers_read_differently(app, served):
    sender = make_sender(app)
    before = ledger_counts(app)
    for name, (text, detail) in HOSTILE.items():
        body = text.encode()
        response = requests.post(f"{served}/hooks/{sender.public_id}", data=body, timeout=10,
                                 headers=signed_headers(sender, body, "x"))
        assert response.status_code == 400, (name, response.text)
        assert response.json()["error"] == "invalid_event", name
        assert detail in response.json()["detail"], (name, response.json())
    assert ledger_counts(app) == before
    body = _nested(64).encode()  # the deepest a body may nest
    response = requests.post(f"{served}/hooks/{sender.public_id}", data=body, timeout=10,
                             headers=signed_headers(sender, body, "x"))
    assert response.status_code == 202, response.text


def test_the_depth_limit_is_a_setting(test_env, tmp_path):  # type: ignore[no-untyped-def]
    from app import create_app

    shallow = create_app({**test_env, "LEDGER_MAX_JSON_DEPTH": "3"})
    try:
        sender = make_sender(shallow)
        client = shallow.test_client()
        for depth, status in ((3, 202), (4, 400)):
            body = _nested(depth).encode()
            answer = client.post(f"/hooks/{sender.public_id}", data=body,
                                 headers=signed_headers(sender, body, "x"))
            assert answer.status_code == status, answer.get_data(as_text=True)
    finally:
        shallow.extensions["ledger"].close()


def test_a_malformed_chunked_body_is_refused_with_400(app, served):
    sender = make_sender(app)
    before = ledger_counts(app)
    parts = urlsplit(served)
    headers = signed_headers(sender, b"{}", "x")
    request = (f"POST /hooks/{sender.public_id} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
               "Transfer-Encoding: chunked\r\n"
               + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
               + "\r\n5\r\n{\"a\":\r\nzz\r\nnot a chunk\r\n0\r\n\r\n")
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request.encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert json.loads(body)["error"] == "invalid_event"
    assert ledger_counts(app) == before


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


AT = b'{"t":"2026-11-30T12:00:00+00:00"}'
BAD_READS = [
    "/api/v1/receipts?cursor=" + _cursor(b"[" + AT + b",100000000000000000000000000,\"e\"]"),
    "/api/v1/audit?cursor=" + _cursor(b"[100000000000000000000000000]"),
    "/api/v1/conflicts?cursor=" + _cursor(b"[" + AT + b",-1]"),
    "/api/v1/receipts?cursor=" + _cursor(b'[{"t":"0001-01-01T00:00:00+01:00"},1,"e"]'),
    "/api/v1/receipts?cursor=" + _cursor(b'[{"t":"9999-12-31T23:59:59-01:00"},1,"e"]'),
    "/api/v1/receipts?cursor=" + _cursor(b"[" + AT + b',1,"e\\u0000"]'),
    "/api/v1/receipts?cursor=" + _cursor(b"[" + AT + b',1,"\\ud800"]'),
    "/api/v1/integrations?cursor=" + _cursor(b'["\\ud800","x"]'),
    "/api/v1/receipts?since=0001-01-01T00:00:00%2B01:00",
    "/api/v1/failures?since=0001-01-01T00:00:00%2B01:00",
    "/api/v1/audit?since=0001-01-01T00:00:00%2B01:00",
    "/api/v1/receipts?until=9999-12-31T23:59:59-01:00",
    "/api/v1/integrations?account=acme%00",
]


def test_api_cursors_and_dates_out_of_range_answer_400(app, served):
    make_operator(app, "robot", "viewer")
    headers = {"Authorization": f"Bearer {make_token(app, 'robot')}"}
    for path in BAD_READS:
        response = requests.get(served + path, headers=headers, timeout=10)
        assert response.status_code == 400, (path, response.status_code, response.text)
        body = response.json()
        assert body["error"] == "bad_request" and body["detail"], (path, body)


@pytest.mark.parametrize("page", ["/receipts", "/failures", "/audit"])
def test_dashboard_pages_answer_400_for_a_date_or_cursor_out_of_range(app, page):
    client = logged_in(app, "viewer")
    response = client.get(page + "?since=0001-01-01T00:00:00%2B01:00")
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    assert "between 1970 and 9000" in response.get_data(as_text=True)
    far = _cursor(b'[{"t":"0001-01-01T00:00:00+01:00"},1,"e"]') if page != "/audit" \
        else _cursor(b"[100000000000000000000000000]")
    assert client.get(f"{page}?cursor={far}").status_code == 400


def test_rotating_an_unknown_integration_with_a_wrong_password_is_404(app):
    client = logged_in(app, "security")
    response = post(client, "/credentials/in_0000000000000000000000/rotate",
                    {"password": "wrong", "reason": "leak", "overlap": "0"})
    assert response.status_code == 404


STORED = {  # bodies the intake accepted before it was strict
    "evt_deep": "[" * 979 + "]" * 979,
    "evt_inf": '{"x": 1e400}',
    "evt_dup": '{"a": 1, "a": 2}',
    # Stored before the intake refused lone surrogates: the pages must still render it.
    "evt_surrogate": '{"note": "\\ud800", "\\udfff": 1}',
}


def test_no_stored_payload_breaks_the_receipt_page_or_api(app, served):
    sender = make_sender(app)
    for event_id, payload in STORED.items():
        add_receipt(app, sender.scope_id, event_id, state=2, payload=payload)
    make_operator(app, "pager", "oncall")
    make_operator(app, "watcher", "viewer")
    tokens = {role: make_token(app, name) for role, name in (("oncall", "pager"),
                                                             ("viewer", "watcher"))}
    pages = logged_in(app, "oncall", "pager-page")
    for event_id, payload in STORED.items():
        for role, token in tokens.items():
            response = requests.get(f"{served}/api/v1/receipts/{sender.public_id}/{event_id}",
                                    headers={"Authorization": f"Bearer {token}"}, timeout=10)
            assert response.status_code == 200, (event_id, role, response.text[:200])
            body = strict_json.loads(response.text, 64)  # no Infinity, no duplicate key
            if role == "oncall":
                assert body["payload"] == payload  # shown as the stored text
            else:
                assert "payload" not in body
        page = pages.get(f"/receipts/{sender.public_id}/{event_id}")
        assert page.status_code == 200, (event_id, page.get_data(as_text=True)[:200])
