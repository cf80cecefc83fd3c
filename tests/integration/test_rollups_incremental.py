"""Incremental rollups (jobs/rollups.py) equal a full recount, both databases.

A hypothesis state machine accepts, completes, fails, requeues and purges
receipts (the real purge), and logs deliveries (accepted, refused, unknown
integration, purged by the log's own retention), while the clock moves by
seconds, by more than the purge margin, or by a day. After every rollups run:
each scope's counts and oldest unfinished receipt equal a GROUP BY over the
receipts table; every hourly_series cell equals a GROUP BY of accepted and
failed receipts per hour; the delivery hours the log still holds whole equal a
GROUP BY of the log; and a full recount at that moment changes no cell.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from sqlalchemy import Integer, cast, delete, func, insert, select, update

from app import create_app
from jobs import rollups
from jobs.delivery_log import purge_deliveries
from jobs.retention import purge
from jobs.retention_batching import Pacer
from jobs.rollup_band import HOUR, hour_of, settled_band
from jobs.rollup_deliveries import DELIVERY_SETTLE_SECONDS, latency_bucket
from jobs.rollup_series import window_start
from ledger.clock import FixedClock
from ledger.config import DEFAULT_RETENTION_SECONDS
from ledger.db.schema import (
    LATENCY_BOUNDS_US,
    attempts,
    deliveries,
    hourly_latency,
    hourly_refusals,
    hourly_series,
    hourly_totals,
    jobs,
    receipts,
    rollup_marks,
    scope_counts,
    scope_totals,
)
from ledger.domain import JobStatus, ReceiptState
from tests.helpers import make_sender
from tests.integration.ledger_rows import add_receipt

# Long enough for a settled band (retention > purge margin + settle lag: here
# [now - 600 s, now - 60 s)), short enough that a few steps of the clock carry
# receipts out of it and past the purge cutoff.
RETENTION = rollups.PURGE_MARGIN_SECONDS + 600
# The delivery log's own retention: its band is [now - 600 s, now - 150 s), so its
# purge reaches hours the rollup has already counted.
LOG_RETENTION = RETENTION
_examples = itertools.count()
ROLLUP_TABLES = (attempts, jobs, receipts, scope_counts, scope_totals, rollup_marks,
                 hourly_series, hourly_refusals, hourly_latency, deliveries)


def hour_index(conn, column):  # type: ignore[no-untyped-def]
    """Whole hours since the epoch, from the epoch seconds: the oracle's own hour, apart
    from the rollups' (PostgreSQL's date_bin)."""
    if conn.dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", column) / 3600), Integer)
    return cast(func.strftime("%s", column), Integer) // 3600


def series_recount(conn, now: datetime) -> dict[tuple[int, datetime], tuple[int, int]]:  # type: ignore[no-untyped-def]
    """Accepted per accepted hour and failed per failed hour, straight from receipts."""
    window = window_start(now)
    cells: dict[tuple[int, datetime], list[int]] = {}
    failed_at = func.coalesce(receipts.c.completed_at, receipts.c.accepted_at)
    for column, where, i in ((receipts.c.accepted_at, receipts.c.accepted_at >= window, 0),
                             (failed_at, (receipts.c.state == ReceiptState.FAILED.code)
                              & (failed_at >= window), 1)):
        hour = hour_index(conn, column)
        for scope_id, h, n in conn.execute(select(receipts.c.scope_id, hour, func.count())
                                           .where(where).group_by(receipts.c.scope_id, hour)):
            cells.setdefault((scope_id, hour_of(int(h))), [0, 0])[i] = int(n)
    return {key: (a, f) for key, (a, f) in cells.items()}


def series(conn) -> dict[tuple[int, datetime], tuple[int, int]]:  # type: ignore[no-untyped-def]
    """Return hourly_series as {(scope, hour): (accepted, failed)}."""
    return {(r.scope_id, r.hour): (r.accepted, r.failed) for r in conn.execute(
        select(hourly_series))}


def totals_agree(conn) -> bool:  # type: ignore[no-untyped-def]
    """Tell whether hourly_totals holds hourly_series summed over its scopes, hour by hour."""
    summed: dict[datetime, tuple[int, int]] = {}
    for (_, hour), (accepted, failed) in series(conn).items():
        a, f = summed.get(hour, (0, 0))
        summed[hour] = (a + accepted, f + failed)
    kept = {r.hour: (r.accepted, r.failed) for r in conn.execute(select(hourly_totals))}
    return kept == summed


def delivery_cells(conn) -> dict[tuple[int, datetime, int], int]:  # type: ignore[no-untyped-def]
    """Return the delivery hours: {(scope, hour, bucket or -1 for refusals): deliveries}."""
    cells = {(r.scope_id, r.hour, -1): r.refused for r in conn.execute(select(hourly_refusals))}
    return cells | {(r.scope_id, r.hour, r.bucket): r.deliveries
                    for r in conn.execute(select(hourly_latency))}


def delivery_recount(conn, since: datetime, until: datetime  # type: ignore[no-untyped-def]
                     ) -> dict[tuple[int, datetime, int], int]:
    """Refusals and latency buckets per integration and hour, straight from the log."""
    status, hour = deliveries.c.http_status, hour_index(conn, deliveries.c.at)
    cells: dict[tuple[int, datetime, int], int] = {}
    for kind, where, bucket in (
            ("refused", (status >= 400) & (status < 500) & (status != 409), None),
            ("answered", status.in_((200, 202, 409)), latency_bucket(deliveries.c.latency_us))):
        group = [deliveries.c.integration_id, hour] + ([bucket] if bucket is not None else [])
        for row in conn.execute(select(*group, func.sum(deliveries.c.count)).where(
                where, deliveries.c.integration_id.is_not(None), deliveries.c.at >= since,
                deliveries.c.at < until).group_by(*group)):
            b = -1 if kind == "refused" else int(row[2])
            cells[(row[0], hour_of(int(row[1])), b)] = int(row[-1])
    return cells


def whole_hours(cells: dict, since: datetime) -> dict:  # type: ignore[type-arg]
    """Keep the delivery cells of the hours from `since`."""
    return {key: n for key, n in cells.items() if key[1] >= since}


def full_recount(conn) -> dict[tuple[int, int], tuple[int, datetime | None]]:  # type: ignore[no-untyped-def]
    """Count receipts per scope and state straight from the table (the oracle)."""
    rows = conn.execute(select(receipts.c.scope_id, receipts.c.state, func.count(),
                               func.min(receipts.c.accepted_at))
                        .group_by(receipts.c.scope_id, receipts.c.state)).all()
    return {(s, state): (int(n), None if state == ReceiptState.COMPLETE.code
                         else oldest.replace(tzinfo=UTC) if oldest.tzinfo is None else oldest)
            for s, state, n, oldest in rows}


def rollup(conn) -> dict[tuple[int, int], tuple[int, datetime | None]]:  # type: ignore[no-untyped-def]
    """Return scope_counts as {(scope, state): (count, oldest)}."""
    return {(r.scope_id, r.state): (r.count, r.oldest_accepted_at)
            for r in conn.execute(select(scope_counts))}


class RollupMachine(RuleBasedStateMachine):
    """Receipts change state and vanish; the rollup keeps up incrementally."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.app, self.svc = app, app.extensions["ledger"]
        self.clock: FixedClock = self.svc.clock
        with self.svc.engine.begin() as conn:
            for table in ROLLUP_TABLES:
                conn.execute(delete(table))
        n = next(_examples)
        self.scopes = [make_sender(app, account=f"acct{n}x{i}").scope_id for i in range(2)]
        self.ids = itertools.count()

    def _pick(self, state: ReceiptState, pick: int) -> tuple[int, str] | None:
        """Return the (scope, event id) of the pick-th receipt in `state`, if any."""
        with self.svc.engine.connect() as conn:
            rows = conn.execute(select(receipts.c.scope_id, receipts.c.event_id)
                                .where(receipts.c.state == state.code)
                                .order_by(receipts.c.event_id)).all()
        return tuple(rows[pick % len(rows)]) if rows else None  # type: ignore[return-value]

    def _set(self, key: tuple[int, str] | None, state: ReceiptState, job: JobStatus | None) -> None:
        """Move a receipt to `state`, its job as the worker or a requeue would."""
        if key is None:
            return
        where = (receipts.c.scope_id == key[0]) & (receipts.c.event_id == key[1])
        job_where = (jobs.c.scope_id == key[0]) & (jobs.c.event_id == key[1])
        done = None if state is ReceiptState.PENDING else self.clock.now()
        with self.svc.engine.begin() as conn:
            conn.execute(update(receipts).where(where).values(state=state.code,
                                                             completed_at=done))
            if job is None:
                conn.execute(delete(jobs).where(job_where))
            else:
                conn.execute(update(jobs).where(job_where).values(status=job.value))

    @rule(side=st.integers(0, 1), late=st.integers(0, rollups.SETTLE_LAG_SECONDS - 1),
          n=st.integers(1, 3))
    def accept(self, side: int, late: int, n: int) -> None:
        """Receipts arrive, stamped up to a minute before they commit."""
        with self.svc.engine.begin() as conn:
            for _ in range(n):
                add_receipt(conn, self.scopes[side], f"e{next(self.ids):05d}",
                            state=ReceiptState.PENDING, job=JobStatus.QUEUED,
                            accepted_at=self.clock.now() - timedelta(seconds=late))

    @rule(pick=st.integers(0, 50))
    def complete(self, pick: int) -> None:
        """The worker completes a pending receipt."""
        self._set(self._pick(ReceiptState.PENDING, pick), ReceiptState.COMPLETE, None)

    @rule(pick=st.integers(0, 50))
    def fail(self, pick: int) -> None:
        """The worker gives up on a pending receipt."""
        self._set(self._pick(ReceiptState.PENDING, pick), ReceiptState.FAILED, JobStatus.FAILED)

    @rule(pick=st.integers(0, 50))
    def requeue(self, pick: int) -> None:
        """An operator requeues a failed receipt."""
        self._set(self._pick(ReceiptState.FAILED, pick), ReceiptState.PENDING, JobStatus.QUEUED)

    @rule(seconds=st.sampled_from([1, 59, 61, 300, 300, 600, 1499, 1501, 3600, 86_400]))
    def wait(self, seconds: int) -> None:
        """Time passes (past the purge margin sometimes, past the delivery hours' daily
        recount, or through several of scope_totals' repair slices)."""
        self.clock.advance(seconds)

    @rule(side=st.integers(0, 2), status=st.sampled_from([202, 200, 409, 401, 400, 413, 503]),
          late=st.integers(0, 70), latency=st.sampled_from([300, 1_000, 1_001, 47_000,
                                                            LATENCY_BOUNDS_US[-1] + 1]),
          count=st.sampled_from([1, 1, 7]))
    def deliver(self, side: int, status: int, late: int, latency: int, count: int) -> None:
        """The delivery log's flusher writes a row, up to a minute after its `at`.

        Side 2 is a request to an unknown integration (404, no integration id); a
        count over 1 is a minute of refusals the log only counted.
        """
        scope = None if side == 2 else self.scopes[side]
        status = 404 if scope is None else status
        refusal = 400 <= status < 500 and status != 409
        with self.svc.engine.begin() as conn:
            conn.execute(insert(deliveries).values(
                at=self.clock.now() - timedelta(seconds=late), integration_id=scope,
                public_id=None, outcome="test", http_status=status, key_id=None,
                event_id=None, client=None, reason=None, count=count if refusal else 1,
                latency_us=latency))

    @rule()
    def purge_expired(self) -> None:
        """The retention purges delete finished receipts and old log rows past their cutoffs."""
        purge(self.svc.engine, self.svc.settings, self.clock, pacer=Pacer(1.0))
        purge_deliveries(self.svc.engine, self.svc.settings, self.clock)

    @rule()
    def refresh(self) -> None:
        """A rollups run: every rollup equals a recount from its table at that moment."""
        now = self.clock.now()
        with self.svc.engine.begin() as conn:
            run = rollups.refresh_scope_counts(conn, now, retention_seconds=RETENTION)
            series_run = rollups.refresh_hourly_series(conn, now, retention_seconds=RETENTION)
            rollups.refresh_delivery_hours(conn, now, log_seconds=LOG_RETENTION)
        band = settled_band(now, LOG_RETENTION, lag_seconds=DELIVERY_SETTLE_SECONDS)
        # Hours the log still holds whole: from the first hour past its band's start.
        whole = max(window_start(now), hour_of(int(band.start.timestamp()) // 3600) + HOUR)
        with self.svc.engine.connect() as conn:
            assert rollup(conn) == full_recount(conn), "full" if run.full else "incremental"
            assert series(conn) == series_recount(conn, now), series_run
            assert totals_agree(conn), series_run
            incremental = delivery_cells(conn)
            assert whole_hours(incremental, whole) == delivery_recount(conn, whole, band.end)
        with self.svc.engine.connect() as conn:
            repair = conn.begin()  # the repair path, rolled back: it finds nothing to change
            rollups.refresh_hourly_series(conn, now, retention_seconds=RETENTION, full=True)
            rollups.refresh_delivery_hours(conn, now, log_seconds=LOG_RETENTION, full=True)
            assert series(conn) == series_recount(conn, now)
            assert delivery_cells(conn) == incremental
            repair.rollback()


@pytest.fixture
def rollup_app(test_env):  # type: ignore[no-untyped-def]
    """An app on a FixedClock with a 40-minute retention."""
    app = create_app({**test_env, "LEDGER_RETENTION_SECONDS": str(RETENTION),
                      "LEDGER_REVIEW_WINDOW_SECONDS": str(RETENTION),
                      "LEDGER_DELIVERY_LOG_SECONDS": str(LOG_RETENTION),
                      "LEDGER_LOG_LEVEL": "WARNING"}, clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


def test_incremental_rollups_equal_a_full_recount(rollup_app):
    """Random accept/complete/fail/requeue/deliver/purge/wait sequences; every run is exact."""
    run_state_machine_as_test(
        lambda: RollupMachine(rollup_app),
        settings=settings(max_examples=20, stateful_step_count=40, deadline=None,
                          database=None, suppress_health_check=[HealthCheck.too_slow]))


def test_a_run_after_a_few_changes_reads_only_those(rollup_app):
    """A run reads the changed and the purgeable receipts, not the whole table."""
    svc, clock = rollup_app.extensions["ledger"], rollup_app.extensions["ledger"].clock
    scope = make_sender(rollup_app).scope_id
    start = clock.now()
    with svc.engine.begin() as conn:
        for i in range(300):  # 5 minutes of complete receipts, settled by the first run
            add_receipt(conn, scope, f"old{i:03d}", state=ReceiptState.COMPLETE,
                        accepted_at=start - timedelta(seconds=400 - i))
    with svc.engine.begin() as conn:
        first = rollups.refresh_scope_counts(conn, start, retention_seconds=RETENTION)
    clock.advance(60)
    with svc.engine.begin() as conn:
        for i in range(3):
            add_receipt(conn, scope, f"new{i}", state=ReceiptState.PENDING,
                        job=JobStatus.QUEUED, accepted_at=clock.now())
        second = rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION)
        counts = rollup(conn)
    assert first.full and first.receipts_read == 300
    assert not second.full
    # 3 new pending, read in the tail and again as unfinished; nothing left the band.
    assert second.receipts_read == 6
    # The only scope is every run's repair slice: its 303 receipts counted whole.
    assert second.repair_read == 303
    assert counts[(scope, ReceiptState.COMPLETE.code)][0] == 300
    assert counts[(scope, ReceiptState.PENDING.code)][0] == 3


def test_counts_stay_right_when_a_purge_follows_a_long_pause(rollup_app):
    """Receipts settled by one run, purged after a pause longer than the margin, are gone."""
    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scope = make_sender(rollup_app).scope_id
    with svc.engine.begin() as conn:
        for i in range(5):
            add_receipt(conn, scope, f"c{i}", state=ReceiptState.COMPLETE,
                        accepted_at=clock.now() - timedelta(seconds=300))
    with svc.engine.begin() as conn:
        rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION)
    clock.advance(rollups.PURGE_MARGIN_SECONDS + 600)  # the scheduler was down a while
    assert purge(svc.engine, svc.settings, clock, pacer=Pacer(1.0)).expired_receipts == 5
    with svc.engine.begin() as conn:
        run = rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION)
        assert rollup(conn) == full_recount(conn) == {}
    assert run.full


