"""The ledger on a real Citus cluster: a coordinator and two workers on loopback ports.

The cluster is started from the installed PostgreSQL binaries with the Citus
extension preloaded, migrated (`ledger db upgrade`) and distributed (`ledger db
distribute`) once for this module. Every test checks behaviour a user would
notice on such a cluster: deliveries answered and committed on one node in one
phase, a worker that processes everything, a purge that expires what it must
(or says it cannot), capacity over every shard, the dashboard, the API and the
drill. When Citus is not installed they are skipped, loudly (CI cannot build it).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select, text

from jobs.retention import PurgeImpossible, purge
from jobs.retention_scoped import _SCOPE_BATCH
from ledger.clock import FixedClock
from ledger.db import citus
from ledger.db.engine import make_engine
from ledger.db.schema import attempts, demo_balances, receipts
from ledger.intake.store import (
    _CLAIM_WITH_JOB,
    DriverClaim,
    NewEvent,
    claim_receipt,
    claim_unsigned_body,
    enqueue_job,
)
from ledger.reads.capacity import measure
from ledger.worker.loop import Worker
from ledger.worker.sql import DRIVER_COMPLETE_ONE
from ledger.worker.store import _DUE_BY_KEY, _DUE_KEYS
from tests.conftest import TEST_MASTER_KEY, _settings
from tests.dashboard_helpers import fast_hashes, logged_in, make_operator, make_token
from tests.helpers import deliver, make_sender
from tests.integration.citus_cluster import (
    CitusCluster,
    citus_missing,
    citus_skip_reason,
    note_skip,
)
from tests.integration.test_scope_keyed import captured_sql, keyed_by_scope, ledger_statements

__all__ = ["fast_hashes"]  # the autouse fixture: cheap password hashes here too

MISSING = citus_missing()
SKIP_REASON = citus_skip_reason()
if SKIP_REASON is not None:
    note_skip(SKIP_REASON)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CitusCluster]:
    """A coordinator and two workers, migrated and distributed with the ledger's commands."""
    if MISSING is not None:
        pytest.skip(f"Citus not installed: {MISSING}")
    nodes = CitusCluster(tmp_path_factory.mktemp("citus"))
    try:
        nodes.start()
        env = {"DATABASE_URL": nodes.url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY}
        for command in (["db", "upgrade"], ["db", "distribute", "--json"]):
            result = run_cli(env, *command)
            assert result.exit_code == 0, result.output
        yield nodes
    finally:
        nodes.drop()


@pytest.fixture
def citus_env(cluster: CitusCluster, tmp_path: Path) -> dict[str, str]:
    """The app's environment on the cluster's coordinator."""
    return {"DATABASE_URL": cluster.url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "test-secret-key",
            "LEDGER_DEMO_HANDLERS": "1", "LEDGER_REVOCATION_BOUND_SECONDS": "2"}


@pytest.fixture
def citus_app(citus_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """The web app on the distributed ledger."""
    from app import create_app

    application = create_app(citus_env)
    yield application
    application.extensions["ledger"].close()


@pytest.fixture
def one_connection(cluster: CitusCluster, tmp_path: Path) -> Iterator[Engine]:
    """An engine with a single connection: its backend's two-phase commits can be counted."""
    engine = make_engine(_settings(cluster.url, tmp_path), pool_size=1)
    yield engine
    engine.dispose()


def run_cli(env: dict[str, str], *args: str) -> Any:
    """Run `ledger ARGS` as the console script would, on an app built from `env`."""
    from app import create_app

    application = create_app(env)
    try:
        return application.test_cli_runner().invoke(args=["ledger", *args])
    finally:
        application.extensions["ledger"].close()


def _account() -> str:
    """Return a fresh account name: the module's tests share one database."""
    return f"acct-{uuid.uuid4().hex[:8]}"


def two_phase_commits(engine: Engine) -> int:
    """Count the two-phase commits the engine's one backend made (pg_dist_transaction).

    Citus names each prepared transaction citus_<group>_<coordinator pid>_<n>_<conn>
    and keeps a record per worker node (the recovery of records is switched off
    in these nodes' settings, so every one stays).
    """
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_dist_transaction WHERE gid LIKE :pattern"),
            {"pattern": f"citus\\_%\\_{pid}\\_%"}).scalar_one())


def explain(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> str:
    """Return the coordinator's EXPLAIN of one statement."""
    with engine.connect() as conn:
        return "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN {sql}"), params or {}))


