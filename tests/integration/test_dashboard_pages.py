"""Dashboard pages: what each role sees, htmx fragments, filters, keyset paging, escaping."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert

from jobs.rollup_series import retotal
from ledger.db.schema import findings, hourly_series, instances, scheduler_runs, scope_counts
from tests.dashboard_helpers import (
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
)
from tests.helpers import deliver, make_sender

XSS = "<script>alert(1)</script>"


def _text(response) -> str:  # type: ignore[no-untyped-def]
    """Return the body as text."""
    return response.get_data(as_text=True)


def _seed_rollups(app, scope_id: int) -> None:  # type: ignore[no-untyped-def]
    """Write what the scheduled jobs would: rollups, an instance, a run, a finding."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        conn.execute(insert(scope_counts).values(scope_id=scope_id, state=1, count=41,
                                                 refreshed_at=now))
        conn.execute(insert(scope_counts).values(scope_id=scope_id, state=2, count=3,
                                                 refreshed_at=now))
        for hour in range(3):
            conn.execute(insert(hourly_series).values(
                scope_id=scope_id, hour=now.replace(minute=0, second=0, microsecond=0)
                - timedelta(hours=hour), accepted=10 + hour, failed=hour, settled=10 + hour,
                refreshed_at=now))
        retotal(conn, [now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=h)
                       for h in range(3)])
        conn.execute(insert(instances).values(
            id="web-1", kind="web", hostname="host-a", pid=4242, started_at=now,
            heartbeat_at=now, credentials_refreshed_at=now - timedelta(seconds=12)))
        conn.execute(insert(scheduler_runs).values(
            job="rollups", period_start=now, instance="sched-1", started_at=now,
            finished_at=now, outcome="ok", rows_affected=44))
        conn.execute(insert(findings).values(
            kind="stuck_pending", subject="acme/stripe-prod:evt_old", detail="pending 2 h",
            first_seen=now, last_seen=now))


