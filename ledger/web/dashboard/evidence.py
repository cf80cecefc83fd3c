"""Evidence and forced runs: a conflict's body diff, retry a receipt now, run one again."""

from __future__ import annotations

from flask import Response, abort, request

from ledger.errors import LedgerError, NotFound
from ledger.reads.evidence import read_conflict_evidence
from ledger.web.auth import actor, requires, services
from ledger.web.dashboard import bp, render
from ledger.web.dashboard.actions import status_of
from ledger.web.read_source import replica_read
from ledger.worker.rerun import retry_now, run_again


@bp.get("/conflicts/<int:conflict_id>")
@requires("viewer")
def conflict_page(conflict_id: int) -> Response:
    """One conflict: digests, counts and, for oncall and above, the diff of the two bodies."""
    svc = services()
    try:
        evidence = replica_read(lambda conn: read_conflict_evidence(conn, conflict_id))
    except NotFound:
        abort(404)
    return render("conflict.html", evidence=evidence, c=evidence.conflict,
                  review_window=svc.settings.review_window_seconds)


def _answer(error: LedgerError | None, message: str) -> Response:
    """Render an action's result fragment (or page) with the status the outcome deserves."""
    status = 200
    if error is not None:
        status, message = status_of(error), str(error)
    return render("action.html", "partials/_requeue_result.html", status=status,
                  ok=error is None, message=message)


@bp.post("/receipts/retry-now")
@requires("oncall")
def retry_now_action() -> Response:
    """Skip a pending receipt's backoff: its work item is due now (reason required, audited)."""
    svc = services()
    scope, event_id = request.form.get("scope", ""), request.form.get("event_id", "")
    try:
        with svc.engine.begin() as conn:
            retry_now(conn, actor(), scope=scope, event_id=event_id,
                      reason=request.form.get("reason", ""), now=svc.clock.now())
    except LedgerError as error:
        return _answer(error, "")
    return _answer(None, f"{scope}:{event_id} is due now; the next free worker takes it.")


@bp.post("/receipts/run-again")
@requires("oncall")
def run_again_action() -> Response:
    """Run a completed receipt once more (reason, typed event id, matching body; audited)."""
    svc = services()
    scope, event_id = request.form.get("scope", ""), request.form.get("event_id", "")
    try:
        with svc.engine.begin() as conn:
            run_again(conn, actor(), scope=scope, event_id=event_id,
                      reason=request.form.get("reason", ""),
                      confirm=request.form.get("confirm", ""),
                      body=request.form.get("body", ""), now=svc.clock.now())
    except LedgerError as error:
        return _answer(error, "")
    return _answer(None, f"{scope}:{event_id} is queued to run again; its effect will "
                         "happen a second time.")