def task_count(plan: str) -> int:
    """Return how many shard tasks a Citus plan runs (1 = routed to one node)."""
    found = re.search(r"Task Count: (\d+)", plan)
    assert found is not None, plan
    return int(found.group(1))


def new_event(scope_id: int, event_id: str) -> NewEvent:
    """Return a signed-id delivery ready to be claimed."""
    return NewEvent(scope_id=scope_id, event_id=event_id, event_type="demo.credit",
                    body_sha256=b"\x07" * 32, payload='{"data": {"amount": 1}}',
                    accepted_at=datetime.now(UTC))


def test_distribute_lays_out_every_table_and_a_second_run_changes_nothing(cluster):
    engine = create_engine(cluster.url)
    try:
        with engine.connect() as conn:
            layout = citus.layout(conn)
            shards = conn.execute(text(
                "SELECT count(DISTINCT nodeport) FROM pg_dist_shard_placement p "
                "JOIN pg_dist_shard s USING (shardid) WHERE s.logicalrelid = 'receipts'::regclass"
            )).scalar_one()
        assert layout.distributed and layout.problems() == []
        assert shards == 2  # the receipts' shards live on both workers
        env = {"DATABASE_URL": cluster.url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY}
        again = run_cli(env, "db", "distribute", "--json")
        assert again.exit_code == 0, again.output
        done = json.loads(again.stdout)
        assert done["distributed"] == [] and done["reference"] == []
        assert sorted(done["unchanged"]) == sorted(citus.DISTRIBUTED + citus.REFERENCE)
    finally:
        engine.dispose()


def test_distribute_on_a_database_without_citus_is_refused(pg_url):
    result = run_cli({"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY},
                     "db", "distribute")
    assert result.exit_code == 1
    assert "citus extension is not created" in result.output


def test_deliveries_are_answered_and_each_claim_commits_on_one_node(citus_app, one_connection):
    sender = make_sender(citus_app, account=_account())
    client = citus_app.test_client()
    assert [deliver(client, sender, f"evt_{i}").status_code for i in range(5)] == [202] * 5
    duplicate = deliver(client, sender, "evt_0")
    assert duplicate.status_code == 202 and duplicate.get_json()["event_id"] == "evt_0"
    assert deliver(client, sender, "evt_0", data={"amount": 9}).status_code == 409

    claim = DriverClaim(one_connection)
    assert claim.distributed
    before = two_phase_commits(one_connection)
    for i in range(20):
        assert claim.claim(new_event(sender.scope_id, f"direct_{i}")) == (True, None)
    taken, outcome = claim.claim(new_event(sender.scope_id, "direct_0"))
    assert not taken and outcome is not None
    assert two_phase_commits(one_connection) == before  # 21 claims, no PREPARE TRANSACTION

    # The unsigned-id path (GitHub): receipt, body digest and job in one engine transaction.
    event = new_event(sender.scope_id, "unsigned_0")
    with one_connection.begin() as conn:
        assert claim_receipt(conn, event) and claim_unsigned_body(conn, event)
        enqueue_job(conn, event)
    assert two_phase_commits(one_connection) == before


def test_the_old_one_statement_claim_would_commit_in_two_phases(cluster, one_connection):
    """The measure above can see a two-phase commit: the CTE claim makes one per node."""
    sql = _CLAIM_WITH_JOB.compile(dialect=one_connection.dialect).string
    before = two_phase_commits(one_connection)
    with one_connection.connect() as conn:
        driver = conn.connection.driver_connection
        driver.execute(sql, {"scope_id": 987654, "event_id": "old-way", "event_type": "t",
                             "accepted_at": datetime.now(UTC), "body_sha256": b"\x01" * 32,
                             "payload": "{}", "content_type": None, "raw_body": None})
        driver.commit()
    assert two_phase_commits(one_connection) - before == len(cluster.workers)


def test_intake_statements_route_to_one_node(citus_app):
    engine = citus_app.extensions["ledger"].engine
    claim = DriverClaim(engine)
    receipt_sql, job_sql, outcome_sql = claim.statements
    with engine.connect() as conn:  # EXPLAIN of an INSERT runs nothing
        for sql, values in ((receipt_sql, (datetime.now(UTC), 5, "x", "t", b"\x01")),
                            (job_sql, (5, "x", "t", datetime.now(UTC), datetime.now(UTC), "{}",
                                       None, None)),
                            (outcome_sql, (5, "x"))):
            plan = "\n".join(r[0] for r in conn.connection.driver_connection.execute(
                "EXPLAIN " + sql, values))
            assert task_count(plan) == 1, plan
        conn.rollback()


def _deliver_across_scopes(app: Any, scopes: int, per_scope: int) -> list[Any]:
    """Create `scopes` integrations and deliver `per_scope` events to each."""
    client = app.test_client()
    account = _account()
    senders = [make_sender(app, account=account, name=f"s{i}") for i in range(scopes)]
    for sender in senders:
        for i in range(per_scope):
            assert deliver(client, sender, f"evt_{i}").status_code == 202
    return senders


def _balances(engine: Engine, scope_ids: list[int]) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(demo_balances.c.scope_id, demo_balances.c.balance)
                                 .where(demo_balances.c.scope_id.in_(scope_ids))).all())


