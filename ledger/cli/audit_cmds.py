"""`ledger audit …`: check the audit log's hash chain."""

from __future__ import annotations

import sys

from ledger.access.audit import verify_chain
from ledger.cli import ledger_cli
from ledger.cli.common import emit, json_option, services


@ledger_cli.group("audit")
def audit_group() -> None:
    """The append-only audit log."""


@audit_group.command("verify")
@json_option
def audit_verify(as_json: bool) -> None:
    """Walk the hash chain; exit 1 and name the first bad row when it is broken."""
    svc = services()
    with svc.engine.connect() as conn:
        result = verify_chain(conn)
    text = (f"audit log intact: {result['rows']} rows" if result["ok"] else
            f"audit log BROKEN at row {result['first_bad']} ({result['rows']} rows)")
    emit(as_json, result, text=text)
    if not result["ok"]:
        sys.exit(1)
