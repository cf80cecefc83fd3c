"""The benchmark data generator at small scale: the rows the dashboard tests can reuse."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from bench.datagen import DataSpec, create_scopes, generate, load
from ledger.access import audit
from ledger.db.schema import attempts, conflicts, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.reads.receipts import get_receipt

END = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = DataSpec(receipts=400, scopes=4, end=END, span=timedelta(hours=4),
                failed_share=0.05, stuck_share=0.02, conflict_share=0.05, seed=3)


def test_generates_the_promised_mix_of_states_and_history(app):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    made = generate(svc.engine, svc.box, SPEC)
    with svc.engine.connect() as conn:
        states = dict(conn.execute(
            select(receipts.c.state, func.count()).group_by(receipts.c.state)).all())
        assert {ReceiptState.from_code(k): v for k, v in states.items()} == {
            s: n for s, n in made.by_state.items() if n}
        assert sum(states.values()) == 400
        assert made.by_state[ReceiptState.FAILED] > 0
        assert made.by_state[ReceiptState.PENDING] >= 8  # the newest 2 % at least
        scopes = conn.execute(select(func.count(func.distinct(receipts.c.scope_id)))).scalar()
        assert scopes == 4
        ids = conn.execute(select(receipts.c.event_id)).scalars().all()
        assert all(re.fullmatch(r"evt_[0-9A-Za-z]{24}", i) for i in ids)
        assert len(set(ids)) == 400
        unfinished = made.by_state[ReceiptState.PENDING] + made.by_state[ReceiptState.FAILED]
        assert conn.execute(select(func.count()).select_from(jobs)).scalar() == unfinished
        failed_jobs = conn.execute(select(func.count()).select_from(jobs).where(
            jobs.c.status == JobStatus.FAILED.value)).scalar()
        assert failed_jobs == made.by_state[ReceiptState.FAILED]
        assert conn.execute(select(func.count()).select_from(attempts)).scalar() == made.attempts
        assert made.conflicts > 0
        assert conn.execute(select(func.count()).select_from(conflicts)).scalar() == \
            made.conflicts
        assert audit.verify_chain(conn)["ok"] is True


def test_sample_receipts_read_back_like_real_ones(app):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    made = generate(svc.engine, svc.box, SPEC)
    scope_by_id = {s.id: s.scope for s in made.scopes}
    with svc.engine.connect() as conn:
        scope_id, event_id = made.samples[ReceiptState.FAILED]
        failed = get_receipt(conn, scope_by_id[scope_id], event_id)
        scope_id, event_id = made.samples[ReceiptState.COMPLETE]
        complete = get_receipt(conn, scope_by_id[scope_id], event_id)
        newest = conn.execute(select(func.max(receipts.c.accepted_at))).scalar()
    assert failed.state is ReceiptState.FAILED
    assert failed.last_error is not None and failed.attempts == 8
    assert complete.state is ReceiptState.COMPLETE and complete.result_ref
    assert complete.completed_at > complete.accepted_at
    newest = newest if newest.tzinfo else newest.replace(tzinfo=UTC)
    assert END - timedelta(minutes=1) <= newest <= END


def test_same_spec_gives_the_same_rows(app):  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    first = generate(svc.engine, svc.box, SPEC)
    others = create_scopes(svc.engine, svc.box, 4, now=END, prefix="other")
    again = load(svc.engine, SPEC, others)
    assert again.by_state == first.by_state
    with svc.engine.connect() as conn:
        def ids(scopes):  # type: ignore[no-untyped-def]
            return sorted(conn.execute(select(receipts.c.event_id).where(
                receipts.c.scope_id.in_([s.id for s in scopes]))).scalars())
        assert ids(others) == ids(first.scopes)