def test_the_worker_processes_every_job_and_commits_each_on_one_node(citus_app,
                                                                     one_connection):
    senders = _deliver_across_scopes(citus_app, scopes=6, per_scope=4)
    svc = citus_app.extensions["ledger"]
    worker = Worker(svc, worker_id="citus-w", engine=one_connection)
    before = two_phase_commits(one_connection)
    processed = 0
    while worker.process_one():
        processed += 1
    assert processed >= 24
    assert two_phase_commits(one_connection) == before  # claims and completions: one phase
    ids = [s.scope_id for s in senders]
    assert _balances(svc.engine, ids) == dict.fromkeys(ids, 4)
    with svc.engine.connect() as conn:
        states = conn.execute(select(receipts.c.state, func.count())
                              .where(receipts.c.scope_id.in_(ids))
                              .group_by(receipts.c.state)).all()
    assert states == [(1, 24)]


def test_the_worker_loop_runs_on_citus(citus_app):
    """`ledger worker --burst` (threads, the chained loop) drains the queue."""
    senders = _deliver_across_scopes(citus_app, scopes=3, per_scope=5)
    from ledger.worker.loop import run_worker

    assert run_worker(citus_app.extensions["ledger"], burst=True, concurrency=2) >= 15
    ids = [s.scope_id for s in senders]
    assert _balances(citus_app.extensions["ledger"].engine, ids) == dict.fromkeys(ids, 5)


def _driver_plan(conn: Any, statement: Any, **values: Any) -> str:
    """Return the EXPLAIN of a SQLAlchemy statement, its parameters bound by the driver."""
    compiled = statement.compile(dialect=conn.dialect)
    params = {**compiled.params, **values}
    return "\n".join(r[0] for r in conn.connection.driver_connection.execute(
        "EXPLAIN " + compiled.string, params))


def test_worker_claim_and_completion_plans_are_routed(citus_app):
    engine = citus_app.extensions["ledger"].engine
    now = datetime.now(UTC)
    with engine.connect() as conn:
        locking = _driver_plan(conn, _DUE_BY_KEY, now=now, sid=3, eid="e")
        keys = _driver_plan(conn, _DUE_KEYS, now=now)
        complete = _driver_plan(conn, DRIVER_COMPLETE_ONE.statement, sid=3, eid="e", token=1,
                                now=now, complete=1, ref="r", number=1)
        conn.rollback()
    assert task_count(locking) == 1 and "LockRows" in locking, locking
    assert task_count(complete) == 1, complete
    # The unlocked read of due keys: a few rows from each shard's due index.
    assert task_count(keys) == 32 and "ix_jobs_due" in keys, keys
    assert "Limit" in keys[keys.index("Task"):], keys  # the LIMIT runs on the shards


def test_every_locking_or_writing_statement_names_one_scope(citus_app):
    """On Citus only the worker's unlocked read of due keys spans scopes."""
    senders = _deliver_across_scopes(citus_app, scopes=2, per_scope=2)
    svc = citus_app.extensions["ledger"]
    with captured_sql(svc.engine) as statements:
        while Worker(svc, worker_id="keyed").process_one():
            pass
        deliver(citus_app.test_client(), senders[0], "evt_0")  # a duplicate
    touched = ledger_statements(statements)
    touched += [" ".join(s.split()).lower() for s in DriverClaim(svc.engine).statements]
    touched.append(" ".join(DRIVER_COMPLETE_ONE.sql(svc.engine.dialect).split()).lower())
    unkeyed = [s for s in touched if not keyed_by_scope(s)]
    assert unkeyed and all(s.startswith("select") and "for update" not in s
                           for s in unkeyed), unkeyed
    assert {s.split(" from ")[1].split()[0] for s in unkeyed} == {"jobs"}  # the due keys