def test_an_unchanged_run_still_shows_as_the_latest_rollup(rollup_app):
    """Rows are rewritten only when they change; the pages and /metrics show the run's age."""
    from ledger.metrics.export import render_metrics
    from ledger.reads.overview import read_overview

    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scope = make_sender(rollup_app).scope_id
    with svc.engine.begin() as conn:
        add_receipt(conn, scope, "c", state=ReceiptState.COMPLETE,
                    accepted_at=clock.now() - timedelta(seconds=300))
    rollups.refresh(svc.engine, clock, retention_seconds=RETENTION)
    clock.advance(120)
    with svc.engine.begin() as conn:
        again = rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION)
    assert (again.full, again.written) == (False, 0)
    with svc.engine.connect() as conn:
        assert read_overview(conn, clock.now(), live_within=30).rollups_refreshed_at == clock.now()
    lines = render_metrics(svc.engine, clock, revocation_bound_seconds=30)[0].decode()
    assert "ledger_rollup_age_seconds 0.0" in lines.splitlines()


def test_series_runs_read_what_changed_and_stay_exact_as_receipts_leave_the_band(rollup_app):
    """Settled receipts that age past the band's start are counted once, not twice."""
    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scope = make_sender(rollup_app).scope_id
    with svc.engine.begin() as conn:
        for i in range(5):  # inside the settled band [now - 600 s, now - 60 s)
            add_receipt(conn, scope, f"c{i}", state=ReceiptState.COMPLETE,
                        accepted_at=clock.now() - timedelta(seconds=300))
        first = rollups.refresh_hourly_series(conn, clock.now(), retention_seconds=RETENTION)
    for step in (400, 400):  # they leave the band, then stay on its old edge
        clock.advance(step)
        with svc.engine.begin() as conn:
            add_receipt(conn, scope, f"n{step}{clock.now():%S%f}", state=ReceiptState.PENDING,
                        job=JobStatus.QUEUED, accepted_at=clock.now())
            run = rollups.refresh_hourly_series(conn, clock.now(), retention_seconds=RETENTION)
            assert not run.full
            assert series(conn) == series_recount(conn, clock.now())
    assert first.full and first.receipts_read == 5
    # The second step reads the old edge (5) and the newest receipts (2), not the table.
    assert run.receipts_read == 7


