"""Failure groups over every failure, not the newest 1,000 (issue 17): the group is stored
when a receipt fails, counted per scope, and a requeue or the purge takes it out again.
Both databases."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select

from jobs.retention import purge
from ledger.db.schema import (
    attempts,
    audit_log,
    failure_group_scopes,
    failure_members,
    integrations,
    jobs,
    receipts,
)
from ledger.reads.groups import read_groups
from ledger.reads.receipts import ReceiptFilter
from ledger.worker.failure_groups import group_id, record_failure
from ledger.worker.loop import process_one
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    post,
)
from tests.helpers import deliver, make_sender, migrate_to

MANY = 1_205  # more than the 1,000 newest failures the groups were once computed from
AMOUNT = "ValueError: amount <n> too big for <id>"
_NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _text(response: Any) -> str:
    """Return the body as text."""
    return response.get_data(as_text=True)


def _many_failures(app: Any, scope_id: int, n: int, *, prefix: str = "evt_m",
                   error: str = "ValueError: amount {i} too big for acct_{i}",
                   age: timedelta = timedelta(hours=1)) -> None:
    """Insert `n` failed receipts of one group, as a worker would have failed them."""
    svc = app.extensions["ledger"]
    at = svc.clock.now() - age
    keys = [f"{prefix}{i:05d}" for i in range(n)]
    with svc.engine.begin() as conn:
        conn.execute(insert(receipts), [
            {"scope_id": scope_id, "event_id": k, "event_type": "demo.credit", "state": 2,
             "attempts": 1, "accepted_at": at + timedelta(seconds=i),
             "completed_at": at + timedelta(seconds=i + 1), "body_sha256": b"\x01" * 32}
            for i, k in enumerate(keys)])
        conn.execute(insert(jobs), [
            {"scope_id": scope_id, "event_id": k, "event_type": "demo.credit",
             "accepted_at": at + timedelta(seconds=i), "run_at": at, "status": 1,
             "attempts": 1, "lease_token": 1, "payload": '{"data": {"amount": 1}}'}
            for i, k in enumerate(keys)])
        conn.execute(insert(attempts), [
            {"scope_id": scope_id, "event_id": k, "number": 1, "worker_id": "w-test",
             "lease_token": 1, "started_at": at, "finished_at": at, "outcome": "failed",
             "error": error.format(i=i)} for i, k in enumerate(keys)])
        for i, k in enumerate(keys):
            record_failure(conn, scope_id=scope_id, event_id=k, event_type="demo.credit",
                           error=error.format(i=i), failed_at=at + timedelta(seconds=i + 1))


def _group_rows(page: str) -> list[str]:
    """Return the rows of the (unmuted) groups table."""
    body = page.split('id="groups-table"')[1].split("<tbody>")[1].split("</tbody>")[0]
    return [row for row in body.split("</tr>") if "<tr" in row]


def _gid(page: str, text: str) -> str:
    """Return the id of the group whose row shows `text`."""
    return page.split(text)[0].rsplit('data-group="', 1)[1][:16]


def _requeue_group(client: Any, form: dict[str, str]) -> str:
    """Run a group's bulk requeue to its end, chunk by chunk as the page's htmx would."""
    answer = _text(post(client, "/failures/requeue-all", form, htmx=True))
    while "hx-vals=" in answer:
        carried = json.loads(html.unescape(re.search(r"hx-vals='([^']*)'", answer)[1]))
        answer = _text(post(client, "/failures/requeue-all", carried, htmx=True))
    return answer


def test_a_group_of_more_than_1000_failures_is_counted_and_requeued_whole(app) -> None:  # type: ignore[no-untyped-def]
    a = make_sender(app)
    b = make_sender(app, name="billing")
    _many_failures(app, a.scope_id, MANY)
    _many_failures(app, b.scope_id, 3, prefix="evt_b")
    add_receipt(app, a.scope_id, "evt_key", state=2, error="KeyError: 'customer'")
    viewer = logged_in(app, "viewer")
    page = _text(viewer.get("/failures/groups"))
    rows = _group_rows(page)
    assert len(rows) == 2
    assert AMOUNT.replace("<", "&lt;").replace(">", "&gt;") in rows[0]
    assert f">{MANY + 3}<" in rows[0] and "acme/billing" in rows[0]
    assert "acme/stripe-prod" in rows[0] and ">1<" in rows[1]
    assert f"{MANY + 4}</strong> failed receipts in <strong>2</strong> groups" in page
    assert "every failure, counted as each failed" in page

    oncall = logged_in(app, "oncall")
    gid = _gid(page, "ValueError: amount &lt;n&gt;")
    form = {"scope": "", "since": "", "until": "", "event_type": "demo.credit", "group": gid,
            "reason": "limit raised"}
    preview = _text(post(oncall, "/failures/requeue-all/preview", form, htmx=True))
    assert f"Requeue <strong>{MANY + 3}</strong> failed receipts" in preview
    done = _requeue_group(oncall, {**form, "total": str(MANY + 3)})
    assert f"Done: {MANY + 3} requeued" in done
    with app.extensions["ledger"].engine.connect() as conn:
        states = dict(conn.execute(select(receipts.c.state, func.count())
                                   .group_by(receipts.c.state)).all())
        audited = conn.execute(select(func.count()).select_from(audit_log).where(
            audit_log.c.action == "receipt.requeue", audit_log.c.reason == "limit raised")
        ).scalar_one()
        counters = conn.execute(select(failure_group_scopes.c.count)
                                .where(failure_group_scopes.c.group_id == gid)).all()
        members = conn.execute(select(func.count()).select_from(failure_members)).scalar_one()
    assert states == {0: MANY + 3, 2: 1}  # the other group's failure stays failed
    assert audited == MANY + 3
    assert counters == [] and members == 1  # every requeued member left its group
    after = _text(viewer.get("/failures/groups"))
    assert len(_group_rows(after)) == 1 and "KeyError" in after
    assert "1</strong> failed receipt in <strong>1</strong> group" in after


def test_muting_a_group_with_a_note_covers_every_member_and_is_audited(app) -> None:  # type: ignore[no-untyped-def]
    a = make_sender(app)
    _many_failures(app, a.scope_id, MANY)
    add_receipt(app, a.scope_id, "evt_key", state=2, error="KeyError: 'customer'")
    oncall = logged_in(app, "oncall")
    review = {"group_event_type": "demo.credit", "group_signature": AMOUNT, "scope": "",
              "event_type": "", "since": "", "until": ""}
    muted = _text(post(oncall, "/failures/groups/review",
                       {**review, "verdict": "mute", "note": "known: limit ticket OPS-7"},
                       htmx=True))
    assert "Group muted." in muted
    assert f"1 muted group ({MANY} failures)" in muted
    listed = muted.split('id="groups-table"')[1].split('id="muted-groups"')[0]
    assert "ValueError" not in listed and "KeyError" in listed
    assert "known: limit ticket OPS-7" in muted.split('id="muted-groups"')[1]
    with app.extensions["ledger"].engine.connect() as conn:
        entry = conn.execute(select(audit_log.c.action, audit_log.c.actor, audit_log.c.reason,
                                    audit_log.c.target)
                             .where(audit_log.c.action.like("failure_group.%"))).one()
    assert entry.action == "failure_group.muted" and entry.reason == "known: limit ticket OPS-7"
    assert entry.target == f"group:{group_id('demo.credit', AMOUNT)}"
    _many_failures(app, a.scope_id, 2, prefix="evt_late")  # later failures join the muted group
    page = _text(oncall.get("/failures/groups"))
    assert f"1 muted group ({MANY + 2} failures)" in page


@pytest.fixture
def one_attempt_app(test_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """The app with one attempt per job, so a demo.fail job fails terminally at once."""
    from app import create_app

    application = create_app({**test_env, "LEDGER_MAX_ATTEMPTS": "1"})
    yield application
    application.extensions["ledger"].close()


def _drain(app: Any) -> None:
    """Run the worker until no job is due."""
    while process_one(app.extensions["ledger"], "w-test"):
        pass


def _counts(app: Any) -> list[tuple[str, int]]:
    """Return (signature, count) of every group as the page's read gives them."""
    with app.extensions["ledger"].engine.connect() as conn:
        view = read_groups(conn, ReceiptFilter())
    return [(g.signature, g.count) for g in view.groups]


