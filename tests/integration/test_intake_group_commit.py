"""Group commit on the SQLite intake: the claims one process receives together share a
transaction, and the ledger still holds one receipt and one job per event id.

Run on both engines: PostgreSQL claims each delivery in its own autocommit
statement, so there the same races check that nothing changed for it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import chain

import pytest
import requests
from sqlalchemy import func, insert, select

from ledger.db.schema import jobs, receipts
from ledger.intake.group_commit import Failed
from ledger.intake.store import DriverClaim, NewEvent
from tests.helpers import event_body, make_sender, signed_headers
from tests.servers import gunicorn_server

CLIENTS = 32


def _event(scope_id: int, event_id: str) -> NewEvent:
    return NewEvent(scope_id=scope_id, event_id=event_id, event_type="demo.credit",
                    body_sha256=event_id.encode().ljust(32, b"-")[:32], payload="{}",
                    accepted_at=datetime.now(UTC))


@pytest.mark.slow
def test_concurrent_new_and_repeated_deliveries_through_four_threaded_workers(app, test_env):
    """gunicorn.conf.py's shape (4 processes, the default threads each): new ids and repeats
    of them, sent together, end with one receipt and one job each and a 202 for every request."""
    sender = make_sender(app)
    app.extensions["ledger"].close()
    events = [f"evt_group_{n}" for n in range(96)]
    # each id is sent three times, by different clients, in one burst
    plan = [events[(n * 7 + k) % len(events)] for k in range(3) for n in range(len(events))]
    barrier = threading.Barrier(CLIENTS)
    with gunicorn_server({**test_env, "LEDGER_LOG_LEVEL": "WARNING"}, workers=4) as (base, _):
        def one(client: int) -> list[tuple[int, str, str]]:
            answers = []
            with requests.Session() as session:
                barrier.wait(timeout=30)
                for event_id in plan[client::CLIENTS]:
                    body = event_body(sender, event_id)
                    response = session.post(f"{base}/hooks/{sender.public_id}", data=body,
                                            headers=signed_headers(sender, body, event_id),
                                            timeout=30)
                    answers.append((response.status_code, response.json()["status"],
                                    response.json()["event_id"]))
            return answers

        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(chain.from_iterable(pool.map(one, range(CLIENTS))))
    assert {status for status, _, _ in answers} == {202}
    accepted = sorted(event_id for _, kind, event_id in answers if kind == "accepted")
    assert accepted == sorted(events)  # exactly one "accepted" per id
    assert sum(kind == "duplicate" for _, kind, _ in answers) == 2 * len(events)
    engine = app.extensions["ledger"].engine
    with engine.connect() as conn:
        per_event = conn.execute(select(receipts.c.event_id, func.count())
                                 .group_by(receipts.c.event_id)).all()
        job_ids = conn.execute(select(jobs.c.event_id)).scalars().all()
    assert sorted(per_event) == [(event_id, 1) for event_id in sorted(events)]
    assert sorted(job_ids) == sorted(events)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_one_claims_own_constraint_error_in_a_shared_transaction_loses_only_that_claim(app):
    """An orphan job holding one id (no receipt) fails that claim alone; the claims written
    with it in the same transaction are committed, and the failed one left no receipt."""
    engine = app.extensions["ledger"].engine
    with engine.begin() as conn:
        conn.execute(insert(jobs).values(
            scope_id=7, event_id="orphan", event_type="demo.credit",
            accepted_at=datetime.now(UTC), run_at=datetime.now(UTC), status=0, attempts=0,
            lease_token=0, payload="{}"))
    claim = DriverClaim(engine)
    answers = claim._write_sqlite_group(
        [_event(7, "before"), _event(7, "orphan"), _event(7, "after")])
    assert answers[0] is True and answers[2] is True
    assert isinstance(answers[1], Failed)
    assert "intake claim" in str(answers[1].error) and "{}" not in str(answers[1].error)
    with engine.connect() as conn:
        ids = conn.execute(select(receipts.c.event_id).order_by(receipts.c.event_id)).scalars()
        assert list(ids) == ["after", "before"]
    # the claim answers the same for a repeat, and the error reaches its own caller
    assert claim.claim(_event(7, "before"))[0] is False
    with pytest.raises(Exception, match="intake claim"):
        claim.claim(_event(7, "orphan"))


def test_a_duplicate_in_a_shared_transaction_gets_the_recorded_outcome(app):
    """Two claims of one id in one batch: the first claims it, the second reads the
    receipt the first just wrote (same transaction), as a later duplicate would."""
    engine = app.extensions["ledger"].engine
    claim = DriverClaim(engine)
    if engine.dialect.name == "postgresql":
        assert claim._group is None
        first, second = claim.claim(_event(3, "twice")), claim.claim(_event(3, "twice"))
        assert first == (True, None) and second[0] is False
        return
    answers = claim._write_sqlite_group(
        [_event(3, "twice"), _event(3, "twice")])
    assert answers[0] is True
    assert answers[1][0] == 0 and bytes(answers[1][1]).startswith(b"twice")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_batch_answers_each_claim_in_its_place(app):
    """New ids, an id claimed before the batch, one id claimed twice in it and the same id
    in another scope: each claim gets its own answer, and each new claim one work item."""
    engine = app.extensions["ledger"].engine
    claim = DriverClaim(engine)
    assert claim.claim(_event(5, "earlier"))[0] is True
    answers = claim._write_sqlite_group([_event(5, "a"), _event(5, "earlier"), _event(6, "a"),
                                         _event(5, "a"), _event(5, "b")])
    assert [answers[0], answers[2], answers[4]] == [True, True, True]
    assert answers[1][0] == 0 and bytes(answers[1][1]).startswith(b"earlier")
    assert answers[3][0] == 0 and bytes(answers[3][1]).startswith(b"a")
    with engine.connect() as conn:
        work = conn.execute(select(jobs.c.scope_id, jobs.c.event_id)).all()
    assert sorted(work) == [(5, "a"), (5, "b"), (5, "earlier"), (6, "a")]
