"""`ledger audit …`: check, anchor and re-chain the audit log's keyed hash chain."""

from __future__ import annotations

import sys

from ledger.access import audit
from ledger.access.credentials import refresh_fingerprints
from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services


@ledger_cli.group("audit")
def audit_group() -> None:
    """The append-only audit log."""


@audit_group.command("verify")
@json_option
def audit_verify(as_json: bool) -> None:
    """Walk the hash chain; exit 1 and name the first bad row when it is broken."""
    svc = services()
    with svc.engine.connect() as conn:
        result = audit.verify_chain(conn)
    text = (f"audit log intact: {result['rows']} rows" if result["ok"] else
            f"audit log BROKEN at row {result['first_bad']} ({result['rows']} rows); "
            "a log written before the chain was keyed needs `ledger audit rechain`")
    emit(as_json, result, text=text)
    if not result["ok"]:
        sys.exit(1)


@audit_group.command("head")
@json_option
def audit_head(as_json: bool) -> None:
    """Print the newest row's id and hash: record them outside the database (anchoring)."""
    svc = services()
    with svc.engine.connect() as conn:
        result = audit.head(conn)
    text = ("audit log is empty" if result["id"] is None
            else f"{result['id']}  {result['hash']}  {result['at']}")
    emit(as_json, result, text=text)


@audit_group.command("rechain")
@json_option
@handles_ledger_errors
def audit_rechain(as_json: bool) -> None:
    """Seal rows written before the chain was keyed, and key old fingerprints; audited."""
    svc = services()
    with svc.engine.begin() as conn:
        refreshed = refresh_fingerprints(conn, svc.box)
        result = audit.rechain(conn, audit.Actor.cli(), at=svc.clock.now(),
                               fingerprints=refreshed)
    emit(as_json, result, text=(
        f"sealed {result['rechained']} unkeyed audit rows and re-keyed "
        f"{result['fingerprints']} fingerprints" if result["audit_id"] is not None
        else "nothing to re-chain: the log and fingerprints are already keyed"))