def _seed_old(engine: Engine, scope_id: int, count: int, at: datetime) -> None:
    """Insert `count` complete receipts (with an attempt each) accepted at `at`."""
    with engine.begin() as conn:
        for i in range(count):
            conn.execute(insert(receipts).values(
                scope_id=scope_id, event_id=f"old_{i}", event_type="demo.credit", state=1,
                attempts=1, accepted_at=at, completed_at=at + timedelta(seconds=1),
                body_sha256=b"\x01" * 32, result_ref="credit:1"))
            conn.execute(insert(attempts).values(
                scope_id=scope_id, event_id=f"old_{i}", number=1, worker_id="w",
                lease_token=1, started_at=at, finished_at=at, outcome="complete"))


def test_the_purge_expires_receipts_scope_by_scope(citus_app):
    svc = citus_app.extensions["ledger"]
    now = datetime.now(UTC)
    old = now - timedelta(seconds=svc.settings.retention_seconds + 3600)
    scopes = [990_001, 990_002, 990_003]
    for scope in scopes:
        _seed_old(svc.engine, scope, 7, old)
    _deliver_across_scopes(citus_app, scopes=1, per_scope=2)  # recent: they stay
    result = purge(svc.engine, svc.settings, FixedClock(now), batch_size=3)
    assert result.expired_receipts >= 21
    with svc.engine.connect() as conn:
        for table in (receipts, attempts):
            left = conn.execute(select(func.count()).select_from(table)
                                .where(table.c.scope_id.in_(scopes))).scalar_one()
            assert left == 0, table.name
        assert conn.execute(select(func.count()).select_from(receipts)).scalar_one() >= 2
        plan = "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN {_SCOPE_BATCH.text}"), {
            "scope": scopes[0], "cutoff": now, "batch": 3}))
    assert task_count(plan) == 1, plan  # each batch runs on its scope's node alone


def test_a_half_distributed_ledger_makes_the_purge_fail_loudly(citus_app, cluster):
    svc = citus_app.extensions["ledger"]
    with svc.engine.begin() as conn:
        conn.execute(text("SELECT undistribute_table('conflicts')"))
    try:
        with pytest.raises(PurgeImpossible, match="conflicts is local"):
            purge(svc.engine, svc.settings, FixedClock(datetime.now(UTC)))
        env = {"DATABASE_URL": cluster.url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY}
        result = run_cli(env, "purge", "--json")
        assert result.exit_code == 1 and "partly distributed" in result.output
    finally:
        done = citus.distribute(svc.engine)  # idempotent: finishes the layout
    assert done["distributed"] == ["conflicts"]


def test_a_purge_that_leaves_expired_receipts_behind_says_so(citus_app, monkeypatch):
    """Were the per-scope deletes to miss rows, the purge fails instead of reporting 0."""
    import jobs.retention_scoped

    svc = citus_app.extensions["ledger"]
    now = datetime.now(UTC)
    _seed_old(svc.engine, 990_009, 2, now - timedelta(seconds=svc.settings.retention_seconds
                                                       + 3600))
    monkeypatch.setattr(jobs.retention_scoped, "scope_batch",
                        lambda *_a, **_k: dict.fromkeys(("receipts", "attempts", "jobs",
                                                         "unsigned_bodies", "conflicts"), 0))
    with pytest.raises(PurgeImpossible, match=r"\d+ expired receipts are still there"):
        purge(svc.engine, svc.settings, FixedClock(now))
    monkeypatch.undo()
    assert purge(svc.engine, svc.settings, FixedClock(now)).expired_receipts >= 2


def test_capacity_counts_every_shard(citus_app):
    _deliver_across_scopes(citus_app, scopes=2, per_scope=3)
    svc = citus_app.extensions["ledger"]
    figures = measure(svc.engine, svc.settings)
    with svc.engine.connect() as conn:
        total = conn.execute(text("SELECT citus_total_relation_size('receipts')")).scalar_one()
        shell = conn.execute(text("SELECT pg_total_relation_size('receipts')")).scalar_one()
    assert figures["bytes_per_receipt_measured"] == round(total / figures["receipts"], 1)
    assert total > shell