def test_the_rollups_sql_runs_on_the_oldest_supported_databases(rollup_app):
    """SQLite before 3.39 (Ubuntu 22.04 ships 3.37, Debian 11 3.34) has no FULL or RIGHT
    JOIN, and `date_bin` is PostgreSQL's (14 and later): a run sends neither to SQLite.
    The failed cells still follow a failure and a requeue there."""
    from sqlalchemy import event

    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scope = make_sender(rollup_app).scope_id
    sent: list[str] = []
    event.listen(svc.engine, "before_cursor_execute",
                 lambda _c, _cur, statement, *_: sent.append(statement.upper()))
    with svc.engine.begin() as conn:
        add_receipt(conn, scope, "f", state=ReceiptState.FAILED, job=JobStatus.FAILED,
                    accepted_at=clock.now() - timedelta(seconds=300))
    for step in range(2):
        with svc.engine.begin() as conn:
            if step:  # the failure is requeued: its cell's failed figure falls to 0
                conn.execute(update(receipts).values(state=ReceiptState.PENDING.code,
                                                     completed_at=None))
            rollups.refresh_hourly_series(conn, clock.now(), retention_seconds=RETENTION)
        with svc.engine.connect() as conn:
            assert series(conn) == series_recount(conn, clock.now())
        clock.advance(60)
    failed_cells = [s for s in sent if "STORED_FAILED" in s]
    assert len(failed_cells) == 2
    if svc.engine.dialect.name == "sqlite":
        assert not [s for s in sent if "FULL OUTER JOIN" in s or "RIGHT OUTER JOIN" in s
                    or "DATE_BIN" in s]
    else:
        assert all("FULL OUTER JOIN" in s and "DATE_BIN" in s for s in failed_cells)


