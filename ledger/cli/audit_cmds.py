"""`ledger audit …`: check, anchor and re-chain the audit log's keyed hash chain."""

from __future__ import annotations

import sys

import click

from ledger.access import audit
from ledger.access.credentials import refresh_fingerprints
from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services

WHY_NOT_OK = {
    "broken": "audit log BROKEN at row {first_bad} ({rows} rows): a row was changed, "
              "removed or forged",
    "anchor": "audit log BROKEN: the anchored head (row {first_bad}) is not in the log as "
              "anchored ({rows} rows): rows were deleted or rewritten",
    "unsealed": "audit log NOT VERIFIED: it opens with rows that were never keyed (from row "
                "{first_bad}, {rows} rows). If this deployment ever ran with LEDGER_AUDIT_KEY, "
                "the log was rewritten: compare with your anchored head (`ledger audit verify "
                "--head ID:HASH`). Only a log written before the key existed may be sealed: "
                "`ledger audit rechain --never-keyed`",
}


def _anchor(value: str | None) -> tuple[int, str] | None:
    """Parse --head, as a usage error when malformed."""
    if value is None:
        return None
    try:
        return audit.parse_anchor(value)
    except ValueError as error:
        raise click.UsageError(str(error)) from None


HEAD_OPTION = click.option("--head", "anchored", metavar="ID:HASH", default=None,
                           help="An anchored head (`ledger audit head`) the log must hold.")


@ledger_cli.group("audit")
def audit_group() -> None:
    """The append-only audit log."""


@audit_group.command("verify")
@HEAD_OPTION
@json_option
def audit_verify(anchored: str | None, as_json: bool) -> None:
    """Walk the hash chain; exit 1 and name the first bad row when it is broken."""
    anchor = _anchor(anchored)
    svc = services()
    with svc.engine.connect() as conn:
        result, why = audit.check_chain(conn, anchor)
    text = (f"audit log intact: {result['rows']} rows"
            + (f", anchored head {anchor[0]} present" if anchor else "")
            if why is None else WHY_NOT_OK[why].format(**result))
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
            else f"{result['id']}:{result['hash']}  {result['at']}")
    emit(as_json, result, text=text)


@audit_group.command("rechain")
@click.option("--never-keyed", is_flag=True,
              help="Your word that the unkeyed rows were written before the key existed.")
@HEAD_OPTION
@json_option
@handles_ledger_errors
def audit_rechain(never_keyed: bool, anchored: str | None, as_json: bool) -> None:
    """Seal rows written before the chain was keyed (once), and key old fingerprints; audited."""
    anchor = _anchor(anchored)
    svc = services()
    with svc.engine.begin() as conn:
        refreshed = refresh_fingerprints(conn, svc.box)
        result = audit.rechain(conn, audit.Actor.cli(), at=svc.clock.now(),
                               fingerprints=refreshed, never_keyed=never_keyed, anchor=anchor)
    emit(as_json, result, text=(
        f"sealed {result['rechained']} unkeyed audit rows and re-keyed "
        f"{result['fingerprints']} fingerprints" if result["audit_id"] is not None
        else "nothing to re-chain: the log and fingerprints are already keyed"))
