"""What every worker shares about a destination: pause, backoff, rate, requests in flight."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import insert, select

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.db.schema import destination_attempts, destinations, jobs
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.admission import IN_FLIGHT_SLACK_SECONDS, admit, admit_all, note_outcome
from ledger.destinations.store import (
    DestinationSettings,
    DestinationState,
    answer_attempt,
    create_destination,
    purge_attempts,
    record_attempt,
    set_destination_state,
)
from tests.helpers import make_sender

ADMIN = audit.Actor(name="test", role="admin")


def _destination(app, **settings):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    with svc.engine.begin() as conn:
        created = create_destination(
            conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
            DestinationSettings(url="https://orders.example.com/in", event_types=["a.b"],
                                **settings),
            policy=AddressPolicy(), handled_types=(), now=svc.clock.now())
    return sender, created.destination


def _admit(app, dst_id: int, now: datetime, job: tuple[int, str, int] | None = None):  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.begin() as conn:
        return admit(conn, dst_id, now=now, job=job)


def _lease(app, scope_id: int, event_id: str, event_type: str, until: datetime) -> None:
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(insert(jobs).values(
            scope_id=scope_id, event_id=event_id, event_type=event_type, accepted_at=until,
            run_at=until, status=0, attempts=1, lease_token=1, leased_by="w-1",
            leased_until=until, payload="{}"))


def test_a_paused_destination_admits_nothing_until_resumed(app):
    _sender, dst = _destination(app)
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        set_destination_state(conn, ADMIN, dst.public_id, DestinationState.PAUSED,
                              reason="maintenance", now=now)
    held = _admit(app, dst.id, now)
    assert (held.admitted, held.reason, held.not_before) == (False, "paused", None)
    with svc.engine.begin() as conn:
        set_destination_state(conn, ADMIN, dst.public_id, DestinationState.ACTIVE,
                              reason="done", now=now)
    assert _admit(app, dst.id, now).admitted


def test_one_failure_holds_every_event_until_the_backoff_ends(app):
    _sender, dst = _destination(app)
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        note_outcome(conn, dst.id, ok=False, now=now, ceiling=10, retry_after=30)
    held = _admit(app, dst.id, now + timedelta(seconds=29))
    assert (held.reason, held.not_before) == ("backoff", now + timedelta(seconds=30))
    assert _admit(app, dst.id, now + timedelta(seconds=30)).admitted
    with svc.engine.begin() as conn:
        note_outcome(conn, dst.id, ok=False, now=now, ceiling=10)
        assert conn.execute(select(destinations.c.consecutive_failures)).scalar_one() == 2
        note_outcome(conn, dst.id, ok=True, now=now)
        row = conn.execute(select(destinations)).one()
    assert (row.consecutive_failures, row.blocked_until) == (0, None)


def test_requests_in_flight_are_capped_across_workers(app):
    sender, dst = _destination(app, max_in_flight=2, timeout_seconds=10)
    now = app.extensions["ledger"].clock.now()
    sid = sender.scope_id
    first = _admit(app, dst.id, now, job=(sid, "evt_1", 1))
    assert first.admitted and first.attempt_id is not None
    assert _admit(app, dst.id, now, job=(sid, "evt_2", 1)).admitted  # 2 in flight
    full = _admit(app, dst.id, now, job=(sid, "evt_3", 1))
    assert (full.admitted, full.reason) == (False, "in_flight")
    assert full.not_before is not None and full.not_before > now
    # An answer frees its slot.
    with app.extensions["ledger"].engine.begin() as conn:
        answer_attempt(conn, first.attempt_id, latency_ms=5.0, http_status=200,
                       outcome="complete", error=None, response_excerpt=None)
    assert _admit(app, dst.id, now, job=(sid, "evt_3", 1)).admitted
    # A request whose worker died stops counting once its timeout has passed.
    later = now + timedelta(seconds=10 + IN_FLIGHT_SLACK_SECONDS + 1)
    assert _admit(app, dst.id, later, job=(sid, "evt_4", 1)).admitted


def test_sends_are_paced_at_the_rate(app):
    _sender, dst = _destination(app, rate_per_second=2)
    now = app.extensions["ledger"].clock.now()
    assert _admit(app, dst.id, now).admitted
    early = _admit(app, dst.id, now + timedelta(seconds=0.4))
    assert (early.reason, early.not_before) == ("rate", now + timedelta(seconds=0.5))
    assert _admit(app, dst.id, now + timedelta(seconds=0.5)).admitted
    # A backlog drains at the rate: the next slot is one interval after the last.
    assert _admit(app, dst.id, now + timedelta(seconds=0.9)).reason == "rate"


def test_without_a_rate_a_worker_whose_clock_is_a_moment_behind_is_admitted(app):
    _sender, dst = _destination(app)
    now = app.extensions["ledger"].clock.now()
    assert _admit(app, dst.id, now).admitted
    # Another worker read its time just before the first took the destination's lock.
    assert _admit(app, dst.id, now - timedelta(milliseconds=3)).admitted


def test_the_purge_drops_answers_older_than_the_cut(app):
    sender, dst = _destination(app)
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        for number, age in ((1, 100), (2, 50), (3, 1)):
            record_attempt(conn, dst.id, scope_id=sender.scope_id, event_id="evt_1",
                           number=number, started_at=now - timedelta(seconds=age),
                           latency_ms=1.0, http_status=500, outcome="retry", error=None,
                           response_excerpt=None)
        assert purge_attempts(conn, before=now - timedelta(seconds=10)) == 2
        left = conn.execute(select(destination_attempts.c.number)).scalars().all()
    assert left == [3]


def _admit_all(app, dst_id: int, items: list[tuple[int, str, int]], now: datetime):  # type: ignore[no-untyped-def]
    """admit_all in a transaction; return its decisions and the attempts now open."""
    with app.extensions["ledger"].engine.begin() as conn:
        decided = admit_all(conn, dst_id, items, now=now)
        opened = conn.execute(select(destination_attempts.c.id, destination_attempts.c.event_id)
                              .order_by(destination_attempts.c.id)).all()
    return decided, [tuple(row) for row in opened]


def test_items_admitted_at_once_count_each_others_requests_in_flight(app):
    sender, dst = _destination(app, max_in_flight=2)
    items = [(sender.scope_id, f"evt_{n}", 1) for n in range(3)]
    decided, opened = _admit_all(app, dst.id, items, app.extensions["ledger"].clock.now())
    assert [(d.admitted, d.reason) for d in decided] == [
        (True, None), (True, None), (False, "in_flight")]
    assert [(d.attempt_id, f"evt_{n}") for n, d in enumerate(decided[:2])] == opened


def test_items_admitted_at_once_take_the_rate_slots_one_by_one(app):
    sender, dst = _destination(app, rate_per_second=2.0)
    now = app.extensions["ledger"].clock.now()
    items = [(sender.scope_id, f"evt_{n}", 1) for n in range(3)]
    decided, opened = _admit_all(app, dst.id, items, now)
    slot = now + timedelta(seconds=0.5)  # one slot taken: the next is one interval on
    assert [(d.admitted, d.reason, d.not_before) for d in decided] == [
        (True, None, None), (False, "rate", slot), (False, "rate", slot)]
    assert [event for _, event in opened] == ["evt_0"]
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(destinations.c.next_send_at)).scalar_one() == slot
