"""The delivery log: what the intake records, the bound on refusals, retention, and who reads it."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import insert, select

from app import create_app
from jobs.delivery_log import purge_deliveries
from ledger.access import audit
from ledger.access.credentials import revoke_credential, rotate_credential
from ledger.access.integrations import get_integration
from ledger.config import Settings, SettingsError
from ledger.db.schema import deliveries
from ledger.intake.delivery_log import (
    MAX_REASON,
    STARTING_TOKENS,
    TOTAL_REFUSAL_FACTOR,
    Delivery,
    DeliveryLog,
)
from ledger.scheduling.runner import default_jobs
from tests.dashboard_helpers import (
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    make_operator,
    make_token,
)
from tests.helpers import deliver, event_body, make_sender, send_http, signed_headers
from tests.servers import thread_server

ADMIN = audit.Actor(name="test", role="admin")


def _rows(app) -> list[dict]:  # type: ignore[no-untyped-def]
    """Flush the process's buffer and return every delivery log row, oldest first."""
    svc = app.extensions["ledger"]
    svc.delivery_log.flush(everything=True)
    with svc.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(deliveries).order_by(deliveries.c.id))]


def _revoke(app, key_id: str) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        revoke_credential(conn, ADMIN, key_id, reason="leaked in a log", now=svc.clock.now())
    svc.view.invalidate()


def _post(base_url: str, path: str, body: bytes, headers: dict[str, str]):  # type: ignore[no-untyped-def]
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _post_signed(base_url: str, sender, event_id: str, *, body: bytes | None = None,  # type: ignore[no-untyped-def]
                 secret: str | None = None, headers: dict[str, str] | None = None) -> int:
    """POST a delivery signed as the sender would (or with `headers`); return its status."""
    body = body if body is not None else event_body(sender.profile, event_id)
    headers = headers if headers is not None else signed_headers(sender, body, event_id,
                                                                 secret=secret)
    return send_http(base_url, sender, body, headers, content_type=None).status_code


def test_every_outcome_over_http_is_recorded_with_its_key_and_client(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app, max_body_bytes=2000)
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        rotation = rotate_credential(conn, svc.box, ADMIN, get_integration(
            conn, sender.public_id), now=svc.clock.now(), overlap_seconds=0)
    svc.view.invalidate()
    new_secret, old_key = rotation.secret, sender.key_id
    with thread_server(app) as base:
        assert _post_signed(base, sender, "evt_1", secret=new_secret) == 202
        assert _post_signed(base, sender, "evt_1", secret=new_secret) == 202  # duplicate, pending
        other = event_body(sender.profile, "evt_1", data={"amount": 9})
        assert _post_signed(base, sender, "evt_1", body=other, secret=new_secret) == 409
        assert _post_signed(base, sender, "evt_2") == 401  # the old key, expired by the rotation
        forged = signed_headers(sender, b"{}", "evt_3", secret="whsec_not_a_key_of_ours")
        assert _post_signed(base, sender, "evt_3", body=b"{}", headers=forged) == 401
        bad = event_body(sender.profile, "bad id with spaces")
        assert _post_signed(base, sender, "x", body=bad, secret=new_secret) == 400
        big = b'{"pad": "' + b"x" * 5000 + b'"}'
        assert _post_signed(base, sender, "evt_4", body=big, secret=new_secret) == 413
        assert _post(base, "/hooks/in_0000000000000000000000", b"{}", {})[0] == 404

    rows = _rows(app)
    got = [(r["outcome"], r["http_status"], r["key_id"], r["event_id"]) for r in rows]
    assert got == [
        ("accepted", 202, rotation.key_id, "evt_1"),
        ("duplicate", 202, rotation.key_id, "evt_1"),
        ("conflict", 409, rotation.key_id, "evt_1"),
        # Signed by a dead key: the event id is the signer's, kept (CONTRACT section 7).
        ("unauthenticated", 401, old_key, "evt_2"),
        ("unauthenticated", 401, None, None),
        ("invalid_event", 400, rotation.key_id, None),
        ("body_too_large", 413, None, None),
        ("unknown_integration", 404, None, None),
    ]
    assert {r["client"] for r in rows} == {"127.0.0.1"}
    assert [r["reason"] for r in rows[3:5]] == ["expired_key", "bad_signature"]
    assert "event id must match" in rows[5]["reason"]
    assert rows[6]["reason"] == "body over 2000 bytes"
    assert [r["integration_id"] for r in rows] == [sender.scope_id] * 7 + [None]
    assert rows[7]["public_id"] == "in_0000000000000000000000"
    # Never a body, a signature or a secret.
    stored = json.dumps(rows, default=str)
    for secret_text in (new_secret, sender.secret, '"amount"', "x" * 100):
        assert secret_text not in stored
    for value in forged.values():
        if len(value) > 20:
            assert value not in stored


