"""Dashboard actions: each a POST (CSRF-checked), role-checked on the server, one audit row
per change written in the action's own transaction."""

from __future__ import annotations

import secrets
from typing import Any

from flask import Response, abort, request

from ledger.access import audit
from ledger.access.credentials import (
    add_credential,
    get_credential,
    is_last_live_key,
    revoke_credential,
    rotate_credential,
)
from ledger.access.integrations import get_integration
from ledger.errors import LedgerError, NotFound, TooLong
from ledger.intake.conflict_review import acknowledge_conflict
from ledger.reads.admin import credential_rows, list_conflicts
from ledger.reads.groups import count_group, group_chunk
from ledger.reads.receipts import scope_names
from ledger.reads.requeue_batches import BATCH_ID, batch_outcomes, note_requeued
from ledger.reads.work import COUNT_CAP, count_failures, failures_chunk
from ledger.web.auth import actor, confirm_password, requires, services
from ledger.web.dashboard import bp, render
from ledger.web.filters import BadFilter, receipt_filter
from ledger.worker.requeue import requeue_receipt

BATCH_SIZE = 100
OVERLAP_CHOICES = (0, 3600, 86400, 7 * 86400)


def status_of(error: LedgerError) -> int:
    """Return the HTTP status of a refused or missing record (400: the input was too long)."""
    if isinstance(error, TooLong):
        return 400
    return 404 if isinstance(error, NotFound) else 409


@bp.post("/failures/requeue")
@requires("oncall")
def requeue_one() -> Response:
    """Requeue one failed receipt with a reason."""
    svc = services()
    scope, event_id = request.form.get("scope", ""), request.form.get("event_id", "")
    try:
        with svc.engine.begin() as conn:
            requeue_receipt(conn, actor(), scope=scope, event_id=event_id,
                            reason=request.form.get("reason", ""), now=svc.clock.now(),
                            review_window_seconds=svc.settings.review_window_seconds)
    except LedgerError as error:
        return render("action.html", "partials/_requeue_result.html", status=status_of(error),
                      ok=False, message=str(error), scope=scope, event_id=event_id)
    return render("action.html", "partials/_requeue_result.html", ok=True,
                  message=f"Requeued {scope}:{event_id}.", scope=scope, event_id=event_id)


def _filter_args() -> dict[str, str]:
    """Return the failure filter carried by a batch form (and the failure group, if one)."""
    args = {k: request.form.get(k, "") for k in ("scope", "event_type", "since", "until")}
    if request.form.get("group"):  # one failure group (ledger.reads.groups) of the filter
        args["group"] = request.form["group"][:64]
    return args


@bp.post("/failures/requeue-all/preview")
@requires("oncall")
def requeue_all_preview() -> Response:
    """Show how many failures the filter matches and ask for confirmation."""
    svc = services()
    args, reason = _filter_args(), request.form.get("reason", "").strip()
    try:
        with svc.reads.local.connect() as conn:
            f = receipt_filter(conn, args)
            total, capped = (count_group(conn, f, args["group"], cap=COUNT_CAP)
                             if args.get("group") else count_failures(conn, f))
    except BadFilter as problem:
        return render("action.html", "partials/_requeue_confirm.html", status=400,
                      error=str(problem), total=0, capped=False, args=args, reason=reason)
    error = None if reason else "A reason is required."
    if len(reason) > audit.MAX_REASON_LENGTH:
        error = f"A reason must be at most {audit.MAX_REASON_LENGTH} characters."
    return render("action.html", "partials/_requeue_confirm.html", status=400 if error else 200,
                  error=error, total=total, capped=capped, args=args, reason=reason)


