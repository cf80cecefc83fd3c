"""Operator-forced runs: retry a pending receipt now, or run a completed one again.

Both are explicit operator decisions, audited with a reason, and keep the
attempt history: attempt numbers keep counting on the receipt. "Run again"
breaks the ledger's exactly-once guarantee on purpose: the handler's effect
happens a second time (README, "Retry now and run again").
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy import exc as sa_exc

from ledger.access import audit
from ledger.access.integrations import get_integration_by_scope
from ledger.db.schema import attempts, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.errors import AuthenticationFailed, InvalidEvent, Refused
from ledger.intake.pipeline import rerun_item
from ledger.intake.signatures import SenderProfile, profile_for
from ledger.logs import event_ref, get_logger
from ledger.reads.receipts import get_receipt

log = get_logger("ledger.receipts")


def _reason(reason: str, what: str) -> str:
    """Return the stripped reason, or refuse an empty or overlong one."""
    if not reason or not reason.strip():
        raise Refused(f"a reason is required to {what}")
    audit.check_reason(reason.strip())
    return reason.strip()


def retry_now(conn: Connection, actor: audit.Actor, *, scope: str, event_id: str,
              reason: str, now: datetime) -> None:
    """Make a pending receipt's job, waiting on its backoff, due now; audited."""
    reason = _reason(reason, "retry a receipt now")
    integration = get_integration_by_scope(conn, scope)
    job = conn.execute(  # jobs first: the worker's lock order
        select(jobs.c.run_at, jobs.c.status, jobs.c.leased_until)
        .where(jobs.c.scope_id == integration.id, jobs.c.event_id == event_id)
        .with_for_update()).first()
    receipt = get_receipt(conn, scope, event_id)
    if receipt.state is not ReceiptState.PENDING or job is None \
            or job.status != JobStatus.QUEUED.value:
        raise Refused(f"only pending receipts can be retried now; {scope}:{event_id} is "
                      f"{receipt.state.value}")
    if job.leased_until is not None and job.leased_until > now:
        raise Refused(f"an attempt of {scope}:{event_id} is running; wait for its outcome")
    if job.run_at <= now:
        raise Refused(f"{scope}:{event_id} is already due; a worker will take it")
    conn.execute(update(jobs).where(jobs.c.scope_id == integration.id,
                                    jobs.c.event_id == event_id).values(run_at=now))
    audit.record(conn, actor, "receipt.retry_now", f"{scope}:{event_id}", at=now, scope=scope,
                 reason=reason, detail={"was_due_at": job.run_at.isoformat()})
    log.info("job.transition", scope=scope, event_ref=event_ref(scope, event_id),
             event_type=receipt.event_type, attempt=receipt.attempts, from_state="pending",
             to_state="pending", actor=actor.name)


def _matches(profile: SenderProfile, body: str, digest: str) -> bytes | None:
    """Return the body as accepted if its dedup digest is `digest` (a textarea sends CRLF).

    The digest is the intake's: of what the sender's signature covers (Twilio's sorted
    form fields), so a signature-equivalent body matches, as it would be a duplicate there.
    """
    for candidate in (body, body.replace("\r\n", "\n")):
        raw = candidate.encode()
        try:
            signed = profile.signed_digest(raw)
        except AuthenticationFailed:  # not a form the sender could have signed
            continue
        if signed.hex() == digest:
            return raw
    return None


def run_again(conn: Connection, actor: audit.Actor, *, scope: str, event_id: str,
              reason: str, confirm: str, body: str, now: datetime) -> None:
    """Queue a completed receipt to run once more with its original body; audited.

    A completed job's payload leaves the ledger when it completes, so the
    operator supplies the body; it must hash to the receipt's recorded digest,
    so only the body that was accepted can run. A new job row is queued, fenced
    past every earlier lease; the earlier attempts and result stay in the history.
    """
    reason = _reason(reason, "run a receipt again")
    if confirm.strip() != event_id:
        raise Refused("type the event id to confirm running it again")
    integration = get_integration_by_scope(conn, scope)
    conn.execute(select(receipts.c.state).where(  # one operator at a time per receipt
        receipts.c.scope_id == integration.id, receipts.c.event_id == event_id)
        .with_for_update())
    receipt = get_receipt(conn, scope, event_id)
    if receipt.state is not ReceiptState.COMPLETE:
        raise Refused(f"only completed receipts can be run again; {scope}:{event_id} is "
                      f"{receipt.state.value}")
    profile = profile_for(integration)
    raw = _matches(profile, body, receipt.body_sha256)
    if raw is None:
        raise Refused("that body is not the one accepted: its SHA-256 differs from the "
                      "receipt's body digest")
    try:
        item = rerun_item(profile, raw)
    except InvalidEvent as invalid:  # the accepted body always parses; say why if not
        raise Refused(f"that body cannot be run again: {invalid.detail}") from None
    token = conn.execute(select(func.coalesce(func.max(attempts.c.lease_token), 0)).where(
        attempts.c.scope_id == integration.id, attempts.c.event_id == event_id)).scalar_one()
    try:
        conn.execute(insert(jobs).values(
            scope_id=integration.id, event_id=event_id, event_type=receipt.event_type,
            accepted_at=now, run_at=now, status=JobStatus.QUEUED.value, attempts=0,
            lease_token=token, payload=item.payload, content_type=item.content_type,
            raw_body=item.raw_body))
    except sa_exc.IntegrityError:
        raise Refused(f"{scope}:{event_id} already has a queued job") from None
    conn.execute(update(receipts).where(receipts.c.scope_id == integration.id,
                                        receipts.c.event_id == event_id)
                 .values(state=ReceiptState.PENDING.code, completed_at=None))
    audit.record(conn, actor, "receipt.run_again", f"{scope}:{event_id}", at=now, scope=scope,
                 reason=reason, detail={"attempts_before": receipt.attempts,
                                        "result_ref_before": receipt.result_ref})
    log.info("job.transition", scope=scope, event_ref=event_ref(scope, event_id),
             event_type=receipt.event_type, attempt=receipt.attempts, from_state="complete",
             to_state="pending", actor=actor.name)
