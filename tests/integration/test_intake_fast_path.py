"""The intake's WSGI fast path answers exactly like the Flask route it stands in front of."""

from __future__ import annotations

import json

from tests.helpers import deliver, event_body, ledger_counts, make_sender, signed_headers


def _through_flask(app, sender, event_id: str):  # type: ignore[no-untyped-def]
    """POST a signed delivery through Flask's own dispatch, bypassing the fast path."""
    body = event_body(sender.profile, event_id)
    headers = signed_headers(sender, body, event_id)
    with app.test_request_context(f"/hooks/{sender.public_id}", method="POST", data=body,
                                  headers=headers):
        return app.full_dispatch_request()


def test_flask_route_and_fast_path_share_one_ledger_and_one_answer_shape(app, client):
    sender = make_sender(app)
    slow = _through_flask(app, sender, "evt_1")
    assert slow.status_code == 202
    assert json.loads(slow.get_data()) == {"status": "accepted", "event_id": "evt_1",
                                           "state": "pending"}
    fast = deliver(client, sender, "evt_1")  # the same event again, through the fast path
    assert fast.status_code == 202
    assert fast.get_json() == {"status": "duplicate", "event_id": "evt_1", "state": "pending"}
    assert fast.content_type == slow.content_type == "application/json"
    assert ledger_counts(app)["receipts"] == 1


def test_intake_answer_echoes_request_id_and_sets_no_cookie(app, client):
    sender = make_sender(app)
    body = event_body(sender.profile, "evt_1")
    headers = {**signed_headers(sender, body, "evt_1"), "X-Request-Id": "sender-trace.7"}
    response = client.post(f"/hooks/{sender.public_id}", data=body, headers=headers)
    assert response.status_code == 202
    assert response.headers["X-Request-Id"] == "sender-trace.7"
    assert "Set-Cookie" not in response.headers
    assert int(response.headers["Content-Length"]) == len(response.get_data())


def test_paths_that_are_not_one_public_id_are_not_deliveries(app, client):
    sender = make_sender(app)
    body = event_body(sender.profile, "evt_1")
    headers = signed_headers(sender, body, "evt_1")
    for path in (f"/hooks/{sender.public_id}/", f"/hooks/{sender.public_id}/x", "/hooks/"):
        response = client.post(path, data=body, headers=headers)
        assert response.status_code == 404, path
    assert ledger_counts(app)["receipts"] == 0