def test_a_worker_failure_joins_its_group_and_a_requeue_takes_it_out(one_attempt_app) -> None:  # type: ignore[no-untyped-def]
    app = one_attempt_app
    sender = make_sender(app)
    client = app.test_client()
    for n in range(3):
        assert deliver(client, sender, f"evt_f{n}", "demo.fail").status_code == 202
    _drain(app)
    [(signature, count)] = _counts(app)
    assert count == 3 and signature.startswith("DemoFailure")
    oncall = logged_in(app, "oncall")
    answer = post(oncall, "/failures/requeue",
                  {"scope": sender.scope, "event_id": "evt_f1", "reason": "try again"},
                  htmx=True)
    assert answer.status_code == 200
    assert _counts(app) == [(signature, 2)]  # pending again: no longer a failure
    _drain(app)  # it fails again, and counts again
    assert _counts(app) == [(signature, 3)]
    with app.extensions["ledger"].engine.connect() as conn:
        first, last = conn.execute(select(failure_group_scopes.c.first_seen,
                                          failure_group_scopes.c.last_seen)).one()
        latest = conn.execute(select(func.max(receipts.c.completed_at))).scalar_one()
    assert first < last == latest


def test_the_purge_takes_expired_failures_out_of_their_groups(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    a = make_sender(app)
    old = timedelta(seconds=svc.settings.retention_seconds + 86400)
    _many_failures(app, a.scope_id, 30, prefix="evt_old", age=old)
    _many_failures(app, a.scope_id, 4, prefix="evt_new")
    assert _counts(app) == [(AMOUNT, 34)]
    result = purge(svc.engine, svc.settings, svc.clock, batch_size=7)
    assert result.expired_receipts == 30
    assert _counts(app) == [(AMOUNT, 4)]
    with svc.engine.connect() as conn:
        first = conn.execute(select(failure_group_scopes.c.first_seen)).scalar_one()
        oldest_left = conn.execute(select(func.min(failure_members.c.failed_at))).scalar_one()
    assert first == oldest_left  # first seen moves on with the oldest failure left


def test_the_migration_groups_every_failure_already_there(empty_engine: Engine) -> None:
    engine = empty_engine
    migrate_to(engine, "0009_scope_totals")
    with engine.begin() as conn:
        conn.execute(insert(integrations).values(
            public_id="in_" + "a" * 22, account="acme", name="shop", profile="stripe",
            tolerance_seconds=300, sandbox=False, created_at=_NOW))
        sid = conn.execute(select(integrations.c.id)).scalar_one()
        rows = [(f"evt_{i}", 2, f"ValueError: amount {i} too big") for i in range(1203)]
        rows += [("evt_ok", 1, None), ("evt_key", 2, "KeyError: 'x'")]
        conn.execute(insert(receipts), [
            {"scope_id": sid, "event_id": e, "event_type": "demo.credit", "state": s,
             "attempts": 1, "accepted_at": _NOW, "completed_at": _NOW,
             "body_sha256": b"\x01" * 32} for e, s, _ in rows])
        conn.execute(insert(attempts), [
            {"scope_id": sid, "event_id": e, "number": 1, "worker_id": "w",
             "lease_token": 1, "started_at": _NOW, "finished_at": _NOW,
             "outcome": "failed" if error else "complete", "error": error}
            for e, _, error in rows])
    migrate_to(engine, "head")
    with engine.connect() as conn:
        view = read_groups(conn, ReceiptFilter())
    assert [(g.signature, g.count, g.scopes) for g in view.groups] == [
        ("ValueError: amount <n> too big", 1203, ["acme/shop"]),
        ("KeyError: 'x'", 1, ["acme/shop"])]
    assert view.total == 1204 and view.groups[0].first_seen == _NOW



def test_a_time_window_counts_its_own_failures_and_says_when_it_stopped(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    a = make_sender(app)
    _many_failures(app, a.scope_id, 6, prefix="evt_old", age=timedelta(days=2))
    _many_failures(app, a.scope_id, 4, prefix="evt_new")
    since = svc.clock.now() - timedelta(days=1)
    with svc.engine.connect() as conn:
        window = read_groups(conn, ReceiptFilter(since=since))
        capped = read_groups(conn, ReceiptFilter(since=since), scan=3)
    assert [(g.signature, g.count) for g in window.groups] == [(AMOUNT, 4)]
    assert window.windowed and not window.capped and window.total == 4
    assert capped.capped and capped.total == 3
    page = _text(logged_in(app, "viewer").get(
        f"/failures/groups?since={since.strftime('%Y-%m-%dT%H:%M')}"))
    assert "4</strong> failed receipts in <strong>1</strong> group" in page
    assert "every failure of this time window" in page
