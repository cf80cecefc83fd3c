"""Dashboard actions: role checks on the server, re-authentication, one audit row each."""

from __future__ import annotations

import re

from sqlalchemy import func, select

from ledger.db.schema import audit_log, conflicts, credentials, receipts
from tests.dashboard_helpers import (
    PASSWORD,
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    post,
)
from tests.helpers import deliver, make_sender

HIDDEN = re.compile(r'name="(\w+)" value="([^"]*)"')


def _audit(app, action: str) -> list:  # type: ignore[no-untyped-def]
    """Return the audit rows of one action, oldest first."""
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(audit_log).where(audit_log.c.action == action)
                            .order_by(audit_log.c.id)).all()


def _states(app, scope_id: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Return {event id: state code} of a scope."""
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(receipts.c.event_id, receipts.c.state)
                            .where(receipts.c.scope_id == scope_id)).all()
    return dict(rows)  # type: ignore[arg-type]


def test_requeue_one_needs_oncall_and_writes_one_audit_row(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2)
    form = {"scope": sender.scope, "event_id": "evt_f", "reason": "handler fixed"}
    assert post(logged_in(app, "viewer"), "/failures/requeue", form).status_code == 403
    assert _states(app, sender.scope_id)["evt_f"] == 2
    answer = post(logged_in(app, "oncall", "olga"), "/failures/requeue", form, htmx=True)
    assert answer.status_code == 200 and "Requeued" in answer.get_data(as_text=True)
    assert _states(app, sender.scope_id)["evt_f"] == 0
    rows = _audit(app, "receipt.requeue")
    assert [(r.actor, r.role, r.reason) for r in rows] == [("olga", "oncall", "handler fixed")]
    again = post(logged_in(app, "oncall", "otto"), "/failures/requeue", form, htmx=True)
    assert again.status_code == 409 and "only failed receipts" in again.get_data(as_text=True)
    assert len(_audit(app, "receipt.requeue")) == 1


def test_requeue_all_matching_confirms_the_count_and_runs_in_chunks(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    other = make_sender(app, account="globex")
    for i in range(130):
        add_receipt(app, sender.scope_id, f"evt_{i:03d}", state=2, event_type="demo.fail")
    add_receipt(app, sender.scope_id, "evt_other_type", state=2, event_type="demo.other")
    add_receipt(app, other.scope_id, "evt_x", state=2, event_type="demo.fail")
    client = logged_in(app, "oncall")
    listed = client.get(f"/failures?scope={sender.scope}&event_type=demo.fail&limit=10")
    assert "<strong>130</strong>" in listed.get_data(as_text=True)  # all, not the page
    form = {"scope": sender.scope, "event_type": "demo.fail", "since": "", "until": "",
            "reason": "bug 42 fixed"}
    confirm = post(client, "/failures/requeue-all/preview", form, htmx=True)
    assert "Requeue <strong>130</strong>" in confirm.get_data(as_text=True)
    fields = dict(HIDDEN.findall(confirm.get_data(as_text=True)))
    steps = 0
    while True:
        steps += 1
        answer = post(client, "/failures/requeue-all", fields, htmx=True)
        html = answer.get_data(as_text=True)
        if 'hx-trigger="load' not in html:
            break
        vals = re.search(r"hx-vals='([^']*)'", html).group(1)  # type: ignore[union-attr]
        import json

        fields = {k: str(v) for k, v in json.loads(vals).items()}
        assert steps < 10
    assert steps == 2 and "Done: 130 requeued" in html
    states = _states(app, sender.scope_id)
    assert sum(1 for k, v in states.items() if k.startswith("evt_0") or k.startswith("evt_1")
               if v == 0) == 130
    assert states["evt_other_type"] == 2 and _states(app, other.scope_id)["evt_x"] == 2
    assert len(_audit(app, "receipt.requeue")) == 130


def test_requeue_all_without_reason_is_refused(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2)
    client = logged_in(app, "oncall")
    answer = post(client, "/failures/requeue-all/preview", {"scope": sender.scope}, htmx=True)
    assert answer.status_code == 400 and "reason is required" in answer.get_data(as_text=True)
    assert post(client, "/failures/requeue-all", {"scope": sender.scope}).status_code == 400
    assert _states(app, sender.scope_id)["evt_f"] == 2


def test_acknowledge_conflict_needs_oncall_and_a_note(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    conflict_id = add_conflict(app, sender.scope_id, "evt_1")
    path = f"/conflicts/{conflict_id}/ack"
    assert post(logged_in(app, "viewer"), path, {"note": "seen"}).status_code == 403
    oncall = logged_in(app, "oncall", "olga")
    assert post(oncall, path, {"note": ""}, htmx=True).status_code == 409
    answer = post(oncall, path, {"note": "sender bug, ticket 7"}, htmx=True)
    assert answer.status_code == 200
    with app.extensions["ledger"].engine.connect() as conn:
        row = conn.execute(select(conflicts).where(conflicts.c.id == conflict_id)).one()
    assert row.acknowledged_by == "olga" and row.ack_note == "sender bug, ticket 7"
    rows = _audit(app, "conflict.acknowledge")
    assert [(r.actor, r.role, r.reason) for r in rows] == [("olga", "oncall",
                                                            "sender bug, ticket 7")]


def _credential_states(app, integration_id: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Return {key id: state} of an integration."""
    with app.extensions["ledger"].engine.connect() as conn:
        return dict(conn.execute(select(credentials.c.key_id, credentials.c.state)
                                 .where(credentials.c.integration_id == integration_id)).all())


def test_revoke_needs_security_and_the_password_again(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    path = f"/credentials/{sender.public_id}/revoke"
    form = {"key_id": sender.key_id, "reason": "leaked in a log", "confirm_last": "1",
            "password": "correct horse battery staple"}
    assert post(logged_in(app, "oncall"), path, form).status_code == 403
    security = logged_in(app, "security", "sam")
    wrong = post(security, path, dict(form, password="not my password"), htmx=True)
    assert wrong.status_code == 403 and "did not match" in wrong.get_data(as_text=True)
    assert _credential_states(app, sender.scope_id)[sender.key_id] == "active"
    answer = post(security, path, form, htmx=True)
    assert answer.status_code == 200 and "Revoked" in answer.get_data(as_text=True)
    assert _credential_states(app, sender.scope_id)[sender.key_id] == "revoked"
    rows = _audit(app, "credential.revoke")
    assert [(r.actor, r.role, r.reason) for r in rows] == [("sam", "security",
                                                            "leaked in a log")]
    # A revoked key no longer signs for this integration.
    assert deliver(app.test_client(), sender, "evt_after").status_code == 401


def test_revoke_refuses_a_key_of_another_integration(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    other = make_sender(app, account="globex")
    security = logged_in(app, "security")
    answer = post(security, f"/credentials/{sender.public_id}/revoke",
                  {"key_id": other.key_id, "reason": "x", "confirm_last": "1",
                   "password": "correct horse battery staple"})
    assert answer.status_code == 404
    assert _credential_states(app, other.scope_id)[other.key_id] == "active"


def test_rotate_shows_the_new_secret_once_and_retires_the_old_key(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    security = logged_in(app, "security")
    path = f"/credentials/{sender.public_id}/rotate"
    assert post(security, path, {"overlap": "3600", "password": "nope nope nope",
                                 "reason": "scheduled"}).status_code == 403
    assert post(security, path, {"overlap": "3600", "password": "correct horse battery staple"}
                ).status_code == 400
    answer = post(security, path, {"overlap": "3600", "reason": "scheduled",
                                   "password": "correct horse battery staple"}, htmx=True)
    html = answer.get_data(as_text=True)
    secret = re.search(r'<pre class="secret">([^<]+)</pre>', html).group(1)  # type: ignore[union-attr]
    states = _credential_states(app, sender.scope_id)
    assert states[sender.key_id] == "retiring" and list(states.values()).count("active") == 1
    assert secret not in security.get(f"/credentials/{sender.public_id}").get_data(as_text=True)
    assert [r.reason for r in _audit(app, "credential.rotate")] == ["scheduled"]
    added = post(security, f"/credentials/{sender.public_id}/add",
                 {"reason": "second sender", "password": "correct horse battery staple"})
    assert added.status_code == 200 and 'class="secret"' in added.get_data(as_text=True)
    assert [r.reason for r in _audit(app, "credential.add")][-1] == "second sender"


def test_admin_creates_operators_and_tokens(app) -> None:  # type: ignore[no-untyped-def]
    admin = logged_in(app, "admin", "root")
    answer = post(admin, "/operators", {"username": "newbie", "role": "oncall",
                                        "password": PASSWORD}, htmx=True)
    assert answer.status_code == 200 and 'class="secret"' in answer.get_data(as_text=True)
    token_page = post(admin, "/operators/newbie/token", {"password": PASSWORD},
                      htmx=True).get_data(as_text=True)
    token = re.search(r'<pre class="secret">(rlt_[^<]+)</pre>', token_page).group(1)  # type: ignore[union-attr]
    me = app.test_client().get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert me.get_json() == {"username": "newbie", "role": "oncall"}
    assert post(admin, "/operators/root/disable", {"reason": "x", "password": PASSWORD}
                ).status_code == 409
    with app.extensions["ledger"].engine.connect() as conn:
        actions = conn.execute(select(audit_log.c.action, func.count())
                               .where(audit_log.c.actor == "root")
                               .group_by(audit_log.c.action)).all()
    assert dict(actions) == {"operator.create": 1, "operator.token": 1}  # type: ignore[arg-type]
