"""A destination run as a handler would be: prepare sends and records, apply decides.

Against a real local receiving service, on both databases: 500 then 503 then 200 is three
attempts with one key, the destination held between them; 429 with Retry-After; 400 fails
at once; a paused destination holds its events without a request or an attempt.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import timedelta

import pytest
import standardwebhooks
from sqlalchemy import select

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.clock import FixedClock
from ledger.db.schema import destination_attempts, destinations
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.delivery import DeliveryJob, DestinationDelivery, NotAdmitted
from ledger.destinations.forward import DeliveryError, Forwarder
from ledger.destinations.secrets import rotate_secret
from ledger.destinations.store import (
    DestinationSettings,
    DestinationState,
    create_destination,
    set_destination_state,
)
from ledger.handlers import PermanentFailure, RetryAfter
from ledger.worker.retry import RetryPolicy
from tests.helpers import make_sender
from tests.receivers import Answer, receiving

ADMIN = audit.Actor(name="test", role="admin")
BODY = b'{"id":"evt_1","type":"order.paid"}'


@pytest.fixture
def setup(app):  # type: ignore[no-untyped-def]
    """A receiving service, a destination of order.paid pointing at it, and the runner."""
    svc = app.extensions["ledger"]
    clock = FixedClock(svc.clock.now())
    sender = make_sender(app, account="acme", name="shop")
    forwarder = Forwarder(policy=AddressPolicy.from_entries(["127.0.0.1"]), retry_cap_seconds=600)
    with receiving() as (url, receiver):
        with svc.engine.begin() as conn:
            created = create_destination(
                conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
                DestinationSettings(url=url + "/in", event_types=["order.paid"]),
                policy=AddressPolicy.from_entries(["127.0.0.1"]), handled_types=(),
                now=clock.now())
        runner = DestinationDelivery(svc.engine, svc.box, forwarder, clock,
                                     retry=RetryPolicy(base_seconds=10, cap_seconds=600))
        yield runner, receiver, created, sender, clock
    forwarder.close()


def _job(sender, attempt: int, event_type: str = "order.paid") -> DeliveryJob:  # type: ignore[no-untyped-def]
    return DeliveryJob(scope=sender.scope, scope_id=sender.scope_id, event_id="evt_1",
                       event_type=event_type, attempt=attempt, payload=BODY.decode())


def _run(app, runner, job):  # type: ignore[no-untyped-def]
    prepared = runner.prepare(job)
    with app.extensions["ledger"].engine.begin() as conn:
        return runner.apply(conn, prepared)


def _rows(app):  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        answers = conn.execute(select(destination_attempts)
                               .order_by(destination_attempts.c.id)).all()
        destination = conn.execute(select(destinations)).one()
    return answers, destination


def test_failures_then_success_three_attempts_one_key(app, setup):
    runner, receiver, created, sender, clock = setup
    receiver.answer(Answer(status=500), Answer(status=503), Answer(headers={"X-Result-Ref":
                                                                              "order:77"}))
    with pytest.raises(DeliveryError):
        _run(app, runner, _job(sender, 1))
    _answers, held = _rows(app)
    assert held.blocked_until == clock.now() + timedelta(seconds=10)
    with pytest.raises(NotAdmitted) as waiting:  # held: no request, no attempt spent
        _run(app, runner, _job(sender, 2))
    assert waiting.value.not_before == held.blocked_until and len(receiver.requests) == 1
    clock.advance(10)
    with pytest.raises(DeliveryError):
        _run(app, runner, _job(sender, 2))
    clock.advance(20)  # the second failure in a row holds it twice as long
    assert _run(app, runner, _job(sender, 3)) == "order:77"
    answers, after = _rows(app)
    assert [(a.number, a.http_status, a.outcome) for a in answers] == [
        (1, 500, "retry"), (2, 503, "retry"), (3, 200, "complete")]
    assert (after.consecutive_failures, after.blocked_until) == (0, None)
    assert {r.headers["idempotency-key"] for r in receiver.requests} == {"acme/shop:evt_1"}
    for got in receiver.requests:
        standardwebhooks.Webhook(created.signing_secret).verify(got.body, got.headers)


def test_429_with_retry_after_holds_the_destination_that_long(app, setup):
    runner, receiver, _created, sender, clock = setup
    receiver.answer(Answer(status=429, headers={"Retry-After": "120"}))
    with pytest.raises(RetryAfter) as raised:
        _run(app, runner, _job(sender, 1))
    assert raised.value.seconds == 120
    _answers, held = _rows(app)
    assert held.blocked_until == clock.now() + timedelta(seconds=120)


def test_400_fails_at_once_and_does_not_hold_the_destination(app, setup):
    runner, receiver, _created, sender, _clock = setup
    receiver.answer(Answer(status=400, body=b'{"error":"unknown order"}'))
    with pytest.raises(PermanentFailure):
        _run(app, runner, _job(sender, 1))
    answers, destination = _rows(app)
    assert [(a.http_status, a.outcome, a.response_excerpt) for a in answers] == [
        (400, "failed", '{"error":"unknown order"}')]
    assert destination.blocked_until is None


def test_a_paused_destination_holds_without_a_request(app, setup):
    runner, receiver, created, sender, clock = setup
    with app.extensions["ledger"].engine.begin() as conn:
        set_destination_state(conn, ADMIN, created.destination.public_id,
                              DestinationState.PAUSED, reason="maintenance", now=clock.now())
    with pytest.raises(NotAdmitted) as held:
        _run(app, runner, _job(sender, 1))
    assert (held.value.reason, held.value.not_before) == ("paused", None)
    assert receiver.requests == [] and _rows(app)[0] == []


def test_an_event_no_destination_takes_is_not_sent(app, setup):
    runner, receiver, _created, sender, _clock = setup
    prepared = runner.prepare(_job(sender, 1, event_type="order.shipped"))
    assert prepared.destination is None and receiver.requests == []


def _signs(secret: str, request) -> bool:  # type: ignore[no-untyped-def]
    """Tell whether `secret` made one of the request's signatures (any timestamp: the
    test's clock moves past standardwebhooks' own five minutes)."""
    headers = request.headers
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return expected in headers["webhook-signature"].split(" ")


def test_a_rotation_signs_the_next_send_of_a_running_worker(app, setup):
    """The worker decrypts each secret once, but reads which secrets sign for every send."""
    runner, receiver, created, sender, clock = setup
    old = created.signing_secret
    assert _run(app, runner, _job(sender, 1)) == "http:200"
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        new = rotate_secret(conn, svc.box, ADMIN, created.destination.public_id,
                            now=clock.now(), overlap_seconds=600).signing_secret
    assert _run(app, runner, _job(sender, 2)) == "http:200"
    clock.advance(601)  # the overlap is over: the old secret no longer signs
    assert _run(app, runner, _job(sender, 3)) == "http:200"
    first, during, after = receiver.requests
    assert (_signs(old, first), _signs(new, first)) == (True, False)
    assert (_signs(old, during), _signs(new, during)) == (True, True)
    assert (_signs(old, after), _signs(new, after)) == (False, True)
