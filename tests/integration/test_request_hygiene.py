"""Full-string id checks, one sanitised request id per request, bounded reasons, log lines
that print and name no event, and /metrics only for the monitoring path."""

from __future__ import annotations

import json
import logging
import re

import pytest
import requests
from sqlalchemy import func, select

from ledger.db.schema import audit_log, integrations, operators
from tests.dashboard_helpers import (
    add_conflict,
    add_receipt,
    csrf_token,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    make_operator,
    make_token,
)
from tests.helpers import make_sender
from tests.servers import gunicorn_server

FRESH_ID = re.compile(r"[0-9a-f]{32}")


def _count(app, table) -> int:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


@pytest.mark.parametrize("args", [
    ["integration", "create", "--account", "acme\n", "--name", "n", "--profile", "stripe"],
    ["integration", "create", "--account", "acme", "--name", "n\n", "--profile", "stripe"],
    ["operator", "create", "--username", "bob\n", "--role", "viewer"],
])
def test_a_trailing_newline_is_not_part_of_a_valid_name(app, runner, args):
    before = (_count(app, integrations), _count(app, operators))
    result = runner.invoke(args=["ledger", *args], input="a-long-enough-password-1\n")
    assert result.exit_code == 1, result.output
    assert (_count(app, integrations), _count(app, operators)) == before


def test_the_api_echoes_the_sanitised_request_id_not_the_raw_one(app, test_env):
    make_operator(app, "robot", "viewer")
    headers = {"Authorization": f"Bearer {make_token(app, 'robot')}"}
    with gunicorn_server(test_env, workers=2) as (base_url, _process):
        raw = requests.get(f"{base_url}/api/v1/me", timeout=10,
                           headers={**headers, "X-Request-Id": "not sane; <b>injected</b>"})
        sane = requests.get(f"{base_url}/api/v1/me", timeout=10,
                            headers={**headers, "X-Request-Id": "req-42.a"})
    assert raw.status_code == 200 and FRESH_ID.fullmatch(raw.headers["X-Request-Id"])
    assert sane.headers["X-Request-Id"] == "req-42.a"


@pytest.mark.parametrize("given", ["not sane; <b>injected</b>", "req-7"])
def test_the_audit_row_keeps_the_request_id_the_caller_was_given(app, given):
    sender = make_sender(app)
    conflict = add_conflict(app, sender.scope_id, "evt_1")
    client = logged_in(app, "oncall")
    response = client.post(f"/conflicts/{conflict}/ack", headers={"X-Request-Id": given},
                           data={"note": "checked", "csrf_token": csrf_token(client, "/")})
    assert response.status_code == 200
    with app.extensions["ledger"].engine.connect() as conn:
        stored = conn.execute(select(audit_log.c.request_id)
                              .where(audit_log.c.action == "conflict.acknowledge")).scalar_one()
    assert stored == response.headers["X-Request-Id"]
    assert (stored == given) is (given == "req-7")


def test_a_reason_over_500_characters_is_refused_with_400_and_nothing_written(app):
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2)
    conflict = add_conflict(app, sender.scope_id, "evt_c")
    client = logged_in(app, "oncall")
    before = _count(app, audit_log)
    for path, field in (("/failures/requeue", "reason"), (f"/conflicts/{conflict}/ack", "note")):
        response = client.post(path, data={"scope": sender.scope, "event_id": "evt_f",
                                           field: "x" * 501,
                                           "csrf_token": csrf_token(client, "/")})
        assert response.status_code == 400, (path, response.status_code)
        assert "at most 500 characters" in response.get_data(as_text=True)
    assert _count(app, audit_log) == before
    ok = client.post("/failures/requeue", data={"scope": sender.scope, "event_id": "evt_f",
                                                "reason": "x" * 500,
                                                "csrf_token": csrf_token(client, "/")})
    assert ok.status_code == 200 and _count(app, audit_log) == before + 1


def test_the_cli_refuses_an_overlong_reason(app, runner):
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2)
    before = _count(app, audit_log)
    result = runner.invoke(args=["ledger", "receipt", "requeue", "--scope", sender.scope,
                                 "--event-id", "evt_f", "--reason", "y" * 450_000, "--json"])
    assert result.exit_code == 1 and "at most 500" in json.loads(result.stdout)["detail"]
    assert _count(app, audit_log) == before


def test_an_unexpected_error_logs_the_route_not_the_path(app, monkeypatch, caplog):
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_private_42", state=2)
    client = logged_in(app, "viewer")

    def broken(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr("ledger.web.dashboard.pages.read_receipt", broken)
    with caplog.at_level(logging.ERROR, logger="ledger"):
        response = client.get(f"/receipts/{sender.public_id}/evt_private_42")
    assert response.status_code == 500
    failed = [r.getMessage() for r in caplog.records if "request.failed" in r.getMessage()]
    assert failed and "/receipts/<public_id>/<path:event_id>" in failed[0]
    assert "evt_private_42" not in caplog.text


def test_gunicorn_prints_its_own_log_lines(test_env, tmp_path):
    log = tmp_path / "gunicorn.log"
    with gunicorn_server(test_env, workers=2, extra_args=("--log-level", "info"),
                         log_path=log) as (base_url, _process):
        assert requests.get(f"{base_url}/healthz", timeout=10).status_code == 200
    text = log.read_text()
    assert "Booting worker with pid" in text
    assert "Logging error" not in text


def test_metrics_need_the_token_when_one_is_set(test_env):
    env = {**test_env, "LEDGER_METRICS_TOKEN": "scrape-me-0123456789"}
    with gunicorn_server(env, workers=2) as (base_url, _process):
        def scrape(**headers: str) -> requests.Response:
            return requests.get(f"{base_url}/metrics", headers=headers, timeout=10)

        assert scrape().status_code == 401
        assert scrape(Authorization="Bearer wrong").status_code == 401
        good = [scrape(Authorization="Bearer scrape-me-0123456789") for _ in range(4)]
    assert [r.status_code for r in good] == [200] * 4, [(r.status_code, r.text[:300]) for r in good]
    assert "# TYPE ledger_intake_seconds histogram" in good[0].text


def test_without_a_token_metrics_answer_only_a_direct_loopback_client(app, test_env):
    with gunicorn_server(test_env, workers=2) as (base_url, _process):
        direct = requests.get(f"{base_url}/metrics", timeout=10)
        proxied = requests.get(f"{base_url}/metrics", timeout=10,
                               headers={"X-Forwarded-For": "203.0.113.9"})
    assert direct.status_code == 200 and "ledger_" in direct.text
    assert proxied.status_code == 403 and proxied.json()["error"] == "forbidden"
    remote = app.test_client().get("/metrics", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert remote.status_code == 403
