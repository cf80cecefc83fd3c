"""The CONTRACT's claim answers and the accepted count on /metrics, read the same way from any
server of the intake."""

from __future__ import annotations

from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from ledger.db.schema import receipts
from ledger.domain import ReceiptState
from tests.helpers import event_body, signed_headers


def post(base: str, sender: Any, event_id: str, body: bytes,
         secret: str | None = None) -> requests.Response:
    """POST a delivery of `sender` signed with its secret (or `secret`)."""
    return requests.post(f"{base}/hooks/{sender.public_id}", data=body, timeout=30,
                         headers=signed_headers(sender, body, event_id, secret=secret))


def check_claim_answers(app: Any, base: str, sender: Any) -> None:
    """evt_1 accepted (202), a duplicate while pending (202), a duplicate once complete
    (200 with its result_ref), the same id with another body (409)."""
    first = event_body(sender, "evt_1")
    accepted = post(base, sender, "evt_1", first)
    assert (accepted.status_code, accepted.json()) == (
        202, {"status": "accepted", "event_id": "evt_1", "state": "pending"})
    assert accepted.headers["Content-Type"] == "application/json"
    again = post(base, sender, "evt_1", first)
    assert (again.status_code, again.json()) == (
        202, {"status": "duplicate", "event_id": "evt_1", "state": "pending"})
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(update(receipts).where(receipts.c.event_id == "evt_1").values(
            state=ReceiptState.COMPLETE.code, result_ref="ref-1"))
    done = post(base, sender, "evt_1", first)
    assert (done.status_code, done.json()) == (
        200, {"status": "duplicate", "event_id": "evt_1", "state": "complete",
              "result_ref": "ref-1"})
    other = post(base, sender, "evt_1", event_body(sender, "evt_1", data={"amount": 2}))
    assert (other.status_code, other.json()) == (
        409, {"status": "conflict", "event_id": "evt_1"})


def accepted_count(base_url: str) -> float:
    """Return the deliveries /metrics counts as accepted."""
    page = requests.get(f"{base_url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(page)
               if family.name == "ledger_deliveries"
               for sample in family.samples
               if sample.name == "ledger_deliveries_total"
               and sample.labels.get("outcome") == "accepted")