@pytest.mark.parametrize("period", [7, 60, 290])
def test_drifted_totals_are_recounted_scope_by_scope_within_the_repair_cycle(
        rollup_app, monkeypatch, period):
    """No daily recount of the table: each run counts the receipts of the next scopes
    whole, as many as its period is of the repair cycle. A drift in every scope's total
    stays wrong until that scope's turn, and none is left after one cycle; then again for
    receipts committed long after their accepted_at, from wherever the cursor stands."""
    monkeypatch.setattr(rollups, "REPAIR_CYCLE_SECONDS", 600)
    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scopes = [make_sender(rollup_app, name=f"slice{i}").scope_id for i in range(5)]
    complete = ReceiptState.COMPLETE.code

    def one_cycle() -> None:
        wrong, repaired = [], 0
        for _ in range(-(-600 // period)):
            clock.advance(period)
            with svc.engine.begin() as conn:
                run = rollups.refresh_scope_counts(conn, clock.now(),
                                                   retention_seconds=RETENTION)
            assert not run.full
            repaired += run.repair_read
            with svc.engine.connect() as conn:
                counts, truth = rollup(conn), full_recount(conn)
            wrong.append({s for s in scopes
                          if counts.get((s, complete)) != truth[(s, complete)]})
        assert 0 < len(wrong[0]) < len(scopes), wrong  # spread over the runs
        assert all(later <= earlier for earlier, later in itertools.pairwise(wrong)), wrong
        assert wrong[-1] == set() and repaired >= 3 * len(scopes)
        with svc.engine.connect() as conn:
            assert rollup(conn) == full_recount(conn)

    with svc.engine.begin() as conn:
        for scope in scopes:
            for i in range(3):  # inside the settled band
                add_receipt(conn, scope, f"s{i}", state=ReceiptState.COMPLETE,
                            accepted_at=clock.now() - timedelta(seconds=300))
        first = rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION)
        # drift: totals the incremental steps never correct by themselves
        conn.execute(update(scope_totals).values(settled=scope_totals.c.settled + 7))
    assert first.full
    one_cycle()
    with svc.engine.begin() as conn:  # committed 4 minutes late: inside the settled band
        for scope in scopes:
            for i in range(2):
                add_receipt(conn, scope, f"late{i}", state=ReceiptState.COMPLETE,
                            accepted_at=clock.now() - timedelta(seconds=240))
    one_cycle()


def test_a_repair_slice_past_the_statement_timeout_is_skipped_and_the_runs_go_on(
        rollup_app, monkeypatch):
    """A scope too big (or too cold) to count inside the statement timeout must not stop
    every run at its slice: on PostgreSQL the slice is skipped with a warning, the run's
    figures are written and the next run repairs the next slice. SQLite has no statement
    timeout: its slice is counted."""
    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scopes = [make_sender(rollup_app, name=f"big{i}").scope_id for i in range(3)]
    complete = ReceiptState.COMPLETE.code
    with svc.engine.begin() as conn:
        for scope in scopes:
            add_receipt(conn, scope, "b", state=ReceiptState.COMPLETE,
                        accepted_at=clock.now() - timedelta(seconds=300))
        assert rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION).full
        conn.execute(update(scope_totals).values(settled=scope_totals.c.settled + 7))
    postgres = svc.engine.dialect.name == "postgresql"
    if postgres:
        counted = rollups._recount_scopes

        def too_slow(conn, *args):  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("SET LOCAL statement_timeout = '50ms'")
            conn.exec_driver_sql("SELECT pg_sleep(1)")
            return counted(conn, *args)

        monkeypatch.setattr(rollups, "_recount_scopes", too_slow)

    def run_and_read() -> tuple[rollups.CountsRun, set[int], int | None]:
        clock.advance(60)
        with svc.engine.begin() as conn:
            run = rollups.refresh_scope_counts(conn, clock.now(), retention_seconds=RETENTION)
        with svc.engine.connect() as conn:
            counts, truth = rollup(conn), full_recount(conn)
            cursor = conn.execute(select(rollup_marks.c.repaired_scope).where(
                rollup_marks.c.name == "scope_totals")).scalar()
        return run, {s for s in scopes if counts.get((s, complete)) != truth[(s, complete)]}, cursor

    run, wrong, cursor = run_and_read()
    assert (run.full, run.repair_skipped, cursor) == (False, postgres, scopes[0])
    assert wrong == (set(scopes) if postgres else set(scopes[1:]))
    monkeypatch.undo()
    run, wrong, cursor = run_and_read()  # the next slice, not the skipped one again
    assert (run.repair_skipped, cursor) == (False, scopes[1])
    assert wrong == ({scopes[0], scopes[2]} if postgres else {scopes[2]})


