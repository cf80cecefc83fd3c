"""Evidence and forced runs: kept conflict bodies and their diff, truthful labels, retry now,
run again. Both databases, each role."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from app import create_app
from ledger.clock import FixedClock
from ledger.db.schema import attempts, audit_log, conflicts, jobs
from ledger.demo.seed import balance
from ledger.intake.store import CONFLICT_BODY_LIMIT
from ledger.reads.evidence import json_diff
from ledger.reads.receipts import get_receipt
from ledger.worker.loop import process_one
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    post,
)
from tests.helpers import event_body, make_sender, send


class HalfRandom:
    """An RNG that always answers 0.5 (backoffs are half their cap)."""

    def random(self) -> float:
        """Return 0.5."""
        return 0.5


@pytest.fixture
def app(test_env):  # type: ignore[no-untyped-def]
    """The app on a clock the test moves, retries 100 s apart."""
    application = create_app({**test_env, "LEDGER_RETRY_BASE_SECONDS": "100"},
                             clock=FixedClock(datetime.now(UTC)))
    yield application
    application.extensions["ledger"].close()


def _clock(app):  # type: ignore[no-untyped-def]
    return app.extensions["ledger"].clock


def _drain(app) -> int:  # type: ignore[no-untyped-def]
    svc, count = app.extensions["ledger"], 0
    while process_one(svc, "w-test", rng=HalfRandom()):
        count += 1
    return count


def _conflict(app):  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(conflicts)).one()


def _audit(app, action):  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(audit_log).where(audit_log.c.action == action)).all()


def test_json_diff_names_added_removed_and_changed_paths() -> None:
    old = {"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "gone": True, "odd key": 1}
    new = {"a": 1, "b": {"c": [1, 5], "d": "x"}, "new": None, "odd key": "1"}
    changes = [(c.op, c.path, c.old, c.new) for c in json_diff(old, new)]
    assert changes == [
        ("changed", "$.b.c[1]", "2", "5"),
        ("removed", "$.b.c[2]", "3", None),
        ("removed", "$.gone", "true", None),
        ("added", "$.new", None, "null"),
        ("changed", '$["odd key"]', "1", '"1"'),
    ]
    assert json_diff({"x": [1]}, {"x": [1]}) == []
    assert [c.op for c in json_diff(1, 1.0)] == ["changed"]  # int and float differ


def test_conflict_keeps_its_body_and_shows_the_diff_to_oncall_only(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    assert send(app, sender, "evt_c", "demo.fail", {"amount": 5}).status_code == 202
    _drain(app)  # demo.fail: the job is retrying and keeps its payload
    answer = send(app, sender, "evt_c", "demo.fail", {"amount": 500, "note": "edited"})
    assert answer.status_code == 409
    row = _conflict(app)
    assert json.loads(row.incoming_body)["data"] == {"amount": 500, "note": "edited"}
    assert row.incoming_size == len(row.incoming_body.encode())

    oncall = logged_in(app, "oncall").get(f"/conflicts/{row.id}").get_data(as_text=True)
    assert 'id="diff"' in oncall
    assert "$.data.amount" in oncall and "500" in oncall
    assert "$.data.note" in oncall and "added" in oncall
    viewer = logged_in(app, "viewer")
    page = viewer.get(f"/conflicts/{row.id}").get_data(as_text=True)
    assert 'id="diff"' not in page and "edited" not in page
    assert "shown to oncall and above" in page
    listing = viewer.get("/conflicts").get_data(as_text=True)
    assert "(incoming body kept)" in listing and "edited" not in listing
    api = viewer.get("/api/v1/conflicts").get_json()["items"][0]
    assert api["body_kept"] is True and "incoming_body" not in api


def test_diff_is_gone_once_the_original_payload_is_gone(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    send(app, sender, "evt_ok", data={"amount": 5})
    _drain(app)  # completed: the payload left the ledger
    assert send(app, sender, "evt_ok", data={"amount": 6}).status_code == 409
    page = logged_in(app, "oncall").get(f"/conflicts/{_conflict(app).id}")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and 'id="diff"' not in html
    assert "original payload is no longer retained" in html
    assert logged_in(app, "viewer", "v2").get("/conflicts/999999").status_code == 404


def test_an_oversized_conflicting_body_keeps_only_its_size(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    send(app, sender, "evt_big", data={"amount": 1})
    big = event_body("stripe", "evt_big", data={"amount": 1, "pad": "x" * CONFLICT_BODY_LIMIT})
    assert send(app, sender, "evt_big", body=big).status_code == 409
    row = _conflict(app)
    assert row.incoming_body is None and row.incoming_size == len(big)
    html = logged_in(app, "oncall").get(f"/conflicts/{row.id}").get_data(as_text=True)
    assert "larger than the 64 KiB kept for review" in html


def test_retention_drops_kept_bodies_at_the_end_of_the_review_window(app) -> None:  # type: ignore[no-untyped-def]
    from jobs.retention import purge

    sender = make_sender(app)
    send(app, sender, "evt_r", data={"amount": 1})
    send(app, sender, "evt_r", data={"amount": 2})
    svc = app.extensions["ledger"]
    purge(svc.engine, svc.settings, svc.clock)
    assert _conflict(app).incoming_body is not None  # still inside the window
    svc.clock.advance(svc.settings.review_window_seconds + 1)
    purge(svc.engine, svc.settings, svc.clock)
    row = _conflict(app)
    assert row.incoming_body is None and row.count == 1  # the record itself stays


def test_receipt_page_labels_durations_and_next_attempts_truthfully(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    send(app, sender, "evt_f", "demo.flaky", {"amount": 3, "fail_times": 5})
    _drain(app)
    client = logged_in(app, "oncall")
    html = client.get(f"/receipts/{sender.public_id}/evt_f").get_data(as_text=True)
    assert ", took " in html and " after " not in html
    assert "next attempt at" in html and "Retry now" in html
    add_receipt(app, sender.scope_id, "evt_x", state=2)  # failed, job kept for review
    failed = client.get(f"/receipts/{sender.public_id}/evt_x").get_data(as_text=True)
    assert "no further attempt until requeued" in failed
    assert "next attempt" not in failed and "next run" not in failed


def test_retry_now_skips_the_backoff_audited(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    send(app, sender, "evt_f", "demo.flaky", {"amount": 3, "fail_times": 1})
    _drain(app)
    assert _drain(app) == 0  # waiting on its 50 s backoff
    form = {"scope": sender.scope, "event_id": "evt_f", "reason": "upstream is back"}
    assert post(logged_in(app, "viewer"), "/receipts/retry-now", form).status_code == 403
    empty = post(logged_in(app, "oncall", "o1"), "/receipts/retry-now", {**form, "reason": ""})
    assert empty.status_code == 409 and "reason is required" in empty.get_data(as_text=True)
    answer = post(logged_in(app, "oncall", "olga"), "/receipts/retry-now", form, htmx=True)
    assert answer.status_code == 200 and "due now" in answer.get_data(as_text=True)
    assert _drain(app) == 1  # no clock movement needed
    with app.extensions["ledger"].engine.connect() as conn:
        assert get_receipt(conn, sender.scope, "evt_f").state.value == "complete"
    rows = _audit(app, "receipt.retry_now")
    assert [(r.actor, r.reason) for r in rows] == [("olga", "upstream is back")]
    again = post(logged_in(app, "oncall", "o3"), "/receipts/retry-now", form)
    assert again.status_code == 409 and "only pending" in again.get_data(as_text=True)


def test_run_again_needs_the_typed_id_and_the_accepted_body(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    body = event_body("stripe", "evt_c", data={"amount": 5})
    assert send(app, sender, "evt_c", body=body).status_code == 202
    _drain(app)
    svc = app.extensions["ledger"]
    with svc.engine.connect() as conn:
        assert balance(conn, sender.scope_id) == 5
    form = {"scope": sender.scope, "event_id": "evt_c", "reason": "ledger lost the credit",
            "confirm": "evt_c", "body": body.decode()}
    assert post(logged_in(app, "viewer"), "/receipts/run-again", form).status_code == 403
    oncall = logged_in(app, "oncall", "olga")
    wrong_id = post(oncall, "/receipts/run-again", {**form, "confirm": "evt_x"})
    assert wrong_id.status_code == 409 and "type the event id" in wrong_id.get_data(as_text=True)
    forged = post(oncall, "/receipts/run-again",
                  {**form, "body": body.decode().replace("5", "500")})
    assert forged.status_code == 409 and "SHA-256 differs" in forged.get_data(as_text=True)
    assert _audit(app, "receipt.run_again") == []
    # A textarea sends CRLF line endings; the accepted body is still recognised.
    answer = post(oncall, "/receipts/run-again", form, htmx=True)
    assert answer.status_code == 200 and "second time" in answer.get_data(as_text=True)
    twice = post(oncall, "/receipts/run-again", form)
    assert twice.status_code == 409 and "only completed" in twice.get_data(as_text=True)
    assert _drain(app) == 1
    with svc.engine.connect() as conn:
        assert balance(conn, sender.scope_id) == 10  # the effect happened a second time
        receipt = get_receipt(conn, sender.scope, "evt_c")
        history = conn.execute(select(attempts.c.number, attempts.c.outcome).where(
            attempts.c.scope_id == sender.scope_id).order_by(attempts.c.number)).all()
        assert conn.execute(select(jobs)).first() is None
    assert (receipt.state.value, receipt.attempts) == ("complete", 2)
    assert [tuple(h) for h in history] == [(1, "complete"), (2, "complete")]
    rows = _audit(app, "receipt.run_again")
    assert [(r.actor, r.reason) for r in rows] == [("olga", "ledger lost the credit")]


def test_run_again_form_is_for_oncall_on_completed_receipts(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    send(app, sender, "evt_c", data={"amount": 5})
    _drain(app)
    path = f"/receipts/{sender.public_id}/evt_c"
    assert "Run again" in logged_in(app, "oncall").get(path).get_data(as_text=True)
    assert "Run again" not in logged_in(app, "viewer").get(path).get_data(as_text=True)
