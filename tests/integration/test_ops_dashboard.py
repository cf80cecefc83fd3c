"""Issue 17 (ops): live instances, honest stuck work, failure groups and the header search,
per page, role and action, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, insert, select, update

from jobs.credential_jobs import check_revocation_propagation
from ledger.access import audit
from ledger.access.credentials import revoke_credential
from ledger.db.schema import (
    attempts,
    audit_log,
    failure_groups,
    findings,
    instances,
    jobs,
    receipts,
)
from ledger.scheduling.instances import InstanceKind, registered
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    post,
)
from tests.helpers import deliver, make_sender


def _text(response: Any) -> str:
    """Return the body as text."""
    return response.get_data(as_text=True)


def _instance(app: Any, iid: str, kind: str, *, age: float, refreshed_age: float | None = None
              ) -> None:
    """Register an instance whose last heartbeat is `age` seconds old."""
    svc = app.extensions["ledger"]
    svc.heartbeat.disable()  # only the rows a test writes: not the test process itself
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        conn.execute(insert(instances).values(
            id=iid, kind=kind, hostname=iid.split(":")[0], pid=int(iid.split(":")[1]),
            started_at=now - timedelta(seconds=age), heartbeat_at=now - timedelta(seconds=age),
            credentials_refreshed_at=None if refreshed_age is None
            else now - timedelta(seconds=refreshed_age)))


# --- every process is an instance -------------------------------------------------------------

def test_overview_counts_live_instances_per_kind_and_greys_out_dead_ones(app) -> None:  # type: ignore[no-untyped-def]
    _instance(app, "web-a:1:x", "web", age=1, refreshed_age=1)
    _instance(app, "seed-b:2:x", "web", age=3600, refreshed_age=3600)  # a dead web process
    _instance(app, "sched-c:3:x", "scheduler", age=2)
    client = logged_in(app, "viewer")
    page = _text(client.get("/"))
    assert "1 web" in page and "0 worker" in page and "1 scheduler" in page
    dead_row = page.split("seed-b:2")[0].rsplit("<tr", 1)[1]
    assert 'class="dead"' in dead_row and "dead (not counted)" in page
    assert "Work is due and no worker is alive" not in page  # nothing is due
    api = client.get("/api/v1/overview").get_json()
    assert api["live_instances"] == {"web": 1, "worker": 0, "scheduler": 1}


def test_overview_warns_when_work_is_due_and_no_worker_is_alive(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    deliver(app.test_client(), sender, "evt_due")
    _instance(app, "old-w:9:x", "worker", age=600)  # a worker that died
    client = logged_in(app, "viewer")
    assert "Work is due and no worker is alive" in _text(client.get("/"))
    _instance(app, "new-w:10:x", "worker", age=1)
    page = _text(client.get("/"))
    assert "Work is due and no worker is alive" not in page and "1 worker" in page


def test_a_worker_registers_while_it_runs_and_deregisters_when_it_stops(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]

    def kinds() -> list[str]:
        with svc.engine.connect() as conn:
            return list(conn.execute(select(instances.c.kind)).scalars())

    with registered(svc.engine, svc.clock, InstanceKind.WORKER, interval=60) as me:
        assert kinds() == ["worker"] and me.instance_id
    assert kinds() == []


def test_cli_commands_never_register_as_web_instances(app, runner) -> None:  # type: ignore[no-untyped-def]
    result = runner.invoke(args=["ledger", "demo", "seed"])
    assert result.exit_code == 0, result.output
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(instances)).scalar_one() == 0


def test_revocation_lag_ignores_dead_instances_and_workers(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        revoke_credential(conn, audit.Actor(name="t", role="admin"), sender.key_id,
                          reason="leak", now=now - timedelta(seconds=120))
    _instance(app, "web-live:1:x", "web", age=1, refreshed_age=600)  # stale view: lagging
    _instance(app, "web-dead:2:x", "web", age=600, refreshed_age=600)
    _instance(app, "worker-live:3:x", "worker", age=1)
    assert check_revocation_propagation(svc.engine, svc.settings, svc.clock) == 1
    with svc.engine.connect() as conn:
        subjects = list(conn.execute(select(findings.c.subject)
                                     .where(findings.c.resolved_at.is_(None))).scalars())
    assert subjects == ["web-live:1:x"]


# --- honest stuck work --------------------------------------------------------------------------

def _job_state(app: Any, scope_id: int, event_id: str, **values: Any) -> None:
    """Set a job's columns directly (what a worker's attempts would have left)."""
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.scope_id == scope_id, jobs.c.event_id == event_id)
                     .values(**values))


def test_stuck_page_tells_retrying_from_stuck_with_reasons(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    _instance(app, "w:1:x", "worker", age=1)
    add_receipt(app, sender.scope_id, "evt_retry", state=0, accepted_at=now - timedelta(hours=5))
    _job_state(app, sender.scope_id, "evt_retry", attempts=3, run_at=now + timedelta(minutes=4),
               accepted_at=now - timedelta(minutes=2))  # requeued 2 minutes ago
    with svc.engine.begin() as conn:
        conn.execute(insert(attempts).values(
            scope_id=sender.scope_id, event_id="evt_retry", number=3, worker_id="w:1:x",
            lease_token=3, started_at=now, finished_at=now, outcome="error",
            error="TimeoutError: downstream took 31 s"))
    add_receipt(app, sender.scope_id, "evt_lease", state=0, accepted_at=now - timedelta(hours=1))
    _job_state(app, sender.scope_id, "evt_lease", attempts=1, leased_by="gone:7:x",
               leased_until=now - timedelta(minutes=10), run_at=now - timedelta(minutes=10))
    add_receipt(app, sender.scope_id, "evt_idle", state=0, accepted_at=now - timedelta(hours=1))
    add_receipt(app, sender.scope_id, "evt_orphan", state=0,
                accepted_at=now - timedelta(hours=1))
    with svc.engine.begin() as conn:
        conn.execute(jobs.delete().where(jobs.c.event_id == "evt_orphan"))
    page = _text(logged_in(app, "viewer").get("/stuck"))
    stuck, retrying = page.split('id="retrying-table"')
    assert "evt_retry" not in stuck and "evt_retry" in retrying
    row = retrying.split("evt_retry")[2].split("</tr>")[0]
    assert "3 of 8" in row and "TimeoutError: downstream took 31 s" in row
    assert "since requeue" in row and "2m" in row and "in 3m" in row
    for event_id, reason in (("evt_lease", "lease expired, not retaken"),
                             ("evt_idle", "due, unclaimed"),
                             ("evt_orphan", "pending without a job")):
        cells = stuck.split(f">{event_id}<")[1].split("</tr>")[0]
        assert reason in cells, event_id
    assert "gone:7:x" in stuck
    api = logged_in(app, "viewer", "v2").get("/api/v1/stuck").get_json()
    assert {i["event_id"]: i["reason"] for i in api["stuck"]} == {
        "evt_lease": "lease expired, not retaken", "evt_idle": "due, unclaimed",
        "evt_orphan": "pending without a job"}
    assert [i["event_id"] for i in api["retrying"]] == ["evt_retry"]
    assert api["live_workers"] == 1


# --- failure groups ---------------------------------------------------------------------------

def _failures(app: Any) -> tuple[Any, Any]:
    """Two scopes; five failures in two groups and one of another event type."""
    a = make_sender(app)
    b = make_sender(app, name="billing")
    add_receipt(app, a.scope_id, "evt_1", state=2, error="ValueError: amount 7 too big for acct_42")
    add_receipt(app, a.scope_id, "evt_2", state=2,
                error="ValueError: amount 900 too big for acct_43")
    add_receipt(app, b.scope_id, "evt_3", state=2, error="ValueError: amount 12 too big for acct_9")
    add_receipt(app, a.scope_id, "evt_4", state=2, error="KeyError: 'customer'")
    add_receipt(app, b.scope_id, "evt_5", state=2, event_type="demo.fail",
                error="ValueError: amount 7 too big for acct_42")
    return a, b


def test_failure_groups_group_by_type_and_signature(app) -> None:  # type: ignore[no-untyped-def]
    _failures(app)
    viewer = logged_in(app, "viewer")
    response = viewer.get("/failures/groups")
    assert response.status_code == 200
    page = _text(response)
    rows = page.split('id="groups-table"')[1].split("<tbody>")[1].split("</tbody>")[0]
    assert rows.count("<tr") == 3
    first = rows.split("</tr>")[0]  # the largest group first
    assert "ValueError: amount &lt;n&gt; too big for &lt;id&gt;" in first
    assert ">3<" in first and "acme/billing" in first and "acme/stripe-prod" in first
    assert "Requeue group" not in page and "Mute" not in page  # a viewer only reads
    assert "Flat list of every failure" in page
    assert "5</strong> failed receipts in <strong>3</strong> groups" in page
    assert "Grouped by error" in _text(viewer.get("/failures"))


def test_oncall_requeues_one_group_with_a_reason_and_each_is_audited(app) -> None:  # type: ignore[no-untyped-def]
    _failures(app)
    oncall = logged_in(app, "oncall")
    page = _text(oncall.get("/failures/groups"))
    gid = page.split("ValueError: amount &lt;n&gt; too big")[0].rsplit('data-group="', 1)[1][:16]
    form = {"scope": "", "since": "", "until": "", "event_type": "demo.credit", "group": gid}
    refused = post(oncall, "/failures/requeue-all/preview", {**form, "reason": ""}, htmx=True)
    assert refused.status_code == 400 and "A reason is required" in _text(refused)
    preview = post(oncall, "/failures/requeue-all/preview", {**form, "reason": "fixed limit"},
                   htmx=True)
    assert "Requeue <strong>3</strong> failed receipts" in _text(preview)
    done = post(oncall, "/failures/requeue-all", {**form, "reason": "fixed limit", "total": "3"},
                htmx=True)
    assert "Done: 3 requeued" in _text(done)
    with app.extensions["ledger"].engine.connect() as conn:
        states = dict(conn.execute(select(receipts.c.event_id, receipts.c.state)).all())
        audited = sorted(conn.execute(select(audit_log.c.target).where(
            audit_log.c.action == "receipt.requeue", audit_log.c.reason == "fixed limit"))
            .scalars())
    assert states == {"evt_1": 0, "evt_2": 0, "evt_3": 0, "evt_4": 2, "evt_5": 2}
    assert audited == ["acme/billing:evt_3", "acme/stripe-prod:evt_1", "acme/stripe-prod:evt_2"]
    viewer = logged_in(app, "viewer")
    assert post(viewer, "/failures/requeue-all/preview", {**form, "reason": "x"}).status_code \
        == 403


def test_groups_are_acknowledged_or_muted_with_a_note_and_audited(app) -> None:  # type: ignore[no-untyped-def]
    _failures(app)
    oncall = logged_in(app, "oncall")
    group = {"group_event_type": "demo.credit", "group_signature": "KeyError: 'customer'",
             "scope": "", "event_type": "", "since": "", "until": ""}
    no_note = post(oncall, "/failures/groups/review", {**group, "verdict": "mute", "note": ""},
                   htmx=True)
    assert no_note.status_code == 409 and "a note is required" in _text(no_note)
    ack = post(oncall, "/failures/groups/review",
               {**group, "verdict": "acknowledge", "note": "ticket OPS-12"}, htmx=True)
    assert ack.status_code == 200 and "Group acknowledged" in _text(ack)
    assert "ticket OPS-12" in _text(ack) and "acknowledged</span>" in _text(ack)
    muted = post(oncall, "/failures/groups/review",
                 {**group, "verdict": "mute", "note": "known, harmless"}, htmx=True)
    body = _text(muted)
    assert 'id="muted-groups"' in body and "1 muted group" in body
    listed = body.split('id="groups-table"')[1].split('id="muted-groups"')[0]
    assert "KeyError" not in listed
    with app.extensions["ledger"].engine.connect() as conn:
        actions = list(conn.execute(select(audit_log.c.action, audit_log.c.reason)
                                    .where(audit_log.c.action.like("failure_group.%"))
                                    .order_by(audit_log.c.id)).all())
        stored = conn.execute(select(failure_groups.c.state, failure_groups.c.note)).all()
    assert [tuple(a) for a in actions] == [("failure_group.acknowledged", "ticket OPS-12"),
                                           ("failure_group.muted", "known, harmless")]
    assert [tuple(s) for s in stored] == [("muted", "known, harmless")]
    cleared = post(oncall, "/failures/groups/review",
                   {**group, "verdict": "clear", "note": "fixed upstream"}, htmx=True)
    assert 'id="muted-groups"' not in _text(cleared)
    assert post(oncall, "/failures/groups/review", {**group, "verdict": "drop", "note": "x"},
                htmx=True).status_code == 400
    viewer = logged_in(app, "viewer")
    assert post(viewer, "/failures/groups/review",
                {**group, "verdict": "mute", "note": "x"}).status_code == 403


# --- search -------------------------------------------------------------------------------------

def test_search_lands_on_the_page_the_query_names(app) -> None:  # type: ignore[no-untyped-def]
    acme = make_sender(app)
    billing = make_sender(app, name="billing")
    globex = make_sender(app, account="globex", name="shop")
    client = app.test_client()
    deliver(client, acme, "evt_shared")
    deliver(client, globex, "evt_shared")
    deliver(client, billing, "evt_only_billing")
    viewer = logged_in(app, "viewer")
    assert 'role="search"' in _text(viewer.get("/"))

    def lands(q: str) -> str:
        response = viewer.get("/search", query_string={"q": q})
        assert response.status_code == 303, (q, response.status_code)
        return response.headers["Location"]

    assert lands("evt_only_billing") == f"/receipts/{billing.public_id}/evt_only_billing"
    assert lands("globex") == "/receipts?scope=globex"
    assert lands("billing") == "/receipts?scope=acme/billing"
    assert lands(globex.public_id) == "/receipts?scope=globex/shop"
    assert lands("acme/stripe-prod") == "/receipts?scope=acme/stripe-prod"
    both = viewer.get("/search", query_string={"q": "evt_shared"})
    assert both.status_code == 200
    assert f"/receipts/{acme.public_id}/evt_shared" in _text(both)
    assert f"/receipts/{globex.public_id}/evt_shared" in _text(both)
    missing = viewer.get("/search", query_string={"q": "nothing-here"})
    assert missing.status_code == 404 and "Nothing matches" in _text(missing)
    # A NUL is refused at the input boundary (ledger/web/input_guard.py), before the search.
    assert viewer.get("/search", query_string={"q": "\x00<script>"}).status_code == 400


def test_the_scope_filter_takes_an_account_alone(app) -> None:  # type: ignore[no-untyped-def]
    acme = make_sender(app)
    billing = make_sender(app, name="billing")
    globex = make_sender(app, account="globex", name="shop")
    client = app.test_client()
    for sender, event_id in ((acme, "evt_a"), (billing, "evt_b"), (globex, "evt_g")):
        deliver(client, sender, event_id)
    viewer = logged_in(app, "viewer")
    page = _text(viewer.get("/receipts", query_string={"scope": "acme"}))
    assert "evt_a" in page and "evt_b" in page and "evt_g" not in page
    prefixed = _text(viewer.get("/receipts", query_string={"scope": "acme", "prefix": "evt_"}))
    assert "evt_a" in prefixed and "evt_b" in prefixed and "evt_g" not in prefixed
    api = viewer.get("/api/v1/receipts", query_string={"scope": "globex"}).get_json()
    assert [i["event_id"] for i in api["items"]] == ["evt_g"]
    unknown = viewer.get("/receipts", query_string={"scope": "initech"})
    assert unknown.status_code == 400 and "no such scope or account: initech" in _text(unknown)