def test_overview_shows_rollups_instances_runs_and_a_chart(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    client = logged_in(app, "viewer")
    assert "not computed yet" in _text(client.get("/"))
    _seed_rollups(app, sender.scope_id)
    page = _text(client.get("/"))
    assert "acme/stripe-prod" in page and ">41<" in page
    assert "host-a:4242" in page and "rollups" in page
    assert "<svg" in page and "<polyline" in page
    # Polls every 10 s; ledger.js pauses [data-poll] while the tab is hidden.
    assert 'data-poll hx-trigger="every 10s"' in page


def test_htmx_gets_the_fragment_and_every_answer_varies_on_it(app) -> None:  # type: ignore[no-untyped-def]
    make_sender(app)
    client = logged_in(app, "viewer")
    full = client.get("/receipts")
    fragment = client.get("/receipts", headers={"HX-Request": "true"})
    assert "<html" in _text(full) and "<html" not in _text(fragment)
    assert 'id="receipts"' in _text(fragment)
    for response in (full, fragment):
        assert "HX-Request" in response.headers["Vary"]


def test_receipts_filter_by_state_type_time_and_prefix(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    now = app.extensions["ledger"].clock.now()
    add_receipt(app, sender.scope_id, "ord_1", state=1, event_type="order.paid",
                accepted_at=now - timedelta(hours=5))
    add_receipt(app, sender.scope_id, "ord_2", state=2, event_type="order.paid",
                accepted_at=now - timedelta(hours=1))
    add_receipt(app, sender.scope_id, "inv_1", state=0, event_type="invoice.sent",
                accepted_at=now - timedelta(minutes=5))
    client = logged_in(app, "viewer")

    def ids(query: str) -> set[str]:
        items = client.get(f"/api/v1/receipts?{query}").get_json()["items"]
        page = _text(client.get(f"/receipts?{query}", headers={"HX-Request": "true"}))
        for item in items:
            assert item["event_id"] in page
        return {i["event_id"] for i in items}

    assert ids("") == {"ord_1", "ord_2", "inv_1"}
    assert ids("state=failed") == {"ord_2"}
    assert ids("state=pending") == {"inv_1"}
    assert ids("state=complete") == {"ord_1"}
    assert ids("event_type=order.paid") == {"ord_1", "ord_2"}
    assert ids("prefix=ord_") == {"ord_1", "ord_2"}
    assert ids(f"prefix=ord&scope={sender.scope}") == {"ord_1", "ord_2"}
    since = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S")
    assert ids(f"since={since}") == {"ord_2", "inv_1"}
    assert ids(f"until={since}") == {"ord_1"}
    assert client.get("/receipts?scope=nobody/nothing").status_code == 400
    assert client.get("/api/v1/receipts?state=lost").status_code == 400
    assert client.get("/api/v1/receipts?cursor=garbage").status_code == 400


def test_keyset_pages_cover_every_receipt_once_in_each_strategy(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    other = make_sender(app, account="globex")
    now = app.extensions["ledger"].clock.now()
    expected = set()
    for i in range(9):
        # Days apart: the time windows must widen to reach the older ones.
        at = now - timedelta(days=i, seconds=i % 2)
        for s in (sender, other):
            add_receipt(app, s.scope_id, f"evt_{i:02d}", state=2 if i % 3 == 0 else 1,
                        accepted_at=at)
            expected.add((s.scope, f"evt_{i:02d}"))
    client = logged_in(app, "viewer")
    for query, want in (("", expected), ("prefix=evt_", expected),
                        ("state=failed", {e for e in expected if int(e[1][-2:]) % 3 == 0}),
                        (f"scope={other.scope}", {e for e in expected if e[0] == other.scope})):
        seen: list[tuple[str, str]] = []
        cursor = ""
        while True:
            body = client.get(f"/api/v1/receipts?limit=4&{query}{cursor}").get_json()
            seen += [(i["scope"], i["event_id"]) for i in body["items"]]
            if not body["next_cursor"]:
                break
            cursor = f"&cursor={body['next_cursor']}"
        assert len(seen) == len(set(seen)) and set(seen) == want, query


def test_receipt_detail_shows_timeline_conflicts_and_payload_only_to_oncall(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2, error="ValueError: bad amount",
                payload='{"data":{"amount":7}}')
    add_conflict(app, sender.scope_id, "evt_f")
    path = f"/receipts/{sender.public_id}/evt_f"
    viewer = _text(logged_in(app, "viewer").get(path))
    assert "attempt 1" in viewer and "ValueError: bad amount" in viewer
    assert "0101010101010101" in viewer  # the stored digest
    assert "Payloads are shown to oncall" in viewer and '"amount": 7' not in viewer
    oncall = _text(logged_in(app, "oncall").get(path))
    assert '&#34;amount&#34;: 7' in oncall or '"amount": 7' in oncall
    missing = logged_in(app, "viewer", "v2").get(f"/receipts/{sender.public_id}/nope")
    assert missing.status_code == 404 and "Not found" in _text(missing)


def test_stuck_page_lists_old_pending_and_overdue_jobs(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    now = app.extensions["ledger"].clock.now()
    add_receipt(app, sender.scope_id, "evt_old", state=0, accepted_at=now - timedelta(hours=2))
    add_receipt(app, sender.scope_id, "evt_new", state=0, accepted_at=now)
    _seed_rollups(app, sender.scope_id)
    client = logged_in(app, "viewer")
    page = _text(client.get("/stuck"))  # no worker is alive: all due work is stuck, said why
    assert "evt_old" in page and "evt_new" in page and "no live worker" in page
    assert "stuck_pending" in page and "No worker is alive" in page
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(insert(instances).values(
            id="h:1:w", kind="worker", hostname="h", pid=1, started_at=now, heartbeat_at=now))
    page = _text(client.get("/stuck"))
    assert "evt_old" in page and "due, unclaimed" in page and "no live worker" not in page
    assert page.count("evt_new") == 0


def test_every_page_renders_for_every_role(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    deliver(app.test_client(), sender, "evt_1")
    add_receipt(app, sender.scope_id, "evt_f", state=2)
    add_conflict(app, sender.scope_id, "evt_1")
    pages = ["/", "/receipts", "/stuck", "/failures", "/conflicts", "/credentials",
             f"/credentials/{sender.public_id}", "/audit", "/audit/verify", "/capacity"]
    for role in ("viewer", "oncall", "security", "admin"):
        client = logged_in(app, role)
        for path in pages:
            assert client.get(path).status_code == 200, (role, path)
        failures = _text(client.get("/failures"))
        assert ("Requeue all matching" in failures) == (role != "viewer")
        creds = _text(client.get(f"/credentials/{sender.public_id}"))
        assert ("Rotate" in creds) == (role in ("security", "admin"))
        conflicts = _text(client.get("/conflicts"))
        assert ("Acknowledge" in conflicts) == (role != "viewer")
        assert (client.get("/operators").status_code == 200) == (role == "admin")


def test_capacity_of_an_empty_ledger_says_there_is_nothing_to_measure(app) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(app, "viewer")
    page = client.get("/capacity")
    assert page.status_code == 200 and "not measurable yet" in _text(page)
    figures = client.get("/api/v1/capacity")
    assert figures.status_code == 200
    assert figures.get_json()["receipts"] == 0
    assert figures.get_json()["bytes_per_receipt_measured"] is None


def test_everything_a_sender_controls_is_escaped(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    event_id = f"x{XSS}"
    add_receipt(app, sender.scope_id, event_id, state=2, event_type=f"t{XSS}",
                error=f"boom {XSS}", payload=f'{{"note": "{XSS}"}}')
    add_conflict(app, sender.scope_id, event_id)
    add_receipt(app, sender.scope_id, f"p{XSS}", state=0, event_type=f"t{XSS}",
                accepted_at=app.extensions["ledger"].clock.now() - timedelta(hours=2))
    client = logged_in(app, "oncall")
    from urllib.parse import quote

    paths = ["/receipts", "/failures", "/conflicts", "/stuck",
             f"/receipts/{sender.public_id}/{quote(event_id, safe='')}"]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, path
        body = _text(response)
        assert XSS not in body, path
        assert "&lt;script&gt;" in body, path
    detail = _text(client.get(paths[-1]))
    assert "boom &lt;script&gt;" in detail and "t&lt;script&gt;" in detail
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail.split('class="payload"')[1]