@bp.post("/failures/requeue-all")
@requires("oncall")
def requeue_all_step() -> Response:
    """Requeue the next chunk of matching failures; the answer polls for the next chunk."""
    svc = services()
    args, reason = _filter_args(), request.form.get("reason", "").strip()
    done, skipped = _int_field("done"), _int_field("skipped")
    total = _int_field("total")
    after = _after_key(request.form.get("after", ""))
    batch = request.form.get("batch") or secrets.token_hex(8)
    if not reason or len(reason) > audit.MAX_REASON_LENGTH or not BATCH_ID.fullmatch(batch):
        abort(400)
    try:
        with svc.engine.begin() as conn:
            f = receipt_filter(conn, args)
            if args.get("group"):  # scan the filter's failures; requeue the group's only
                keys, last, scanned = group_chunk(conn, f, args["group"], after, BATCH_SIZE)
            else:
                keys = failures_chunk(conn, f, after, BATCH_SIZE)
                last, scanned = (keys[-1] if keys else None), len(keys)
            names = scope_names(conn, {k[1] for k in keys})
            for key in keys:
                if _requeue_quietly(conn, names[key[1]][0], key[2], reason):
                    note_requeued(conn, batch, key[1], key[2], svc.clock.now())
                    done += 1
                else:
                    skipped += 1
    except BadFilter:
        abort(400)
    running = scanned == BATCH_SIZE
    next_after = _encode_key(last) if last else request.form.get("after", "")
    response = render("action.html", "partials/_requeue_progress.html", running=running,
                      done=done, skipped=skipped, total=max(total, done + skipped), args=args,
                      reason=reason, after=next_after, batch=batch,
                      outcomes=None if running else _outcomes(batch))
    if not running:  # the lists and the groups refresh at once, not at their next poll
        response.headers["HX-Trigger"] = "failures-changed"
    return response


def _outcomes(batch: str) -> dict[str, int]:
    """Return what became of a batch's receipts so far."""
    with services().reads.local.connect() as conn:
        return batch_outcomes(conn, batch)


@bp.get("/failures/requeued/<batch>")
@requires("viewer")
def requeue_all_followup(batch: str) -> Response:
    """A bulk requeue's live follow-through: complete / pending / failed again."""
    if not BATCH_ID.fullmatch(batch):
        abort(404)
    return render("action.html", "partials/_requeue_followup.html", batch=batch,
                  outcomes=_outcomes(batch))


def _requeue_quietly(conn: Any, scope: str, event_id: str, reason: str) -> bool:
    """Requeue one receipt inside a savepoint; False when it was refused."""
    svc = services()
    try:
        with conn.begin_nested():
            requeue_receipt(conn, actor(), scope=scope, event_id=event_id, reason=reason,
                            now=svc.clock.now(),
                            review_window_seconds=svc.settings.review_window_seconds)
    except LedgerError:
        return False
    return True


def _int_field(name: str) -> int:
    """Read a small non-negative integer from the form."""
    try:
        return max(0, int(request.form.get(name, "0") or 0))
    except ValueError:
        abort(400)


def _encode_key(key: tuple[Any, int, str]) -> str:
    """Encode a batch position."""
    from ledger.reads import encode_cursor

    return encode_cursor(*key)


def _after_key(raw: str) -> tuple[Any, int, str] | None:
    """Decode a batch position, or None at the start."""
    from datetime import datetime

    from ledger.reads import BadCursor, decode_cursor

    if not raw:
        return None
    try:
        return decode_cursor(raw, (datetime, int, str))
    except BadCursor:
        abort(400)


@bp.post("/conflicts/<int:conflict_id>/ack")
@requires("oncall")
def acknowledge(conflict_id: int) -> Response:
    """Acknowledge a conflict with a note."""
    svc = services()
    status, message = 200, f"Conflict {conflict_id} acknowledged."
    try:
        with svc.engine.begin() as conn:
            acknowledge_conflict(conn, actor(), conflict_id, note=request.form.get("note", ""),
                                 now=svc.clock.now())
    except LedgerError as error:
        status, message = status_of(error), str(error)
    with svc.engine.connect() as conn:
        page = list_conflicts(conn, unacknowledged=True)
    return render("conflicts.html", "partials/_conflicts.html", status=status, page=page,
                  error=None if status == 200 else message,
                  message=message if status == 200 else None, open_only=True, args={})


def credentials_answer(public_id: str, *, status: int = 200, secret: dict[str, Any] | None = None,
                        message: str | None = None, error: str | None = None,
                        confirm_last: dict[str, str] | None = None) -> Response:
    """Re-render an integration's credentials with a one-time secret, a message or a question."""
    svc = services()
    with svc.engine.connect() as conn:
        try:
            integration = get_integration(conn, public_id)
        except NotFound:  # e.g. a wrong password on an unknown integration
            abort(404)
        rows = credential_rows(conn, integration.id)
    return render("credentials.html", "partials/_credentials.html", status=status,
                  integration=integration, credentials=rows, secret=secret, message=message,
                  error=error, confirm_last=confirm_last)


