"""The worker runs destinations as handlers, on both databases and both worker paths.

Against a real local receiving service that verifies with the `standardwebhooks` library:
the stored body as received, re-signed; 500/503 then 200 is three attempts with one key;
429 with Retry-After; 400 fails at once; a paused destination holds its events without a
request or an attempt until resumed; a slow destination times out; a duplicate delivery is
never forwarded twice; a worker refuses to start with a handler for a destination's type.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import standardwebhooks
from click.testing import CliRunner
from sqlalchemy import select

from app import create_app
from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.cli import ledger_cli
from ledger.clock import FixedClock
from ledger.db.schema import destinations, failure_members, failure_signatures, jobs
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.secrets import rotate_secret
from ledger.destinations.store import (
    DestinationSettings,
    DestinationState,
    create_destination,
    set_destination_state,
)
from ledger.reads.receipts import receipt_detail
from ledger.worker.handlers import Registry
from ledger.worker.loop import Worker
from tests.dashboard_helpers import (
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    make_operator,
    make_token,
)
from tests.helpers import event_body, make_sender, send
from tests.receivers import Answer, Receiver, receiving

PATHS = pytest.mark.parametrize("batch_size", [1, 8], ids=["single", "batched"])
ADMIN = audit.Actor(name="test", role="admin")
LOOPBACK = AddressPolicy.from_entries(["127.0.0.1"])
AMOUNT = {"amount": 5}
ACCEPTED = (200, 202)  # 200: a duplicate of a delivery already completed


class FixedRandom:
    """An RNG that always answers the same fraction."""

    def random(self) -> float:
        """Return one half."""
        return 0.5


@pytest.fixture
def fixed_app(test_env):  # type: ignore[no-untyped-def]
    """The app on a FixedClock, with destinations allowed to reach loopback."""
    app = create_app({**test_env, "LEDGER_DESTINATION_ALLOW": "127.0.0.1",
                      "LEDGER_RETRY_BASE_SECONDS": "10", "LEDGER_MAX_ATTEMPTS": "5",
                      "LEDGER_DEMO_HANDLERS": "0"},
                     clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


@pytest.fixture
def setup(fixed_app):  # type: ignore[no-untyped-def]
    """A receiving service and a sender whose order.paid events go to it."""
    with receiving() as (url, receiver):
        sender = make_sender(fixed_app, account="acme", name="shop")
        yield fixed_app, sender, receiver, url


def _destination(app, sender, url: str, **settings: Any):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        return create_destination(
            conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
            DestinationSettings(**{"url": url + "/in", "event_types": ["order.paid"], **settings}),
            policy=LOOPBACK, handled_types=(), now=svc.clock.now())


def _run(app, batch_size: int) -> int:  # type: ignore[no-untyped-def]
    worker = Worker(app.extensions["ledger"], worker_id="w-test", batch_size=batch_size,
                    handlers=Registry(), rng=FixedRandom())
    return worker.run(burst=True)


def _receipt(app, sender, event_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        detail = receipt_detail(conn, sender.scope_id, event_id)
    assert detail is not None
    return detail


def _verified(receiver: Receiver, secret: str) -> list[Any]:
    """Verify every request with the standardwebhooks library; return the payloads."""
    verifier = standardwebhooks.Webhook(secret)
    return [verifier.verify(r.body, {k: v for k, v in r.headers.items()})
            for r in receiver.requests]


@PATHS
def test_the_stored_body_goes_out_re_signed_and_completes(setup, batch_size):
    app, sender, receiver, url = setup
    created = _destination(app, sender, url)
    receiver.answer(Answer(status=200, headers={"X-Result-Ref": "order:42"}))
    body = event_body(sender, "evt_1", "order.paid", AMOUNT)
    send(app, sender, "evt_1", body=body, expect=ACCEPTED)
    assert _run(app, batch_size) == 1
    [request] = receiver.requests
    assert request.body == body  # as received, byte for byte
    assert _verified(receiver, created.signing_secret) == [json.loads(body)]
    key = f"{sender.scope}:evt_1"
    assert (request.headers["webhook-id"], request.headers["idempotency-key"]) == (key, key)
    assert request.headers["x-ledger-scope"] == sender.scope
    assert request.headers["x-ledger-event-type"] == "order.paid"
    assert request.headers["x-ledger-attempt"] == "1"
    assert request.headers["content-type"] == "application/json"
    assert not any(h.startswith("stripe") for h in request.headers)  # the sender's own
    receipt = _receipt(app, sender, "evt_1")
    assert (receipt["state"], receipt["result_ref"], receipt["attempts"]) == (
        "complete", "order:42", 1)
    assert [a["http_status"] for a in receipt["destination_attempts"]] == [200]


@PATHS
def test_500_503_then_200_is_three_attempts_with_one_key(setup, batch_size):
    app, sender, receiver, url = setup
    created = _destination(app, sender, url)
    clock = app.extensions["ledger"].clock
    receiver.answer(Answer(status=500, body=b"boom"), Answer(status=503), Answer(status=200))
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    for _ in range(3):
        _run(app, batch_size)
        clock.advance(120)  # past the job's backoff and the destination's
    assert len(receiver.requests) == 3
    assert {r.headers["idempotency-key"] for r in receiver.requests} == {f"{sender.scope}:evt_1"}
    assert [r.headers["x-ledger-attempt"] for r in receiver.requests] == ["1", "2", "3"]
    _verified(receiver, created.signing_secret)
    receipt = _receipt(app, sender, "evt_1")
    assert (receipt["state"], receipt["result_ref"], receipt["attempts"]) == (
        "complete", "http:200", 3)
    answers = receipt["destination_attempts"]
    assert [(a["attempt"], a["http_status"]) for a in answers] == [(1, 500), (2, 503), (3, 200)]
    assert answers[0]["response_excerpt"] == "boom"


@PATHS
def test_429_waits_at_least_its_retry_after_without_spending_attempts(setup, batch_size):
    app, sender, receiver, url = setup
    _destination(app, sender, url, max_in_flight=1)  # a batch sends one at a time
    clock = app.extensions["ledger"].clock
    receiver.answer(Answer(status=429, headers={"Retry-After": "30"}))
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    send(app, sender, "evt_2", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, batch_size)
    assert len(receiver.requests) == 1  # the other event waits behind the destination
    clock.advance(29)
    _run(app, batch_size)
    assert len(receiver.requests) == 1
    clock.advance(60)
    _run(app, batch_size)
    clock.advance(5)  # a batch sends evt_2 after evt_1's request (max in flight 1)
    _run(app, batch_size)
    assert len(receiver.requests) == 3
    first, second = _receipt(app, sender, "evt_1"), _receipt(app, sender, "evt_2")
    assert (first["state"], first["attempts"]) == ("complete", 2)
    assert (second["state"], second["attempts"]) == ("complete", 1)  # held: no attempt


@PATHS
def test_400_fails_at_once(setup, batch_size):
    app, sender, receiver, url = setup
    _destination(app, sender, url)
    receiver.answer(Answer(status=400, body=b"unknown order"))
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, batch_size)
    receipt = _receipt(app, sender, "evt_1")
    assert (receipt["state"], receipt["attempts"]) == ("failed", 1)
    assert "400" in receipt["last_error"]
    assert len(receiver.requests) == 1


@PATHS
def test_a_paused_destination_holds_its_events_until_resumed(setup, batch_size):
    app, sender, receiver, url = setup
    created = _destination(app, sender, url)
    svc = app.extensions["ledger"]
    public_id = created.destination.public_id
    with svc.engine.begin() as conn:
        set_destination_state(conn, ADMIN, public_id, DestinationState.PAUSED,
                              reason="maintenance", now=svc.clock.now())
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, batch_size)
    assert receiver.requests == []
    receipt = _receipt(app, sender, "evt_1")
    assert (receipt["state"], receipt["attempts"]) == ("pending", 0)  # no attempt spent
    with svc.engine.connect() as conn:
        assert conn.execute(select(jobs.c.run_at)).scalar_one() > svc.clock.now()
    with svc.engine.begin() as conn:
        set_destination_state(conn, ADMIN, public_id, DestinationState.ACTIVE,
                              reason="done", now=svc.clock.now())
    _run(app, batch_size)  # due again at once: the clock did not move
    assert [r.headers["x-ledger-attempt"] for r in receiver.requests] == ["1"]
    assert _receipt(app, sender, "evt_1")["state"] == "complete"


def test_a_slow_destination_times_out_and_is_retried(setup):
    app, sender, receiver, url = setup
    _destination(app, sender, url, timeout_seconds=0.5)
    receiver.answer(Answer(status=200, hold=True))
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, 1)
    receipt = _receipt(app, sender, "evt_1")
    assert (receipt["state"], receipt["attempts"]) == ("pending", 1)
    [answer] = receipt["destination_attempts"]
    assert (answer["outcome"], answer["http_status"]) == ("retry", None)
    assert answer["error"].startswith("timeout")


@PATHS
def test_a_duplicate_delivery_is_never_forwarded_twice(setup, batch_size):
    app, sender, receiver, url = setup
    _destination(app, sender, url)
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    # the sender retries before the worker ran
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, batch_size)
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)  # and again once it completed
    _run(app, batch_size)
    assert len(receiver.requests) == 1
    assert _receipt(app, sender, "evt_1")["state"] == "complete"


def test_types_a_destination_does_not_take_are_not_sent(setup):
    app, sender, receiver, url = setup
    _destination(app, sender, url)
    send(app, sender, "evt_1", "order.shipped", AMOUNT, expect=ACCEPTED)
    _run(app, 1)
    assert receiver.requests == []
    assert _receipt(app, sender, "evt_1")["result_ref"] == "ignored:no-handler"


def test_the_worker_refuses_a_handler_for_a_destination_type(test_env):
    app = create_app({**test_env, "LEDGER_DESTINATION_ALLOW": "127.0.0.1"})
    try:
        sender = make_sender(app)
        svc = app.extensions["ledger"]
        with svc.engine.begin() as conn:  # created before the demo handlers were loaded
            create_destination(
                conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
                DestinationSettings(url="http://127.0.0.1:9/in", event_types=["demo.credit"]),
                policy=LOOPBACK, handled_types=(), now=svc.clock.now())
    finally:
        svc.close()
    result = CliRunner().invoke(ledger_cli, ["worker", "--burst"],
                                env={**test_env, "LEDGER_DEMO_HANDLERS": "1"})
    assert result.exit_code == 2
    assert "demo.credit" in result.output


def test_a_failing_destination_is_one_failure_group_whatever_the_types(setup):
    app, sender, receiver, url = setup
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        created = create_destination(
            conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
            DestinationSettings(url=url + "/in", event_types=["order.paid", "order.shipped"]),
            policy=LOOPBACK, handled_types=(), now=svc.clock.now())
    receiver.default = Answer(status=410, body=b"gone")
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    send(app, sender, "evt_2", "order.shipped", AMOUNT, expect=ACCEPTED)
    _run(app, 1)
    with svc.engine.connect() as conn:
        groups = conn.execute(select(failure_signatures.c.event_type)).scalars().all()
        members = conn.execute(select(failure_members.c.group_id)).scalars().all()
    assert groups == [f"destination {created.destination.public_id}"]
    assert len(members) == 2 and len(set(members)) == 1


def test_the_dashboard_shows_a_real_run(setup):
    app, sender, receiver, url = setup
    created = _destination(app, sender, url)
    svc = app.extensions["ledger"]
    receiver.answer(Answer(status=503, body=b"busy: try later"))
    send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
    send(app, sender, "evt_2", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, 1)
    svc.clock.advance(120)
    _run(app, 1)
    with svc.engine.begin() as conn:
        set_destination_state(conn, ADMIN, created.destination.public_id,
                              DestinationState.PAUSED, reason="maintenance", now=svc.clock.now())
    send(app, sender, "evt_3", "order.paid", AMOUNT, expect=ACCEPTED)
    send(app, sender, "evt_4", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, 1)
    make_operator(app, "olga", "oncall")
    token = make_token(app, "olga")
    answer = app.test_client().get("/api/v1/destinations",
                                   headers={"Authorization": f"Bearer {token}"})
    (item,) = answer.get_json()["destinations"]
    assert (item["state"], item["backlog"], item["attempts_sampled"]) == ("paused", 2, 3)
    assert item["success_rate"] == round(2 / 3, 4) and item["p95_latency_ms"] > 0
    (failure,) = item["recent_failures"]
    assert (failure["event_id"], failure["http_status"]) == ("evt_1", 503)
    html = logged_in(app, "oncall", "otto").get(
        f"/receipts/{sender.public_id}/evt_1").get_data(as_text=True)
    assert "503" in html and "busy: try later" in html
    page = logged_in(app, "oncall", "oona").get("/destinations")
    assert page.status_code == 200 and created.destination.public_id in page.get_data(
        as_text=True)


@PATHS
def test_forwarded_attempts_are_counted_as_forwarded_not_unhandled(setup, batch_size):
    """No Python handler ran them, but a destination did: the attempt metrics say so."""
    from tests.integration.test_observability_metrics import samples, value

    app, sender, receiver, url = setup
    _destination(app, sender, url)
    receiver.answer(Answer(status=200))
    client = app.test_client()

    def count(event_type: str) -> float:
        page = samples(client.get("/metrics").get_data(as_text=True))
        return value(page, "ledger_attempts_total", event_type=event_type, outcome="complete")

    before = {label: count(label) for label in ("forwarded", "unhandled")}
    send(app, sender, "evt_counted", body=event_body(sender, "evt_counted", "order.paid",
                                                        AMOUNT), expect=ACCEPTED)
    assert _run(app, batch_size) == 1
    assert count("forwarded") - before["forwarded"] == 1
    assert count("unhandled") == before["unhandled"]


def test_a_send_ends_inside_the_work_items_lease_whatever_the_timeout(test_env):
    """A destination slower than the lease is cut off before the lease ends, so no other
    worker can claim the work item and send it again while the first request is open."""
    app = create_app({**test_env, "LEDGER_DESTINATION_ALLOW": "127.0.0.1",
                      "LEDGER_DEMO_HANDLERS": "0", "LEDGER_LEASE_SECONDS": "7"},
                     clock=FixedClock(datetime.now(UTC)))
    try:
        with receiving() as (url, receiver):
            sender = make_sender(app, account="acme", name="shop")
            _destination(app, sender, url, timeout_seconds=120)
            receiver.answer(Answer(status=200, hold=True))
            send(app, sender, "evt_1", "order.paid", AMOUNT, expect=ACCEPTED)
            started = time.monotonic()
            _run(app, 1)
            took = time.monotonic() - started
            receipt = _receipt(app, sender, "evt_1")
    finally:
        app.extensions["ledger"].close()
    # 7 s of lease, 5 s kept for the answer's record and the completion: a 2 s send.
    assert took < 6, took
    assert (receipt["state"], receipt["attempts"]) == ("pending", 1)
    [answer] = receipt["destination_attempts"]
    assert answer["outcome"] == "retry" and answer["error"].startswith("timeout")


@pytest.mark.parametrize(("limits", "first_round"), [
    ({"max_in_flight": 2}, 2), ({"rate_per_second": 1.0}, 1)], ids=["in-flight", "rate"])
def test_a_rounds_admissions_count_each_other(setup, limits, first_round):
    """A round's events are admitted together: each sees the requests and rate slots the
    ones before it took, and those refused wait without spending an attempt."""
    app, sender, receiver, url = setup
    _destination(app, sender, url, **limits)
    for n in range(4):
        send(app, sender, f"evt_{n}", "order.paid", AMOUNT, expect=ACCEPTED)
    _run(app, 8)
    assert len(receiver.requests) == first_round
    states = [(_receipt(app, sender, f"evt_{n}")["state"],
               _receipt(app, sender, f"evt_{n}")["attempts"]) for n in range(4)]
    assert sorted(states) == sorted([("complete", 1)] * first_round
                                    + [("pending", 0)] * (4 - first_round))
    clock = app.extensions["ledger"].clock
    for _ in range(12):  # the held events come due (with their jitter) as slots free
        if len(receiver.requests) == 4:
            break
        clock.advance(1)
        _run(app, 8)
    assert sorted(r.headers["idempotency-key"] for r in receiver.requests) == [
        f"{sender.scope}:evt_{n}" for n in range(4)]
    assert {_receipt(app, sender, f"evt_{n}")["attempts"] for n in range(4)} == {1}


def test_a_rotated_secret_signs_the_next_round(setup):
    """A worker reads its destinations' secrets once a round: the round after a rotation that
    ends the old secret's overlap at once is signed by the new secret alone."""
    app, sender, receiver, url = setup
    old = _destination(app, sender, url).signing_secret
    for n in range(2):
        send(app, sender, f"evt_{n}", "order.paid", AMOUNT, expect=ACCEPTED)
    assert _run(app, 8) == 2
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        public_id = conn.execute(select(destinations.c.public_id)).scalar_one()
        new = rotate_secret(conn, svc.box, ADMIN, public_id, now=svc.clock.now(),
                            overlap_seconds=0).signing_secret
    for n in range(2, 4):
        send(app, sender, f"evt_{n}", "order.paid", AMOUNT, expect=ACCEPTED)
    assert _run(app, 8) == 2
    def signed_by(secret: str) -> list[bool]:
        verifier = standardwebhooks.Webhook(secret)
        found = []
        for request in receiver.requests:
            try:
                verifier.verify(request.body, dict(request.headers))
                found.append(True)
            except standardwebhooks.webhooks.WebhookVerificationError:
                found.append(False)
        return found

    assert signed_by(old) == [True, True, False, False]
    assert signed_by(new) == [False, False, True, True]