@pytest.mark.parametrize("retention", [RETENTION, DEFAULT_RETENTION_SECONDS],
                         ids=["hour-on-the-old-edge", "hour-inside-the-band"])
def test_a_drifted_series_hour_is_recounted_by_the_run_whose_turn_it_is(rollup_app,
                                                                       retention):
    """No daily recount of the window: each run recounts the hour after the previous
    run's. With a 40-minute retention the hour is on the band's old edge (recounted with
    the edges); with 7 days it lies inside the band (compared in the database)."""
    svc = rollup_app.extensions["ledger"]
    clock: FixedClock = svc.clock
    scope = make_sender(rollup_app).scope_id
    # after the full count, the runs recount the window's first hour, then the next ...
    hour = int(window_start(clock.now() + timedelta(seconds=60)).timestamp()) // 3600 + 2
    with svc.engine.begin() as conn:
        for i in range(4):
            add_receipt(conn, scope, f"h{i}", state=ReceiptState.COMPLETE,
                        accepted_at=hour_of(hour) + timedelta(minutes=10 + i))
        first = rollups.refresh_hourly_series(conn, clock.now(), retention_seconds=retention)
        # drift: a figure the incremental steps never look at again
        conn.execute(update(hourly_series).where(hourly_series.c.scope_id == scope,
                                                 hourly_series.c.hour == hour_of(hour))
                     .values(accepted=hourly_series.c.accepted + 5,
                             settled=hourly_series.c.settled + 5))
    assert first.full
    runs = []
    for _ in range(3):  # the window's first hour, the next, then `hour`
        clock.advance(60)
        with svc.engine.begin() as conn:
            runs.append(rollups.refresh_hourly_series(conn, clock.now(),
                                                      retention_seconds=retention))
            cell = series(conn)[(scope, hour_of(hour))]
            repaired = conn.execute(select(rollup_marks.c.repaired_hour).where(
                rollup_marks.c.name == "hourly_series")).scalar()
        assert cell == ((4, 0) if repaired == hour else (9, 0)), (repaired, hour)
    with svc.engine.connect() as conn:
        assert series(conn) == series_recount(conn, clock.now())
        assert totals_agree(conn)
        settled = conn.execute(select(hourly_series.c.settled).where(
            hourly_series.c.scope_id == scope, hourly_series.c.hour == hour_of(hour))).scalar()
    assert repaired == hour
    assert not any(r.full for r in runs) and [r.repair_read for r in runs][-1] == 4
    assert settled == (4 if retention == DEFAULT_RETENTION_SECONDS else 0)
