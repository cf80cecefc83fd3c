"""A keyed audit chain cannot be downgraded (CONTRACT section 7): a database writer without
the key who rewrites the log unkeyed gets it neither sealed nor verified; an anchored head
shows the rewrite."""

from __future__ import annotations

import json

from sqlalchemy import delete, insert, select

from ledger.access import audit
from ledger.db.schema import audit_log
from tests.integration.test_audit_keyed import (
    AT,
    _append,
    _cli,
    _legacy_log,
    _plain_hash,
    _without_triggers,
)


def _downgrade(app, drop_id: int) -> None:  # type: ignore[no-untyped-def]
    """The reported attack: drop the triggers, delete a row, rewrite every row unkeyed."""
    with app.extensions["ledger"].engine.begin() as conn:
        _without_triggers(conn)
        conn.execute(delete(audit_log).where(audit_log.c.id == drop_id))
        prev = audit.GENESIS
        for row in conn.execute(select(audit_log).order_by(audit_log.c.id)).all():
            fields = {**row._mapping, "at": row.at}
            digest = _plain_hash(prev, fields)
            conn.execute(audit_log.update().where(audit_log.c.id == row.id)
                         .values(prev_hash=prev, row_hash=digest))
            prev = digest


def _anchor(runner) -> str:  # type: ignore[no-untyped-def]
    code, head = _cli(runner, "head")
    assert code == 0
    return f"{head['id']}:{head['hash']}"


def test_a_rewritten_keyed_log_is_never_sealed_again(app, runner):  # type: ignore[no-untyped-def]
    ids = _append(app, 5)
    anchored = _anchor(runner)
    assert _cli(runner, "verify", "--head", anchored)[1]["ok"] is True
    _downgrade(app, ids[2])
    assert _cli(runner, "verify")[0] == 1

    code, refused = _cli(runner, "rechain")  # no longer blessed on request
    assert code == 1 and "never keyed" in refused["detail"]
    code, refused = _cli(runner, "rechain", "--head", anchored)  # the anchor is gone
    assert code == 1 and "rewritten" in refused["detail"]
    code, result = _cli(runner, "verify", "--head", anchored)
    assert (code, result["ok"], result["first_bad"]) == (1, False, ids[-1])
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(audit_log.c.id).where(
            audit_log.c.action == audit.SEAL_ACTION)).first() is None


def test_the_next_action_does_not_bless_a_downgraded_log(app, runner):  # type: ignore[no-untyped-def]
    """Without the key, waiting for an operator's next action used to seal the forgery."""
    ids = _append(app, 3)
    _downgrade(app, ids[1])
    _append(app, 1)
    assert _cli(runner, "verify")[1]["ok"] is False


def test_an_unkeyed_seal_is_a_forgery(app, runner):  # type: ignore[no-untyped-def]
    """A forged unkeyed `audit.rechain` row vouches for nothing."""
    ids = _legacy_log(app, 2)
    with app.extensions["ledger"].engine.begin() as conn:
        head = conn.execute(select(audit_log.c.row_hash).where(audit_log.c.id == ids[-1])
                            ).scalar_one()
        row = {"at": AT, "actor": "cli:x",
               "role": "cli", "action": audit.SEAL_ACTION, "target": "audit_log",
               "scope": None, "reason": None, "request_id": None,
               "detail": json.dumps({"legacy_head": {"id": ids[-1], "hash": head}})}
        conn.execute(insert(audit_log).values(**row, prev_hash=head,
                                              row_hash=_plain_hash(head, row)))
    assert _cli(runner, "verify")[1]["ok"] is False


def test_rechain_seals_once_and_records_where_it_started(app, runner):  # type: ignore[no-untyped-def]
    ids = _legacy_log(app, 2)
    code, result = _cli(runner, "rechain", "--never-keyed")
    assert code == 0 and result["rechained"] == 2
    with app.extensions["ledger"].engine.connect() as conn:
        detail = json.loads(conn.execute(select(audit_log.c.detail).where(
            audit_log.c.id == result["audit_id"])).scalar_one())
    assert detail["started_from"]["id"] == ids[-1] and detail["basis"] == "never-keyed"
    assert _cli(runner, "rechain", "--never-keyed")[1]["rechained"] == 0
    assert _cli(runner, "verify", "--head", _anchor(runner))[1]["ok"] is True
