"""A destination gets the body as received with its Content-Type (CONTRACT section 8).

On both databases, against a real local receiving service that verifies with the
`standardwebhooks` library: a JSON sender's body and Content-Type (parameters and all), a
Twilio form and a GitHub form body byte for byte with theirs, while a Python handler of a
form sender still reads the decoded fields; a Content-Type that cannot travel as a header
is replaced by the body's own type. A receipt run again carries its body as the intake
stored it: a form decoded for its handler and kept as received for its destination.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import standardwebhooks
from sqlalchemy import select

from app import create_app
from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.clock import FixedClock, unix
from ledger.db.schema import jobs
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.store import DestinationSettings, create_destination
from ledger.handlers import Event
from ledger.worker.handlers import Registry
from ledger.worker.loop import Worker
from ledger.worker.rerun import run_again
from tests.helpers import Sender, event_body, make_sender, signed_headers
from tests.profile_keys import KEYS, URL
from tests.receivers import Answer, Receiver, receiving

ADMIN = audit.Actor(name="test", role="admin")
LOOPBACK = AddressPolicy.from_entries(["127.0.0.1"])
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def fixed_app(test_env):  # type: ignore[no-untyped-def]
    """The app on a FixedClock, with destinations allowed to reach loopback."""
    app = create_app({**test_env, "LEDGER_DESTINATION_ALLOW": "127.0.0.1",
                      "LEDGER_DEMO_HANDLERS": "0"}, clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


@pytest.fixture
def receiver(fixed_app):  # type: ignore[no-untyped-def]
    """A receiving service that answers 200: (its base URL, its record)."""
    with receiving() as (url, found):
        found.default = Answer(status=200)
        yield url, found


def _destination(app, sender: Sender, url: str, event_type: str) -> str:  # type: ignore[no-untyped-def]
    """Send `event_type` of the sender to the receiver; return the signing secret."""
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        return create_destination(
            conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
            DestinationSettings(url=url + "/in", event_types=[event_type]),
            policy=LOOPBACK, handled_types=(), now=svc.clock.now()).signing_secret


def _twilio(app) -> Sender:  # type: ignore[no-untyped-def]
    """A Twilio integration at the test URL, signing as Twilio does."""
    return make_sender(app, name="sms", profile="twilio", secret=KEYS["twilio"].stored,
                       signing_key=KEYS["twilio"].signing, endpoint_url=URL)


def _twilio_form_to(app, url: str, fields: dict[str, str], token: str,  # type: ignore[no-untyped-def]
                    content_type: str) -> tuple[Sender, str, bytes]:
    """Accept a Twilio form for a destination at `url`: (sender, signing secret, body)."""
    sender = _twilio(app)
    secret = _destination(app, sender, url, "twilio.request")
    body = urlencode(fields).encode()
    _post(app, sender, body, {**signed_headers(sender, body, token), "Content-Type": content_type})
    return sender, secret, body


def _github_form(app, sender: Sender, event: dict[str, Any], delivery: str) -> bytes:  # type: ignore[no-untyped-def]
    """Accept GitHub's form body (`payload=` the event's JSON) as GitHub signs it; return it."""
    body = ("payload=" + quote(json.dumps(event), safe="")).encode()
    signature = hmac.new(KEYS["github"].stored.encode(), body, hashlib.sha256).hexdigest()
    _post(app, sender, body, {
        "X-Hub-Signature-256": "sha256=" + signature, "X-GitHub-Event": "issues",
        "X-GitHub-Delivery": delivery, "Content-Type": FORM})
    return body


def _post(app, sender: Sender, body: bytes, headers: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    response = app.test_client().post(f"/hooks/{sender.public_id}", data=body, headers=headers)
    assert response.status_code == 202, response.get_json()


def _run(app, handlers: Registry | None = None) -> int:  # type: ignore[no-untyped-def]
    worker = Worker(app.extensions["ledger"], worker_id="w-test", batch_size=4,
                    handlers=handlers or Registry())
    return worker.run(burst=True)


def _forwarded(receiver: Receiver, secret: str) -> tuple[bytes, str]:
    """Return the one request's body and Content-Type, verified with standardwebhooks."""
    [request] = receiver.requests
    standardwebhooks.Webhook(secret).verify(request.body, dict(request.headers),
                                            json_parse=False)
    return request.body, request.headers["content-type"]