def test_client_address_comes_through_the_trusted_proxy(test_env) -> None:  # type: ignore[no-untyped-def]
    app = create_app({**test_env, "LEDGER_TRUSTED_PROXIES": "1"})
    try:
        sender = make_sender(app)
        body = event_body(sender.profile, "evt_p")
        headers = {**signed_headers(sender, body, "evt_p"), "X-Forwarded-For": "203.0.113.7"}
        assert app.test_client().post(f"/hooks/{sender.public_id}", data=body,
                                      headers=headers).status_code == 202
        assert [r["client"] for r in _rows(app)] == ["203.0.113.7"]
    finally:
        app.extensions["ledger"].close()


def test_a_forged_flood_grows_the_log_only_within_its_bound(test_env) -> None:  # type: ignore[no-untyped-def]
    app = create_app({**test_env, "LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE": "10"})
    try:
        sender = make_sender(app)
        client = app.test_client()
        forged_body = event_body(sender.profile, "evt_f")
        for n in range(300):
            forged = signed_headers(sender, forged_body, "evt_f", secret=f"whsec_forged{n}")
            assert client.post(f"/hooks/{sender.public_id}", data=forged_body,
                               headers=forged).status_code == 401
        for n in range(15):  # genuine deliveries during the flood keep exact rows
            assert deliver(client, sender, f"evt_ok_{n}").status_code == 202
        rows = _rows(app)
    finally:
        app.extensions["ledger"].close()
    refused = [r for r in rows if r["outcome"] == "unauthenticated"]
    # A counted row keeps no latency: it stands for many requests (possibly just one).
    exact = [r for r in refused if r["latency_us"] is not None]
    counted = [r for r in refused if r["latency_us"] is None]
    assert all(r["count"] == 1 for r in exact)
    # A new bucket holds 5 and refills at 10 a minute: a few seconds add at most a couple.
    assert 5 <= len(exact) <= 8
    # One row counts the rest of each minute: a flood that straddles a minute's end has two.
    assert 1 <= len(counted) <= 2
    minutes = {r["at"].replace(second=0, microsecond=0) for r in counted}
    assert len(minutes) == len(counted)
    assert sum(r["count"] for r in refused) == 300
    assert {r["reason"] for r in counted} == {"bad_signature"}
    assert len([r for r in rows if r["outcome"] == "accepted" and r["count"] == 1]) == 15


def test_a_dead_key_keeps_its_own_rows_during_a_forged_flood(test_env) -> None:  # type: ignore[no-untyped-def]
    app = create_app({**test_env, "LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE": "5"})
    try:
        sender = make_sender(app)
        client = app.test_client()
        body = event_body(sender.profile, "evt_f")
        for n in range(50):
            forged = signed_headers(sender, body, "evt_f", secret=f"whsec_forged{n}")
            client.post(f"/hooks/{sender.public_id}", data=body, headers=forged)
        _revoke(app, sender.key_id)
        for n in range(3):
            assert deliver(client, sender, f"evt_leak_{n}").status_code == 401
        rows = _rows(app)
    finally:
        app.extensions["ledger"].close()
    leaked = [r for r in rows if r["key_id"] == sender.key_id]
    assert [(r["reason"], r["count"]) for r in leaked] == [("revoked_key", 1)] * 3


def test_the_log_can_be_turned_off_and_the_switch_is_strict(test_env) -> None:  # type: ignore[no-untyped-def]
    app = create_app({**test_env, "LEDGER_DELIVERY_LOG": "off"})
    try:
        sender = make_sender(app)
        assert deliver(app.test_client(), sender, "evt_off").status_code == 202
        assert _rows(app) == []
    finally:
        app.extensions["ledger"].close()
    with pytest.raises(SettingsError, match="LEDGER_DELIVERY_LOG"):
        Settings.from_env({"LEDGER_DELIVERY_LOG": "maybe"})
    with pytest.raises(SettingsError, match="LEDGER_DELIVERY_LOG_SECONDS"):
        Settings.from_env({"LEDGER_DELIVERY_LOG_SECONDS": "14d"})
    assert Settings.from_env({}).delivery_log_seconds == 14 * 86400