def test_dashboard_api_and_drill_work_on_citus(citus_app):
    from ledger.cli.drill_cmds import local_server
    from ledger.drill.run import run_drill

    sender = make_sender(citus_app, account=_account())
    deliver(citus_app.test_client(), sender, "evt_dash")
    client = logged_in(citus_app, "admin", username=f"admin-{uuid.uuid4().hex[:6]}")
    for path in ("/", "/receipts", "/stuck", "/failures", "/conflicts", "/operators"):
        assert client.get(path).status_code == 200, path
    viewer = f"api-{uuid.uuid4().hex[:6]}"
    make_operator(citus_app, viewer, "viewer")
    token = make_token(citus_app, viewer)
    listed = citus_app.test_client().get(
        f"/api/v1/receipts?scope={sender.scope}", headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 200 and len(listed.get_json()["items"]) == 1
    with local_server(citus_app) as url:
        report = run_drill(url, citus_app.extensions["ledger"])
    assert report.to_json()["passed"] is True, report.to_json()


def _two_terminal_failures(application: Any, event_id: str) -> list[Any]:
    """Deliver a `demo.fail` event to two new scopes and let a worker fail both for good
    (the app runs with LEDGER_MAX_ATTEMPTS=1); return their senders."""
    senders = [make_sender(application, account=_account()) for _ in range(2)]
    for sender in senders:
        assert deliver(application.test_client(), sender, event_id,
                       "demo.fail").status_code == 202
    worker = Worker(application.extensions["ledger"], worker_id=f"citus-{event_id}")
    while worker.process_one():
        pass
    return senders


def test_failures_are_grouped_and_requeued_on_citus(citus_env):
    """A terminal failure stores its group on its scope's node; the pages read the groups,
    the delivery log and the health charts; a requeue takes the member out of its group."""
    from app import create_app
    from ledger.access import audit
    from ledger.db.schema import failure_group_scopes, failure_members
    from ledger.worker.requeue import requeue_receipt

    application = create_app({**citus_env, "LEDGER_MAX_ATTEMPTS": "1"})
    try:
        svc = application.extensions["ledger"]
        senders = _two_terminal_failures(application, "evt_fails")
        ids = [s.scope_id for s in senders]
        with svc.engine.connect() as conn:
            failed = conn.execute(select(func.count()).select_from(receipts).where(
                receipts.c.scope_id.in_(ids), receipts.c.state == 2)).scalar_one()
            members = conn.execute(select(func.count()).select_from(failure_members).where(
                failure_members.c.scope_id.in_(ids))).scalar_one()
            counted = conn.execute(select(func.sum(failure_group_scopes.c.count)).where(
                failure_group_scopes.c.scope_id.in_(ids))).scalar_one()
        assert (failed, members, counted) == (2, 2, 2)
        client = logged_in(application, "admin", username=f"admin-{uuid.uuid4().hex[:6]}")
        groups = client.get("/failures/groups")
        assert groups.status_code == 200 and "demo.fail" in groups.get_data(as_text=True)
        for path in ("/deliveries", f"/credentials/{senders[0].public_id}/health"):
            assert client.get(path).status_code == 200, path
        with svc.engine.begin() as conn:
            requeue_receipt(conn, audit.Actor(name="test", role="admin"),
                            scope=senders[0].scope, event_id="evt_fails",
                            reason="fixed downstream", now=svc.clock.now())
        with svc.engine.connect() as conn:
            left = conn.execute(select(failure_members.c.scope_id).where(
                failure_members.c.scope_id.in_(ids))).scalars().all()
        assert left == [senders[1].scope_id]
    finally:
        application.extensions["ledger"].close()


def test_the_failure_group_sweep_runs_on_citus(citus_env):
    """The scheduled sweep corrects a group on a distributed ledger: a failed receipt
    removed behind the groups' back leaves its group; the other failure stays counted."""
    from app import create_app
    from jobs import sweep
    from ledger.db.schema import failure_group_scopes, failure_members

    application = create_app({**citus_env, "LEDGER_MAX_ATTEMPTS": "1"})
    try:
        svc = application.extensions["ledger"]
        senders = _two_terminal_failures(application, "evt_swept")
        ids = [s.scope_id for s in senders]
        gone = senders[0].scope_id
        with svc.engine.begin() as conn:  # a repair outside the ledger's own paths
            for table in (attempts, receipts):
                conn.execute(table.delete().where(table.c.scope_id == gone,
                                                  table.c.event_id == "evt_swept"))
        for _ in range(10):  # bounded steps; each run goes on from its mark
            sweep.run(svc.engine, svc.settings, svc.clock)
        with svc.engine.connect() as conn:
            members = conn.execute(select(failure_members.c.scope_id).where(
                failure_members.c.scope_id.in_(ids))).scalars().all()
            counters = dict(conn.execute(select(
                failure_group_scopes.c.scope_id, failure_group_scopes.c.count).where(
                failure_group_scopes.c.scope_id.in_(ids))).all())
        assert members == [senders[1].scope_id]
        assert counters == {senders[1].scope_id: 1}
    finally:
        application.extensions["ledger"].close()


def test_the_rollups_count_failures_and_follow_a_requeue_on_citus(citus_env):
    """The rollups on a distributed ledger: a full run counts two terminal failures per
    scope and hour (the failed receipts grouped on their nodes, compared with the stored
    cells of the reference tables); after a requeue, the next run steps from its mark and
    lowers that cell and that scope's figures alone."""
    from app import create_app
    from jobs import rollups
    from ledger.access import audit
    from ledger.clock import FixedClock
    from ledger.db.schema import hourly_series, scope_counts
    from ledger.worker.requeue import requeue_receipt

    application = create_app({**citus_env, "LEDGER_MAX_ATTEMPTS": "1"})
    try:
        svc = application.extensions["ledger"]
        senders = _two_terminal_failures(application, "evt_rolled")
        ids = [s.scope_id for s in senders]

        def figures() -> tuple[dict[tuple[int, int], int], dict[int, tuple[int, int]]]:
            with svc.engine.connect() as conn:
                counts = {(s, st): int(n) for s, st, n in conn.execute(select(
                    scope_counts.c.scope_id, scope_counts.c.state, scope_counts.c.count)
                    .where(scope_counts.c.scope_id.in_(ids)))}
                cells = {s: (int(a), int(f)) for s, a, f in conn.execute(select(
                    hourly_series.c.scope_id, func.sum(hourly_series.c.accepted),
                    func.sum(hourly_series.c.failed))
                    .where(hourly_series.c.scope_id.in_(ids))
                    .group_by(hourly_series.c.scope_id))}
            return counts, cells

        now = datetime.now(UTC)
        rollups.refresh(svc.engine, FixedClock(now), full_series=True, full_counts=True)
        assert figures() == ({(ids[0], 2): 1, (ids[1], 2): 1}, {ids[0]: (1, 1), ids[1]: (1, 1)})
        with svc.engine.begin() as conn:
            requeue_receipt(conn, audit.Actor(name="test", role="admin"),
                            scope=senders[0].scope, event_id="evt_rolled",
                            reason="fixed downstream", now=now)
        rollups.refresh(svc.engine, FixedClock(now + timedelta(minutes=1)))
        assert figures() == ({(ids[0], 0): 1, (ids[1], 2): 1}, {ids[0]: (1, 0), ids[1]: (1, 1)})
    finally:
        application.extensions["ledger"].close()


def test_an_event_is_forwarded_to_its_destination_on_citus(citus_env):
    """A destination's admission, send, record and completion on the distributed ledger."""
    from app import create_app
    from ledger.access import audit
    from ledger.access.integrations import get_integration
    from ledger.destinations.addresses import AddressPolicy
    from ledger.destinations.store import DestinationSettings, create_destination
    from ledger.reads.receipts import get_receipt
    from tests.receivers import Answer, receiving

    app = create_app({**citus_env, "LEDGER_DEMO_HANDLERS": "0",
                      "LEDGER_DESTINATION_ALLOW": "127.0.0.1"})
    svc = app.extensions["ledger"]
    try:
        sender = make_sender(app, account=_account(), name="shop")
        with receiving() as (url, found):
            found.default = Answer(status=200)
            with svc.engine.begin() as conn:
                create_destination(
                    conn, svc.box, audit.Actor(name="test", role="admin"),
                    get_integration(conn, sender.public_id),
                    DestinationSettings(url=url + "/in", event_types=["demo.credit"]),
                    policy=AddressPolicy.from_entries(["127.0.0.1"]), handled_types=(),
                    now=svc.clock.now())
            for n in range(3):
                assert deliver(app.test_client(), sender, f"evt_fwd_{n}").status_code == 202
            worker = Worker(svc, worker_id="citus-fwd", batch_size=4)
            assert worker.run(burst=True) >= 3  # the shared cluster may hold other tests' jobs
            assert sorted(r.headers["idempotency-key"] for r in found.requests) == [
                f"{sender.scope}:evt_fwd_{n}" for n in range(3)]
        with svc.engine.connect() as conn:
            done = [get_receipt(conn, sender.scope, f"evt_fwd_{n}") for n in range(3)]
        assert {(r.state.value, r.result_ref) for r in done} == {("complete", "http:200")}
    finally:
        svc.close()
