"""The intake path on both databases: accept, duplicate, conflict, scope isolation."""

from __future__ import annotations

import hashlib

from sqlalchemy import select, update

from ledger.access import audit
from ledger.db.schema import conflicts, jobs, receipts
from ledger.domain import ReceiptState
from tests.helpers import deliver, event_body, ledger_counts, make_sender


def test_new_event_is_accepted_with_receipt_and_job_in_one_commit(app, client):
    sender = make_sender(app)
    response = deliver(client, sender, "evt_1")
    assert response.status_code == 202
    assert response.get_json() == {"status": "accepted", "event_id": "evt_1",
                                   "state": "pending"}
    assert response.content_type == "application/json"
    with app.extensions["ledger"].engine.connect() as conn:
        receipt = conn.execute(select(receipts)).one()
        job = conn.execute(select(jobs)).one()
    body = event_body("stripe", "evt_1")
    assert receipt.state == ReceiptState.PENDING.code
    assert bytes(receipt.body_sha256) == hashlib.sha256(body).digest()
    assert (job.scope_id, job.event_id, job.payload) == (sender.scope_id, "evt_1", body.decode())


def test_every_profile_accepts_its_senders_signature(app, client):
    for profile in ("stripe", "github", "standard-webhooks"):
        sender = make_sender(app, name=f"in-{profile}", profile=profile)
        response = deliver(client, sender, f"evt_{profile}")
        assert response.status_code == 202, (profile, response.get_json())
    assert ledger_counts(app)["receipts"] == 3


def test_duplicate_of_pending_answers_pending_without_new_rows(app, client):
    sender = make_sender(app)
    deliver(client, sender, "evt_1")
    again = deliver(client, sender, "evt_1")
    assert again.status_code == 202
    assert again.get_json() == {"status": "duplicate", "event_id": "evt_1", "state": "pending"}
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 0}


def _set_state(app, event_id: str, state: ReceiptState, result_ref: str | None) -> None:
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(update(receipts).where(receipts.c.event_id == event_id)
                     .values(state=state.code, result_ref=result_ref))


def test_duplicate_of_complete_returns_recorded_result(app, client):
    sender = make_sender(app)
    deliver(client, sender, "evt_1")
    _set_state(app, "evt_1", ReceiptState.COMPLETE, "credit:7")
    again = deliver(client, sender, "evt_1")
    assert again.status_code == 200
    assert again.get_json() == {"status": "duplicate", "event_id": "evt_1",
                                "state": "complete", "result_ref": "credit:7"}


def test_duplicate_of_failed_answers_failed(app, client):
    sender = make_sender(app)
    deliver(client, sender, "evt_1")
    _set_state(app, "evt_1", ReceiptState.FAILED, None)
    again = deliver(client, sender, "evt_1")
    assert again.status_code == 200
    assert again.get_json() == {"status": "duplicate", "event_id": "evt_1", "state": "failed"}


def test_same_id_different_body_is_a_conflict_and_leaves_original_untouched(app, client):
    sender = make_sender(app)
    deliver(client, sender, "evt_1", data={"amount": 1})
    first = deliver(client, sender, "evt_1", data={"amount": 999})
    second = deliver(client, sender, "evt_1", data={"amount": 999})
    assert first.status_code == second.status_code == 409
    assert first.get_json() == {"status": "conflict", "event_id": "evt_1"}
    with app.extensions["ledger"].engine.connect() as conn:
        receipt = conn.execute(select(receipts)).one()
        conflict = conn.execute(select(conflicts)).one()
    original = hashlib.sha256(event_body("stripe", "evt_1", data={"amount": 1})).digest()
    incoming = hashlib.sha256(event_body("stripe", "evt_1", data={"amount": 999})).digest()
    assert bytes(receipt.body_sha256) == original
    assert conflict.kind == "different_body"
    assert (bytes(conflict.original_sha256), bytes(conflict.incoming_sha256)) == (
        original, incoming)
    assert conflict.count == 2
    assert conflict.last_seen >= conflict.first_seen
    assert ledger_counts(app)["jobs"] == 1


def test_github_body_replayed_under_fresh_id_is_a_duplicate_of_the_original(app, client):
    sender = make_sender(app, name="gh", profile="github")
    body = event_body("github", "d-1", "push.created")
    deliver(client, sender, "d-1", "push.created", body=body)
    replay = deliver(client, sender, "d-2", "push.created", body=body)
    assert replay.status_code == 202
    assert replay.get_json() == {"status": "duplicate", "event_id": "d-1", "state": "pending"}
    with app.extensions["ledger"].engine.connect() as conn:
        conflict = conn.execute(select(conflicts)).one()
    assert (conflict.kind, conflict.event_id, conflict.original_event_id) == (
        "replayed_body", "d-2", "d-1")
    assert ledger_counts(app)["receipts"] == 1
    assert ledger_counts(app)["jobs"] == 1


def test_scope_comes_from_the_integration_so_two_accounts_share_an_event_id(app, client):
    acme = make_sender(app, account="acme")
    globex = make_sender(app, account="globex")
    assert deliver(client, acme, "evt_42").status_code == 202
    assert deliver(client, globex, "evt_42").status_code == 202
    with app.extensions["ledger"].engine.connect() as conn:
        scopes = sorted(conn.execute(select(receipts.c.scope_id)).scalars())
    assert scopes == sorted([acme.scope_id, globex.scope_id])


def test_body_fields_cannot_choose_the_scope(app, client):
    acme = make_sender(app, account="acme")
    globex = make_sender(app, account="globex")
    deliver(client, globex, "evt_1", data={"account": "acme", "scope": "acme/stripe-prod"})
    assert deliver(client, acme, "evt_1").get_json()["status"] == "accepted"


def test_a_signature_made_with_account_a_key_is_refused_by_account_b(app, client):
    acme = make_sender(app, account="acme")
    globex = make_sender(app, account="globex")
    response = deliver(client, globex, "evt_1", secret=acme.secret)
    assert response.status_code == 401
    assert response.get_json() == {"error": "unauthenticated"}
    assert ledger_counts(app) == {"receipts": 0, "jobs": 0, "conflicts": 0}


def test_unauthenticated_request_cannot_reserve_an_event_id(app, client):
    sender = make_sender(app)
    assert deliver(client, sender, "evt_1", secret="whsec_forged").status_code == 401
    assert deliver(client, sender, "evt_1").status_code == 202


def test_a_key_added_by_another_process_verifies_before_the_cache_ages_out(app, client, test_env):
    from app import create_app
    from ledger.access.credentials import add_credential
    from ledger.access.integrations import get_integration

    sender = make_sender(app)
    assert deliver(client, sender, "evt_1").status_code == 202  # the view now caches the keys
    other = create_app(test_env)  # another process: its change does not reach our cache
    svc = other.extensions["ledger"]
    with svc.engine.begin() as conn:
        new = add_credential(conn, svc.box, audit.Actor(name="t", role="admin"),
                             get_integration(conn, sender.public_id), now=svc.clock.now())
    svc.close()
    assert deliver(client, sender, "evt_2", secret=new.secret).status_code == 202
    assert deliver(client, sender, "evt_3", secret="whsec_forged").status_code == 401
    # That forged delivery came within a second of the reload: it read nothing again.
    assert app.extensions["ledger"].view.reload(sender.public_id) is None