def test_a_worker_loop_sends_on_its_own_threads_and_ends_them(setup):
    app, sender, receiver, url = setup
    _destination(app, sender, url)
    for n in range(3):
        send(app, sender, f"evt_{n}", "order.paid", AMOUNT, expect=ACCEPTED)
    assert _run(app, 8) == 3
    assert {r.headers["x-ledger-attempt"] for r in receiver.requests} == {"1"}
    assert len(receiver.requests) == 3
    assert [t.name for t in threading.enumerate() if t.name.startswith("ledger-send")] == []


def test_one_round_routes_each_scope_by_its_own_destinations(setup):
    """Events of three scopes claimed together: each goes to its own scope's destination,
    one whose scope has none, or whose type its destination does not take, is not sent."""
    app, shop, receiver, url = setup
    _destination(app, shop, url)  # order.paid only
    kiosk = make_sender(app, account="acme", name="kiosk")  # no destination
    mall = make_sender(app, account="acme", name="mall")
    _destination(app, mall, url, event_types=["order.paid", "order.shipped"])
    for sender, event_id, event_type in ((shop, "evt_s1", "order.paid"),
                                         (shop, "evt_s2", "order.shipped"),
                                         (mall, "evt_m1", "order.shipped"),
                                         (kiosk, "evt_k1", "order.paid")):
        send(app, sender, event_id, event_type, AMOUNT, expect=ACCEPTED)
    assert _run(app, 8) == 4
    sent = sorted((r.headers["x-ledger-scope"], r.headers["webhook-id"])
                  for r in receiver.requests)
    assert sent == [("acme/mall", "acme/mall:evt_m1"), ("acme/shop", "acme/shop:evt_s1")]
    for sender, event_id, result in ((shop, "evt_s1", "http:200"),
                                     (mall, "evt_m1", "http:200"),
                                     (shop, "evt_s2", "ignored:no-handler"),
                                     (kiosk, "evt_k1", "ignored:no-handler")):
        assert _receipt(app, sender, event_id)["result_ref"] == result
