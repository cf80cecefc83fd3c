"""The JSON API answers exactly the keys its typed read models declare (ledger/reads/models.py).

The models are TypedDicts: a key added to a query but not to its model, or dropped from
one, would change what API clients read; this test makes the two agree, on both databases.
"""

from __future__ import annotations

from typing import Any

from ledger.access import audit
from ledger.reads.models import (
    AuditItem,
    ConflictItem,
    CredentialItem,
    DeliveryItem,
    FailureItem,
    ListedConflict,
    ReceiptAuditItem,
    ReceiptDetail,
    ReceiptItem,
    WorkItemState,
)
from tests.dashboard_helpers import (
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    make_operator,
    make_token,
)
from tests.helpers import deliver, make_sender


def _keys(model: Any) -> set[str]:
    """Return every key a read model declares (required or not)."""
    return set(model.__required_keys__) | set(model.__optional_keys__)


def test_the_api_answers_the_keys_of_its_read_models(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    client = app.test_client()
    deliver(client, sender, "evt_ok")
    add_receipt(app, sender.scope_id, "evt_f", state=2, error="KeyError: amount",
                payload='{"data": {"amount": 9}}')
    add_conflict(app, sender.scope_id, "evt_ok")
    svc = app.extensions["ledger"]
    svc.delivery_log.flush(everything=True)  # the log is written in batches
    with svc.engine.begin() as conn:  # an operator's note on the failed receipt
        audit.record(conn, audit.Actor(name="olga", role="oncall"), "receipt.note",
                     f"{sender.scope}:evt_f", at=svc.clock.now(), scope=sender.scope,
                     reason="looked at it")
    make_operator(app, "pager", "admin")
    headers = {"Authorization": f"Bearer {make_token(app, 'pager')}"}

    def get(path: str) -> Any:
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.get_data(as_text=True))
        return response.get_json()

    for item in get("/api/v1/receipts")["items"]:
        assert set(item) == _keys(ReceiptItem)
    assert set(get("/api/v1/failures")["items"][0]) == _keys(FailureItem)
    detail = get(f"/api/v1/receipts/{sender.public_id}/evt_f")
    assert set(detail) == _keys(ReceiptDetail)  # admin: the payload too
    assert set(detail["job"]) == _keys(WorkItemState)
    assert detail["audit"] and all(set(a) == _keys(ReceiptAuditItem) for a in detail["audit"])
    original = get(f"/api/v1/receipts/{sender.public_id}/evt_ok")
    assert set(original["conflicts"][0]) == _keys(ConflictItem)
    assert set(original["deliveries"][0]) == _keys(DeliveryItem)
    assert set(get("/api/v1/conflicts")["items"][0]) == _keys(ListedConflict)
    assert set(get("/api/v1/deliveries")["items"][0]) == _keys(DeliveryItem)
    creds = get(f"/api/v1/integrations/{sender.public_id}/credentials")["credentials"]
    assert set(creds[0]) == _keys(CredentialItem)
    assert set(get("/api/v1/audit")["items"][0]) == _keys(AuditItem)