def test_a_json_body_goes_out_with_its_content_type_as_received(fixed_app, receiver):
    url, found = receiver
    sender = make_sender(fixed_app, name="shop")
    secret = _destination(fixed_app, sender, url, "order.paid")
    body = event_body(sender, "evt_1", "order.paid", {"amount": 5, "note": "caf\u00e9"})
    headers = signed_headers(sender, body, "evt_1", "order.paid",
                             timestamp=unix(fixed_app.extensions["ledger"].clock.now()))
    _post(fixed_app, sender, body, {**headers, "Content-Type": "application/json; charset=utf-8"})
    assert _run(fixed_app) == 1
    assert _forwarded(found, secret) == (body, "application/json; charset=utf-8")


def test_a_twilio_form_goes_out_byte_for_byte_and_its_handler_reads_fields(fixed_app, receiver):
    url, found = receiver
    fields = {"MessageSid": "SM1", "Body": "hello & bye = \u00e9", "From": "+15005550006"}
    content_type = FORM + "; charset=UTF-8"  # what Twilio sends
    _sender, secret, body = _twilio_form_to(fixed_app, url, fields, "idem-1", content_type)
    with fixed_app.extensions["ledger"].engine.connect() as conn:
        assert json.loads(conn.execute(select(jobs.c.payload)).scalar_one()) == fields
    assert _run(fixed_app) == 1
    assert _forwarded(found, secret) == (body, content_type)


def test_one_round_sends_each_event_its_own_body_and_type(fixed_app, receiver):
    """A JSON event and a form event claimed in one round: each goes out as it came in."""
    url, found = receiver
    fields = {"MessageSid": "SM2", "Body": "round", "From": "+15005550006"}
    _sender, form_secret, form = _twilio_form_to(fixed_app, url, fields, "idem-2", FORM)
    sender = make_sender(fixed_app, name="shop")
    json_secret = _destination(fixed_app, sender, url, "order.paid")
    body = event_body(sender, "evt_r", "order.paid", {"amount": 7})
    _post(fixed_app, sender, body, signed_headers(
        sender, body, "evt_r", "order.paid",
        timestamp=unix(fixed_app.extensions["ledger"].clock.now())))
    assert _run(fixed_app) == 2
    sent = {r.headers["content-type"]: r for r in found.requests}
    assert (sent[FORM].body, sent["application/json"].body) == (form, body)
    standardwebhooks.Webhook(form_secret).verify(form, dict(sent[FORM].headers),
                                                 json_parse=False)
    standardwebhooks.Webhook(json_secret).verify(body, dict(sent["application/json"].headers),
                                                 json_parse=False)


def test_a_python_handler_of_a_form_sender_still_reads_the_decoded_fields(fixed_app):
    sender = _twilio(fixed_app)
    fields = {"MessageSid": "SM2", "Body": "a=b&c"}
    body = urlencode(fields).encode()
    _post(fixed_app, sender, body, signed_headers(sender, body, "idem-2"))
    seen: list[Any] = []

    def record(_conn: Any, event: Event) -> str:
        seen.append(event.payload)
        return "ok"

    assert _run(fixed_app, Registry.of({"twilio.request": record})) == 1
    assert seen == [fields]


