"""The failure-group sweep (jobs/sweep.py): members whose receipt left by another path
than a requeue or the purge stop counting, empty groups' texts go unless an operator
acknowledged or muted the group. Both databases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update

from jobs import sweep
from ledger.access import audit
from ledger.db.schema import (
    failure_group_scopes,
    failure_groups,
    failure_members,
    failure_signatures,
    receipts,
)
from ledger.domain import ReceiptState
from ledger.worker.failure_groups import group_id
from ledger.worker.failure_review import GroupState, review_group
from tests.helpers import make_sender
from tests.integration.test_failure_groups import AMOUNT, _counts, _many_failures

KEY_ERROR = "KeyError: 'customer'"


def _engine(app: Any) -> Any:
    return app.extensions["ledger"].engine


def _sweep_until_wrapped(app: Any, members: int) -> int:
    """Run the sweep in steps of `members` until it has been over every member once."""
    svc = app.extensions["ledger"]
    removed = 0
    with svc.engine.connect() as conn:
        total = len(conn.execute(select(failure_members.c.event_id)).all())
    for _ in range(total // members + 2):
        removed += sweep.sweep_failure_groups(svc.engine, svc.clock, members=members)
    return removed


def _scope_counts(app: Any) -> dict[int, int]:
    with _engine(app).connect() as conn:
        return dict(conn.execute(select(failure_group_scopes.c.scope_id,
                                        failure_group_scopes.c.count)).all())


def test_a_group_overcounting_after_receipts_left_behind_its_back_is_corrected(app) -> None:  # type: ignore[no-untyped-def]
    a, b = make_sender(app), make_sender(app, name="second")
    _many_failures(app, a.scope_id, 6, prefix="evt_a")
    _many_failures(app, b.scope_id, 2, prefix="evt_b")
    with _engine(app).begin() as conn:  # neither a requeue nor the purge
        conn.execute(delete(receipts).where(receipts.c.event_id.in_(["evt_a00001",
                                                                      "evt_a00004"])))
        conn.execute(update(receipts).where(receipts.c.event_id == "evt_a00002")
                     .values(state=ReceiptState.COMPLETE.code))
        conn.execute(delete(receipts).where(receipts.c.scope_id == b.scope_id))
    assert _counts(app) == [(AMOUNT, 8)]  # what the page said before the sweep: wrong
    # One bounded step checks 3 members: the first run cannot have seen them all.
    first = sweep.sweep_failure_groups(_engine(app), app.extensions["ledger"].clock,
                                       members=3)
    assert first < 5
    _sweep_until_wrapped(app, members=3)
    assert _counts(app) == [(AMOUNT, 3)]
    assert _scope_counts(app) == {a.scope_id: 3}  # the emptied scope's counter is gone
    with _engine(app).connect() as conn:
        left = sorted(conn.execute(select(failure_members.c.event_id)).scalars())
        first_seen, last_seen = conn.execute(select(failure_group_scopes.c.first_seen,
                                                    failure_group_scopes.c.last_seen)).one()
        kept = conn.execute(select(receipts.c.completed_at)
                            .where(receipts.c.event_id.in_(left))
                            .order_by(receipts.c.completed_at)).scalars().all()
    assert left == ["evt_a00000", "evt_a00003", "evt_a00005"]
    assert (first_seen, last_seen) == (kept[0], kept[-1])
    assert _sweep_until_wrapped(app, members=3) == 0  # nothing more to correct


def test_an_empty_groups_text_goes_and_a_muted_one_with_its_note_stays(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    a = make_sender(app)
    _many_failures(app, a.scope_id, 3, prefix="evt_amount")
    _many_failures(app, a.scope_id, 2, prefix="evt_key", error=KEY_ERROR)
    _many_failures(app, a.scope_id, 1, prefix="evt_live", error="TimeoutError: upstream")
    with svc.engine.begin() as conn:
        review_group(conn, audit.Actor(name="olga", role="oncall"), event_type="demo.credit",
                     signature=KEY_ERROR, state=GroupState.MUTED, note="known: OPS-9",
                     now=svc.clock.now())
        conn.execute(delete(receipts).where(receipts.c.event_id.like("evt_amount%")
                                            | receipts.c.event_id.like("evt_key%")))
    _sweep_until_wrapped(app, members=2)
    with svc.engine.connect() as conn:
        texts = set(conn.execute(select(failure_signatures.c.signature)).scalars())
        note = conn.execute(select(failure_groups.c.state, failure_groups.c.note)).one()
    assert texts == {KEY_ERROR, "TimeoutError: upstream"}  # the amount group's text went
    assert tuple(note) == ("muted", "known: OPS-9")
    assert _counts(app) == [("TimeoutError: upstream", 1)]
    # The muted group fails again: it is still muted, its text and note intact.
    _many_failures(app, a.scope_id, 1, prefix="evt_key_again", error=KEY_ERROR)
    with svc.engine.connect() as conn:
        from ledger.reads.groups import read_groups
        from ledger.reads.receipts import ReceiptFilter

        view = read_groups(conn, ReceiptFilter())
    assert [(g.signature, g.count, g.note) for g in view.muted] == [(KEY_ERROR, 1,
                                                                      "known: OPS-9")]


def test_a_failed_receipts_lost_group_text_is_written_again(app) -> None:  # type: ignore[no-untyped-def]
    a = make_sender(app)
    _many_failures(app, a.scope_id, 2, prefix="evt_t")
    with _engine(app).begin() as conn:  # as if deleted while a worker counted a member
        conn.execute(delete(failure_signatures))
    assert _counts(app) == [("", 2)]
    _sweep_until_wrapped(app, members=5)
    assert _counts(app) == [(AMOUNT, 2)]
    with _engine(app).connect() as conn:
        gid = conn.execute(select(failure_signatures.c.id)).scalar_one()
    assert gid == group_id("demo.credit", AMOUNT)


def test_the_scheduled_sweep_runs_the_failure_group_step(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    a = make_sender(app)
    _many_failures(app, a.scope_id, 2, prefix="evt_s", age=timedelta(minutes=5))
    with svc.engine.begin() as conn:
        conn.execute(delete(receipts).where(receipts.c.event_id == "evt_s00000"))
    sweep.run(svc.engine, svc.settings, svc.clock)
    assert _counts(app) == [(AMOUNT, 1)]