def test_retention_purges_old_rows_only(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    old = [{"at": now - timedelta(days=20, seconds=n), "integration_id": 1, "public_id": None,
            "outcome": "unauthenticated", "http_status": 401, "key_id": None,
            "event_id": None, "client": "198.51.100.1", "reason": "bad_signature", "count": 1}
           for n in range(25)]
    fresh = dict(old[0], at=now - timedelta(days=1))
    with svc.engine.begin() as conn:
        conn.execute(insert(deliveries), [*old, fresh])
    assert purge_deliveries(svc.engine, svc.settings, svc.clock, batch_size=10) == 25
    with svc.engine.connect() as conn:
        left = conn.execute(select(deliveries.c.at)).scalars().all()
    assert left == [fresh["at"]]
    short = svc.settings.with_(delivery_log_seconds=3600)
    assert purge_deliveries(svc.engine, short, svc.clock) == 1
    assert "delivery_log_retention" in {j.name for j in default_jobs(svc.settings)}


def test_api_lists_deliveries_and_shows_reasons_to_security_only(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    client = app.test_client()
    deliver(client, sender, "evt_a")
    _revoke(app, sender.key_id)
    deliver(client, sender, "evt_b")
    app.extensions["ledger"].delivery_log.flush(everything=True)
    make_operator(app, "viewer-bot", "viewer")
    make_operator(app, "sec-bot", "security")

    def get(user: str, query: str = "", status: int = 200):  # type: ignore[no-untyped-def]
        token = make_token(app, user)
        response = client.get(f"/api/v1/deliveries{query}",
                              headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == status, response.get_data(as_text=True)
        return response.get_json()

    seen = get("viewer-bot")
    assert [(i["outcome"], i["key_id"], i["reason"]) for i in seen["items"]] == [
        ("unauthenticated", sender.key_id, None), ("accepted", sender.key_id, None)]
    assert seen["items"][0]["scope"] == "acme/stripe-prod"
    assert seen["items"][0]["integration"] == sender.public_id
    assert set(seen["items"][0]) == {"at", "integration", "scope", "outcome", "http_status",
                                     "key_id", "event_id", "client", "reason", "count"}
    assert get("sec-bot")["items"][0]["reason"] == "revoked_key"
    assert [i["event_id"] for i in get("sec-bot", "?outcome=accepted")["items"]] == ["evt_a"]
    assert len(get("sec-bot", f"?key_id={sender.key_id}&integration=acme/stripe-prod")
               ["items"]) == 2
    first = get("sec-bot", "?limit=1")
    assert first["next_cursor"] and len(first["items"]) == 1
    second = get("sec-bot", f"?limit=1&cursor={first['next_cursor']}")
    assert second["items"][0]["outcome"] == "accepted" and second["next_cursor"] is None
    assert get("sec-bot", "?outcome=nope", 400)["error"] == "bad_request"
    assert get("sec-bot", "?key_id=key_x", 400)["error"] == "bad_request"
    assert get("sec-bot", "?cursor=garbage", 400)["error"] == "bad_request"
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert get("sec-bot", f"?since={future.replace('+', '%2B')}")["items"] == []

    creds = client.get(f"/api/v1/integrations/{sender.public_id}/credentials",
                       headers={"Authorization": f"Bearer {make_token(app, 'viewer-bot')}"})
    (cred,) = creds.get_json()["credentials"]
    assert cred["last_used_at"] is not None
    assert (cred["uses_24h"], cred["uses_after_dead"]) == (2, 1)


def test_deliveries_page_per_role(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    _revoke(app, sender.key_id)
    deliver(app.test_client(), sender, "evt_leak")
    app.extensions["ledger"].delivery_log.flush(everything=True)
    viewer = logged_in(app, "viewer")
    page = viewer.get("/deliveries").get_data(as_text=True)
    assert sender.key_id in page and "unauthenticated" in page
    assert "revoked_key" not in page and "<th>Reason</th>" not in page
    security = logged_in(app, "security")
    page = security.get(f"/deliveries?key_id={sender.key_id}").get_data(as_text=True)
    assert "revoked_key" in page and "<th>Reason</th>" in page
    fragment = security.get("/deliveries?outcome=accepted", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert "No deliveries match." in fragment.get_data(as_text=True)
    assert "<html" not in fragment.get_data(as_text=True)
    bad = security.get("/deliveries?since=yesterday")
    assert bad.status_code == 400 and "since" in bad.get_data(as_text=True)


def test_credentials_page_shows_use_after_revocation(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    client = app.test_client()
    deliver(client, sender, "evt_before")
    _revoke(app, sender.key_id)
    for n in range(2):
        deliver(client, sender, f"evt_after_{n}")
    app.extensions["ledger"].delivery_log.flush(everything=True)
    page = logged_in(app, "viewer").get(f"/credentials/{sender.public_id}").get_data(
        as_text=True)
    assert "Uses after revocation or expiry" in page
    assert '<strong class="bad-use">2</strong>' in page
    assert f"/deliveries?key_id={sender.key_id}" in page


def test_receipt_page_lists_every_delivery_of_its_event(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    client = app.test_client()
    for _ in range(3):
        deliver(client, sender, "evt_twice")
    deliver(client, sender, "evt_other")
    app.extensions["ledger"].delivery_log.flush(everything=True)
    page = logged_in(app, "viewer").get(f"/receipts/{sender.public_id}/evt_twice")
    html = page.get_data(as_text=True)
    section = html.split("Deliveries of this event")[1].split("<h2>")[0]
    assert section.count('class="delivery-accepted"') == 1
    assert section.count('class="delivery-duplicate"') == 2
    assert "evt_other" not in section
    make_operator(app, "api-viewer", "viewer")
    token = make_token(app, "api-viewer")
    detail = client.get(f"/api/v1/receipts/{sender.public_id}/evt_twice",
                        headers={"Authorization": f"Bearer {token}"}).get_json()
    assert [d["outcome"] for d in detail["deliveries"]] == ["accepted", "duplicate",
                                                            "duplicate"]


def test_credential_use_counts_stop_at_their_cap_and_say_so(app, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ledger.reads.deliveries

    monkeypatch.setattr(ledger.reads.deliveries, "USAGE_CAP_ROWS", 3)
    sender = make_sender(app)
    client = app.test_client()
    for n in range(6):
        deliver(client, sender, f"evt_busy_{n}")
    app.extensions["ledger"].delivery_log.flush(everything=True)
    make_operator(app, "cap-viewer", "viewer")
    creds = client.get(f"/api/v1/integrations/{sender.public_id}/credentials",
                       headers={"Authorization": f"Bearer {make_token(app, 'cap-viewer')}"})
    (cred,) = creds.get_json()["credentials"]
    assert cred["uses_capped"] is True
    assert 3 <= cred["uses_24h"] < 6
    page = logged_in(app, "viewer").get(f"/credentials/{sender.public_id}").get_data(
        as_text=True)
    assert f'{cred["uses_24h"]}+</td>' in page


def test_counted_refusals_are_one_row_per_minute_whatever_their_latencies(test_env) -> None:  # type: ignore[no-untyped-def]
    """Each request's latency differs; the refusals over the rate still share one count row."""
    app = create_app({**test_env, "LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE": "1"})
    try:
        sender = make_sender(app)
        client = app.test_client()
        body = event_body(sender.profile, "evt_f")
        for n in range(40):
            forged = signed_headers(sender, body, "evt_f", secret=f"whsec_forged{n}")
            assert client.post(f"/hooks/{sender.public_id}", data=body,
                               headers=forged).status_code == 401
        rows = _rows(app)
    finally:
        app.extensions["ledger"].close()
    exact = [r for r in rows if r["count"] == 1]
    counted = [r for r in rows if r["count"] > 1]
    assert exact and all(r["latency_us"] is not None for r in exact)
    assert len(counted) in (1, 2)  # one per minute the flood touched
    assert all(r["latency_us"] is None for r in counted)
    assert sum(r["count"] for r in rows) == 40


def _dropped() -> float:
    return REGISTRY.get_sample_value("ledger_delivery_log_rows_total", {"kind": "dropped"}) or 0.0


def test_a_flush_writes_each_row_exactly_as_recorded(test_env) -> None:  # type: ignore[no-untyped-def]
    """Every column survives the flush (COPY on PostgreSQL, INSERT on SQLite), NULLs and UTC."""
    app = create_app(test_env)
    svc = app.extensions["ledger"]
    try:
        log = DeliveryLog(svc.engine, svc.clock, enabled=True,
                          refusals_per_minute=STARTING_TOKENS,
                          flush_seconds=3600)
        at = svc.clock.now().replace(microsecond=123456)
        east = timezone(timedelta(hours=5, minutes=30))
        full = Delivery(at=at.astimezone(east), integration_id=7, public_id="in_full",
                        outcome="conflict", http_status=409, key_id="key_1",
                        event_id="evt_\t\\N\n'quoted'", client="203.0.113.9",
                        reason="r" * (MAX_REASON + 50), authenticated=True, latency_us=812)
        bare = Delivery(at=at, integration_id=None, public_id=None, outcome="unknown_path",
                        http_status=404)
        log.record(full)
        for _ in range(STARTING_TOKENS + 3):  # one bucket: the first rows exact, then counted
            log.record(bare)
        assert log.flush(everything=True) == 1 + STARTING_TOKENS + 1
        with svc.engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(
                select(deliveries).order_by(deliveries.c.id))]
    finally:
        log.close()
        svc.close()
    for row in rows:
        del row["id"]
    assert rows[0] == {"at": at, "integration_id": 7, "public_id": "in_full",
                       "outcome": "conflict", "http_status": 409, "key_id": "key_1",
                       "event_id": "evt_\t\\N\n'quoted'", "client": "203.0.113.9",
                       "reason": "r" * MAX_REASON, "count": 1, "latency_us": 812}
    bare_row = {"at": at, "integration_id": None, "public_id": None,
                "outcome": "unknown_path", "http_status": 404, "key_id": None,
                "event_id": None, "client": None, "reason": None, "count": 1,
                "latency_us": None}
    assert rows[1:-1] == [bare_row] * STARTING_TOKENS
    assert rows[-1] == {**bare_row, "count": 3}  # the newest one's time


def test_a_refused_flush_drops_only_its_rows_and_the_next_one_writes(test_env) -> None:  # type: ignore[no-untyped-def]
    """A flush the database refuses is counted as dropped; its connection is fit for the next."""
    app = create_app(test_env)
    svc = app.extensions["ledger"]
    try:
        log = DeliveryLog(svc.engine, svc.clock, enabled=True, refusals_per_minute=60,
                          flush_seconds=3600)
        now = svc.clock.now()
        good = Delivery(at=now, integration_id=1, public_id="in_a", outcome="accepted",
                        http_status=202, authenticated=True)
        log.record(good)
        # why: outcome is NOT NULL; a row the database refuses fails the whole batch.
        log.record(replace(good, outcome=None))  # type: ignore[arg-type]
        before = _dropped()
        assert log.flush() == 0
        assert _dropped() - before == 2
        pooled = getattr(svc.engine.pool, "size", lambda: 1)()
        for _ in range(pooled + 1):  # every pooled connection, the refused flush's among them
            log.record(replace(good, event_id="evt_after"))
            assert log.flush() == 1
        with svc.engine.connect() as conn:
            events = list(conn.execute(select(deliveries.c.event_id)).scalars())
    finally:
        log.close()
        svc.close()
    assert events and set(events) == {"evt_after"}


def test_a_flood_over_many_integration_ids_shares_one_bound(test_env) -> None:  # type: ignore[no-untyped-def]
    """Every public id had its own bucket: a flood over 33 of them wrote 33 times the rows."""
    per_minute = 10
    app = create_app({**test_env, "LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE": str(per_minute)})
    try:
        senders = [make_sender(app, name=f"tenant-{n}") for n in range(8)]
        body = event_body(senders[0].profile, "evt_f")
        with thread_server(app) as base_url:
            started = time.monotonic()
            for n in range(240):
                sender = senders[n % len(senders)]
                forged = signed_headers(sender, body, "evt_f", secret=f"whsec_forged{n}")
                assert _post(base_url, f"/hooks/{sender.public_id}", body, forged)[0] == 401
            for n in range(20):  # unknown ids as well
                assert _post(base_url, f"/hooks/in_{n:022d}", body, {})[0] == 404
            elapsed = time.monotonic() - started
        rows = _rows(app)
    finally:
        app.extensions["ledger"].close()
    refused = [r for r in rows if r["outcome"] in ("unauthenticated", "unknown_integration")]
    exact = [r for r in refused if r["count"] == 1]
    assert sum(r["count"] for r in refused) == 260  # every refusal is counted...
    # ...but exact rows share one bucket: 5 to start, refilling 2 x 10 a minute while the
    # flood lasts (a bucket per id would have let 8 x 5 through at once).
    refilled = int(TOTAL_REFUSAL_FACTOR * per_minute * elapsed / 60)
    assert len(exact) <= STARTING_TOKENS + refilled
    assert len(refused) - len(exact) <= 2 * (len(senders) + 1)  # a count row per id and minute
