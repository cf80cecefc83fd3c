"""The JSON API answers exactly the keys its typed read models declare (ledger/reads/models.py).

The models are TypedDicts: a key added to a query but not to its model, or dropped from
one, would change what API clients read; this test makes the two agree, on both databases.
"""

from __future__ import annotations

from typing import Any

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.db.schema import findings, instances, scheduler_runs
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.store import DestinationSettings, create_destination, record_attempt
from ledger.reads.models import (
    AttemptRow,
    AuditItem,
    CapacityFigures,
    ConflictItem,
    CredentialItem,
    DeliveryItem,
    DestinationAnswer,
    DestinationFailure,
    FailureItem,
    FindingItem,
    InstanceRow,
    ListedConflict,
    ReceiptAuditItem,
    ReceiptDetail,
    ReceiptItem,
    SchedulerRun,
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
    assert detail["attempt_rows"]
    assert all(set(a) == _keys(AttemptRow) for a in detail["attempt_rows"])
    assert detail["audit"] and all(set(a) == _keys(ReceiptAuditItem) for a in detail["audit"])
    original = get(f"/api/v1/receipts/{sender.public_id}/evt_ok")
    assert set(original["conflicts"][0]) == _keys(ConflictItem)
    assert set(original["deliveries"][0]) == _keys(DeliveryItem)
    assert set(get("/api/v1/conflicts")["items"][0]) == _keys(ListedConflict)
    assert set(get("/api/v1/deliveries")["items"][0]) == _keys(DeliveryItem)
    creds = get(f"/api/v1/integrations/{sender.public_id}/credentials")["credentials"]
    assert set(creds[0]) == _keys(CredentialItem)
    assert set(get("/api/v1/audit")["items"][0]) == _keys(AuditItem)


def test_destination_answers_carry_the_keys_of_their_read_models(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    with svc.engine.begin() as conn:
        created = create_destination(
            conn, svc.box, audit.Actor(name="test", role="admin"),
            get_integration(conn, sender.public_id),
            DestinationSettings(url="https://orders.example.com/in", event_types=["order.paid"]),
            policy=AddressPolicy(), handled_types=(), now=svc.clock.now())
        record_attempt(conn, created.destination.id, scope_id=sender.scope_id,
                       event_id="evt_1", number=1, started_at=svc.clock.now(), latency_ms=40.0,
                       http_status=502, outcome="retry", error="destination answered 502",
                       response_excerpt="bad gateway")
    add_receipt(app, sender.scope_id, "evt_1", state=0, event_type="order.paid")
    make_operator(app, "olga", "oncall")
    headers = {"Authorization": f"Bearer {make_token(app, 'olga')}"}
    client = app.test_client()
    detail = client.get(f"/api/v1/receipts/{sender.public_id}/evt_1", headers=headers)
    (answer,) = detail.get_json()["destination_attempts"]
    assert set(answer) == _keys(DestinationAnswer)
    listed = client.get("/api/v1/destinations", headers=headers).get_json()
    (failure,) = listed["destinations"][0]["recent_failures"]
    assert set(failure) == _keys(DestinationFailure)


def test_the_overview_stuck_and_capacity_answer_the_keys_of_their_read_models(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    client = app.test_client()
    deliver(client, sender, "evt_ok")
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:  # a worker's heartbeat, a finished run, an open finding
        conn.execute(instances.insert().values(
            id="w-1", kind="worker", hostname="box", pid=7, started_at=now, heartbeat_at=now,
            credentials_refreshed_at=now, handles='["order.paid"]'))
        conn.execute(scheduler_runs.insert().values(
            job="purge", period_start=now, instance="w-1", started_at=now, finished_at=now,
            outcome="ok", rows_affected=0))
        conn.execute(findings.insert().values(
            kind="orphan", subject="scope 1", detail="no job", first_seen=now, last_seen=now))
    make_operator(app, "pager", "admin")
    headers = {"Authorization": f"Bearer {make_token(app, 'pager')}"}

    def get(path: str) -> Any:
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.get_data(as_text=True))
        return response.get_json()

    overview = get("/api/v1/overview")
    assert "w-1" in {i["id"] for i in overview["instances"]}
    assert all(set(i) == _keys(InstanceRow) for i in overview["instances"])
    assert "purge" in {r["job"] for r in overview["scheduler_runs"]}
    assert all(set(r) == _keys(SchedulerRun) for r in overview["scheduler_runs"])
    found = get("/api/v1/stuck")["findings"]
    assert "orphan" in {f["kind"] for f in found}
    assert all(set(f) == _keys(FindingItem) for f in found)
    # `replicas` only from the CLI's --replicas (not 1); the API measures one copy
    assert set(get("/api/v1/capacity")) == _keys(CapacityFigures) - {"replicas"}
