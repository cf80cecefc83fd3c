"""Incremental scope_counts (jobs/rollups.py) equal a full recount, both databases.

A hypothesis state machine accepts, completes, fails, requeues and purges
receipts (the real purge) while the clock moves by seconds, by more than the
purge margin, or by a day; after every rollups run each scope's counts and
oldest unfinished receipt equal a GROUP BY over the receipts table.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from sqlalchemy import delete, func, select, update

from app import create_app
from jobs import rollups
from jobs.retention import Pacer, purge
from ledger.clock import FixedClock
from ledger.db.schema import attempts, jobs, receipts, rollup_marks, scope_counts, scope_totals
from ledger.domain import JobStatus, ReceiptState
from tests.helpers import make_sender
from tests.integration.ledger_rows import add_receipt

# Long enough for a settled band (retention > purge margin + settle lag: here
# [now - 600 s, now - 60 s)), short enough that a few steps of the clock carry
# receipts out of it and past the purge cutoff.
RETENTION = rollups.PURGE_MARGIN_SECONDS + 600
_examples = itertools.count()


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
            for table in (attempts, jobs, receipts, scope_counts, scope_totals, rollup_marks):
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
        """Time passes (past the purge margin, past a full-recount period sometimes)."""
        self.clock.advance(seconds)

    @rule()
    def purge_expired(self) -> None:
        """The retention purge deletes finished receipts past the cutoff."""
        purge(self.svc.engine, self.svc.settings, self.clock, pacer=Pacer(1.0))

    @rule()
    def refresh(self) -> None:
        """A rollups run: its counts equal a full recount at that moment."""
        with self.svc.engine.begin() as conn:
            run = rollups.refresh_scope_counts(conn, self.clock.now(),
                                               retention_seconds=RETENTION)
        with self.svc.engine.connect() as conn:
            assert rollup(conn) == full_recount(conn), "full" if run.full else "incremental"


@pytest.fixture
def rollup_app(test_env):  # type: ignore[no-untyped-def]
    """An app on a FixedClock with a 40-minute retention."""
    app = create_app({**test_env, "LEDGER_RETENTION_SECONDS": str(RETENTION),
                      "LEDGER_REVIEW_WINDOW_SECONDS": str(RETENTION),
                      "LEDGER_LOG_LEVEL": "WARNING"}, clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


def test_incremental_scope_counts_equal_a_full_recount(rollup_app):
    """Random accept/complete/fail/requeue/purge/wait sequences; every run is exact."""
    run_state_machine_as_test(
        lambda: RollupMachine(rollup_app),
        settings=settings(max_examples=40, stateful_step_count=50, deadline=None,
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