def test_a_github_form_body_goes_out_as_received(fixed_app, receiver):
    url, found = receiver
    sender = make_sender(fixed_app, name="gh", profile="github", secret=KEYS["github"].stored)
    secret = _destination(fixed_app, sender, url, "issues.opened")
    event = {"action": "opened", "issue": {"number": 7, "title": "a & b = c"}}
    body = _github_form(fixed_app, sender, event, "72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert _run(fixed_app) == 1
    forwarded, content_type = _forwarded(found, secret)
    assert (forwarded, content_type) == (body, FORM)
    assert not any(h.startswith("x-hub") for h in found.requests[0].headers)


def test_a_content_type_too_long_to_forward_is_replaced_by_the_bodys_type(fixed_app, receiver):
    url, found = receiver
    sender = make_sender(fixed_app, name="shop")
    secret = _destination(fixed_app, sender, url, "order.paid")
    body = event_body(sender, "evt_2", "order.paid")
    headers = signed_headers(sender, body, "evt_2", "order.paid",
                             timestamp=unix(fixed_app.extensions["ledger"].clock.now()))
    _post(fixed_app, sender, body,
          {**headers, "Content-Type": "application/json; x=" + "a" * 300})
    assert _run(fixed_app) == 1
    assert _forwarded(found, secret) == (body, "application/json")


def _run_again(app, sender: Sender, event_id: str, body: bytes) -> Any:  # type: ignore[no-untyped-def]
    """Run a completed receipt again with `body` pasted; return its new work item."""
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        run_again(conn, ADMIN, scope=sender.scope, event_id=event_id, confirm=event_id,
                  reason="the effect was lost downstream", body=body.decode(),
                  now=svc.clock.now())
        return conn.execute(select(jobs.c.payload, jobs.c.content_type, jobs.c.raw_body)).one()


def test_a_twilio_form_run_again_goes_out_as_it_came_in(fixed_app, receiver):
    url, found = receiver
    fields = {"MessageSid": "SM3", "Body": "x & y = \u00e9", "From": "+15005550006"}
    sender, secret, body = _twilio_form_to(fixed_app, url, fields, "idem-3", FORM)
    assert _run(fixed_app) == 1
    # Twilio's digest is of its sorted fields, not the bytes: the pasted body is recognised.
    item = _run_again(fixed_app, sender, "idem-3", body)
    assert (json.loads(item.payload), item.content_type, item.raw_body) == (
        fields, FORM, body.decode())
    assert _run(fixed_app) == 1
    first, again = found.requests
    standardwebhooks.Webhook(secret).verify(again.body, dict(again.headers), json_parse=False)
    assert (again.body, again.headers["content-type"]) == (first.body, FORM) == (body, FORM)


def test_a_form_body_run_again_gives_its_handler_the_decoded_fields_again(fixed_app):
    sender = make_sender(fixed_app, name="gh", profile="github", secret=KEYS["github"].stored)
    event = {"action": "opened", "issue": {"number": 8, "title": "a & b"}}
    body = _github_form(fixed_app, sender, event, "72d3162e-cc78-11e3-81ab-4c9367dc0959")
    seen: list[Any] = []

    def record(_conn: Any, event: Event) -> str:
        seen.append(event.payload)
        return "ok"

    handlers = Registry.of({"issues.opened": record})
    assert _run(fixed_app, handlers) == 1
    item = _run_again(fixed_app, sender, "72d3162e-cc78-11e3-81ab-4c9367dc0959", body)
    assert (item.content_type, item.raw_body) == (FORM, body.decode())
    assert _run(fixed_app, handlers) == 1
    assert seen == [{"payload": event}, {"payload": event}]


def test_a_json_body_run_again_carries_the_body_as_accepted(fixed_app):
    sender = make_sender(fixed_app, name="shop")
    body = event_body(sender, "evt_3", "order.paid", {"amount": 7})
    _post(fixed_app, sender, body, signed_headers(
        sender, body, "evt_3", "order.paid",
        timestamp=unix(fixed_app.extensions["ledger"].clock.now())))
    assert _run(fixed_app, Registry.of({"order.paid": lambda _c, _e: "ok"})) == 1
    item = _run_again(fixed_app, sender, "evt_3", body)
    assert (item.payload, item.content_type, item.raw_body) == (body.decode(), None, None)