@bp.post("/credentials/<public_id>/add")
@requires("security", session_only=True)
def credential_add(public_id: str) -> Response:
    """Add an active credential after re-entering the password; its secret is shown once."""
    svc = services()
    refused = confirm_password(request.form.get("password", ""))
    if refused:
        return credentials_answer(public_id, status=403, error=refused)
    try:
        with svc.engine.begin() as conn:
            integration = get_integration(conn, public_id)
            created = add_credential(conn, svc.box, actor(), integration, now=svc.clock.now(),
                                     reason=request.form.get("reason", "").strip() or None,
                                     label=request.form.get("label"))
    except LedgerError as error:
        return _credentials_or_404(public_id, error)
    svc.view.invalidate()
    return credentials_answer(public_id, secret={"key_id": created.key_id,
                                                  "secret": created.shown_secret},
                               message=f"Added {created.key_id}.")


@bp.post("/credentials/<public_id>/rotate")
@requires("security", session_only=True)
def credential_rotate(public_id: str) -> Response:
    """Rotate with a chosen overlap after re-entering the password."""
    svc = services()
    refused = confirm_password(request.form.get("password", ""))
    if refused:
        return credentials_answer(public_id, status=403, error=refused)
    reason = request.form.get("reason", "").strip()
    if not reason:
        return credentials_answer(public_id, status=400, error="a reason is required")
    try:
        overlap = int(request.form.get("overlap", "86400"))
        with svc.engine.begin() as conn:
            integration = get_integration(conn, public_id)
            rotation = rotate_credential(conn, svc.box, actor(), integration,
                                         now=svc.clock.now(), overlap_seconds=overlap,
                                         reason=reason, label=request.form.get("label"))
    except ValueError:
        return credentials_answer(public_id, status=400, error="overlap must be seconds")
    except LedgerError as error:
        return _credentials_or_404(public_id, error)
    svc.view.invalidate()
    return credentials_answer(public_id, secret={"key_id": rotation.key_id,
                                                  "secret": rotation.secret},
                               message=f"Rotated: {rotation.key_id} is active; "
                                       f"{len(rotation.retiring)} key(s) retiring.")


@bp.post("/credentials/<public_id>/revoke")
@requires("security", session_only=True)
def credential_revoke(public_id: str) -> Response:
    """Revoke one key of this integration with a reason, after re-entering the password.

    Revoking the integration's last live key stops all its deliveries, so that is said
    and confirmed first (`confirm_last=1`), before the password is even looked at.
    """
    svc = services()
    key_id = request.form.get("key_id", "")
    confirmed = request.form.get("confirm_last") == "1"
    question = {"key_id": key_id, "reason": request.form.get("reason", "")}
    try:
        with svc.engine.begin() as conn:
            integration = get_integration(conn, public_id)
            if get_credential(conn, key_id).integration_id != integration.id:
                raise NotFound("credential", key_id)
            last = is_last_live_key(conn, integration.id, key_id, svc.clock.now())
    except LedgerError as error:
        return _credentials_or_404(public_id, error)
    if last and not confirmed:
        return credentials_answer(public_id, status=409, confirm_last=question)
    refused = confirm_password(request.form.get("password", ""))
    if refused:
        return credentials_answer(public_id, status=403, error=refused,
                                   confirm_last=question if last else None)
    try:
        with svc.engine.begin() as conn:
            integration = get_integration(conn, public_id)
            if get_credential(conn, key_id).integration_id != integration.id:
                raise NotFound("credential", key_id)
            revoke_credential(conn, actor(), key_id, reason=request.form.get("reason", ""),
                              now=svc.clock.now())
    except LedgerError as error:
        return _credentials_or_404(public_id, error)
    svc.view.invalidate()
    return credentials_answer(
        public_id, message=f"Revoked {key_id}. Every instance refuses it within "
                           f"{svc.settings.revocation_bound_seconds} s.")


def _credentials_or_404(public_id: str, error: LedgerError) -> Response:
    """Answer a refused credential action (or 404 when the integration is unknown)."""
    if isinstance(error, NotFound) and error.what == "integration":
        abort(404)
    return credentials_answer(public_id, status=status_of(error), error=str(error))

