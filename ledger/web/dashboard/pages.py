"""Read-only dashboard pages. No GET here changes state.

Their reads run through replica_read (the read replica when configured), except the
credential pages and the audit chain's verification, which show the primary's truth.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Response, abort, g, request
from sqlalchemy import Connection

from ledger.access import audit
from ledger.errors import NotFound
from ledger.intake.signatures import PROFILE_NAMES
from ledger.intake.signatures.catalog import cards
from ledger.reads import BadCursor, Page
from ledger.reads.admin import list_audit, list_conflicts, list_integrations, read_credentials
from ledger.reads.capacity import measure_on
from ledger.reads.models import CapacityFigures
from ledger.reads.overview import read_overview
from ledger.reads.receipts import list_receipts, read_receipt
from ledger.reads.revocations import revocation_evidence
from ledger.reads.stuck import live_workers
from ledger.reads.throughput import read_throughput
from ledger.reads.work import read_failures, read_stuck_work
from ledger.web.auth import requires, services
from ledger.web.dashboard import audit_rows, bp, deliveries, drill_page, render
from ledger.web.dashboard.svg import human_bytes, projection_chart, rate_chart, series_chart
from ledger.web.filters import (
    BadFilter,
    account_of,
    audit_after,
    audit_filter,
    page_size,
    receipt_filter,
    scope_id_of,
)
from ledger.web.read_source import replica_read

OVERVIEW_REFRESH_SECONDS = 10
GROUP_ID = re.compile(r"[0-9a-f]{16}")
LIST_REFRESH_SECONDS = 15  # Failures, Stuck work and an integration's credentials


def _cursor() -> str | None:
    """Return the page cursor of the request."""
    return request.args.get("cursor") or None


@bp.get("/")
@requires("viewer")
def overview() -> Response:
    """Counts per scope, headline numbers, instances, scheduled runs and charts."""
    svc = services()
    now = svc.clock.now()
    try:
        view = replica_read(lambda conn: read_overview(
            conn, now, cursor=_cursor(), live_within=svc.settings.revocation_bound_seconds))
    except BadCursor:
        abort(400)
    for item in view.scopes.items:
        item["chart"] = series_chart(item["series"], label=item["scope"])
    work = replica_read(lambda conn: read_throughput(conn, now))
    work_chart = rate_chart(work.per_minute, unit="completed",
                            label=f"Completions per minute, {work.per_minute_now:.1f} on average")
    return render("overview.html", "partials/_overview.html", now=now, work=work,
                  work_chart=work_chart,
                  refresh_seconds=OVERVIEW_REFRESH_SECONDS,
                  bound=svc.settings.revocation_bound_seconds, head=view.headline,
                  scopes=view.scopes, refreshed_at=view.rollups_refreshed_at,
                  instances=view.instances, live_counts=view.live_counts,
                  no_live_worker=view.no_live_worker, runs=view.scheduler_runs)


def _receipts_context(args: Any) -> dict[str, Any]:
    """Run the receipt list for the request's filters; errors become a message."""
    svc = services()

    def read(conn: Connection) -> Page:
        return list_receipts(conn, receipt_filter(conn, args), now=svc.clock.now(),
                             cursor=args.get("cursor") or None, limit=page_size(args))

    try:
        page = replica_read(read)
    except (BadFilter, BadCursor) as error:
        return {"error": str(error), "page": None}
    return {"error": None, "page": page}


@bp.get("/receipts")
@requires("viewer")
def receipts_page() -> Response:
    """Receipts of one scope or all, filtered and keyset-paged."""
    context = _receipts_context(request.args)
    status = 400 if context["error"] else 200
    return render("receipts.html", "partials/_receipts.html", status=status,
                  args=request.args, **context)


@bp.get("/receipts/<public_id>/<path:event_id>")
@requires("viewer")
def receipt_page(public_id: str, event_id: str) -> Response:
    """One receipt: timeline, digest, result, conflicts, audit rows, retained payload."""
    svc = services()
    try:
        integration, item = replica_read(lambda conn: read_receipt(conn, public_id, event_id))
    except NotFound:
        abort(404)
    item["deliveries"] = deliveries.visible_rows(item["deliveries"])
    now = svc.clock.now()
    live = replica_read(lambda conn: live_workers(
        conn, now, within_seconds=svc.settings.revocation_bound_seconds))
    return render("receipt.html", receipt=item, integration=integration, now=now,
                  live_workers=live)


@bp.get("/stuck")
@requires("viewer")
def stuck_page() -> Response:
    """Pending past the threshold, expired leases, due-but-unclaimed work items, findings."""
    svc = services()
    now = svc.clock.now()
    view = replica_read(lambda conn: read_stuck_work(
        conn, now, threshold_seconds=svc.settings.stuck_pending_seconds,
        max_attempts=svc.settings.max_attempts,
        live_within=svc.settings.revocation_bound_seconds))
    return render("stuck.html", "partials/_stuck.html", now=now,
                  refresh_seconds=LIST_REFRESH_SECONDS,
                  threshold=view.threshold_seconds, grace=view.grace_seconds,
                  stuck=view.stuck, retrying=view.retrying, live_workers=view.live_workers,
                  running=view.running,
                  findings=view.findings)


def failures_context(args: Any) -> dict[str, Any]:
    """Run the failure list for the request's filters."""
    try:
        group = (args.get("group") or "").strip() or None
        if group is not None and not GROUP_ID.fullmatch(group):
            raise BadFilter("group must be a failure group's id (16 hex digits)")
        view = replica_read(lambda conn: read_failures(
            conn, receipt_filter(conn, args), cursor=args.get("cursor") or None,
            limit=page_size(args), group=group))
    except (BadFilter, BadCursor) as error:
        return {"error": str(error), "page": None, "total": 0, "capped": False}
    return {"error": None, "page": view.page, "total": view.total, "capped": view.capped}


@bp.get("/failures")
@requires("viewer")
def failures_page() -> Response:
    """Terminal failures with their last error; requeue one or all matching."""
    context = failures_context(request.args)
    return render("failures.html", "partials/_failures.html",
                  refresh_seconds=LIST_REFRESH_SECONDS,
                  status=400 if context["error"] else 200, args=request.args, **context)


@bp.get("/conflicts")
@requires("viewer")
def conflicts_page() -> Response:
    """Same id with another body, and replayed bodies; acknowledge with a note."""
    open_only = request.args.get("open", "1") == "1"
    try:
        page = replica_read(lambda conn: list_conflicts(
            conn, scope_id=scope_id_of(conn, request.args.get("scope")),
            unacknowledged=open_only, cursor=_cursor()))
        error = None
    except (BadFilter, BadCursor) as problem:
        page, error = None, str(problem)
    return render("conflicts.html", "partials/_conflicts.html", page=page, error=error,
                  open_only=open_only, args=request.args, status=400 if error else 200,
                  conflict_body_seconds=services().settings.conflict_body_seconds)


@bp.get("/credentials")
@requires("viewer")
def integrations_page() -> Response:
    """Integrations by scope, each linking to its credentials."""
    return integrations_answer()


def integrations_answer(*, status: int = 200, error: str | None = None) -> Response:
    """Render the integrations list (and, for security, the connect form)."""
    svc = services()
    with svc.engine.connect() as conn:
        try:
            page = list_integrations(conn, account=account_of(request.args.get("account")),
                                     cursor=_cursor())
        except (BadCursor, BadFilter):
            abort(400)
    # The newest drill run stays on the page after a reload (security only runs it).
    last_drill = drill_page.last_run() if g.operator.can("security") else None
    return render("integrations.html", "partials/_integrations.html", page=page,
                  args=request.args, profiles=PROFILE_NAMES, cards=cards(), error=error,
                  status=status, form=request.form, last_drill=last_drill,
                  poll_seconds=drill_page.POLL_SECONDS)


@bp.get("/credentials/<public_id>")
@requires("viewer")
def credentials_page(public_id: str) -> Response:
    """An integration's credentials: states, fingerprints, dates; actions for security."""
    svc = services()
    now, bound = svc.clock.now(), svc.settings.revocation_bound_seconds
    try:
        with svc.engine.connect() as conn:
            integration, rows = read_credentials(conn, public_id, now)
            evidence = revocation_evidence(conn, rows, now=now, live_within=bound)
    except NotFound:
        abort(404)
    return render("credentials.html", "partials/_credentials.html", integration=integration,
                  refresh_seconds=LIST_REFRESH_SECONDS, evidence=evidence, bound=bound,
                  credentials=rows, secret=None, message=None)


@bp.get("/audit")
@requires("viewer")
def audit_page() -> Response:
    """The audit log, filtered by actor, action, scope and time."""
    try:
        f = audit_filter(request.args)
        page = replica_read(lambda conn: list_audit(conn, f, cursor=_cursor(),
                                                    limit=page_size(request.args)))
        error = None
    except (BadFilter, BadCursor) as problem:
        page, error = None, str(problem)
    return render("audit.html", "partials/_audit.html", page=page, error=error,
                  groups=audit_rows.grouped(page.items) if page else [],
                  args=request.args, status=400 if error else 200)


@bp.get("/audit/verify")
@requires("viewer")
def audit_verify() -> Response:
    """Verify a chunk of the hash chain (loaded lazily by the audit page); the status
    replaces itself with the next chunk's until the walk ends in a verdict."""
    try:
        after = audit_after(request.args)
    except BadFilter as error:
        return render("partials/_audit_verify.html", result=None, error=str(error),
                      status=400)
    with services().reads.local.connect() as conn:
        result = audit.verify_chunk(conn, after)
    return render("partials/_audit_verify.html", result=result, error=None)


@bp.get("/capacity")
@requires("viewer")
def capacity_page() -> Response:
    """The seed's equation with measured bytes per receipt, and a projection chart."""
    svc = services()
    numbers: CapacityFigures | None = replica_read(lambda conn: measure_on(
        conn, svc.settings, now=svc.clock.now(), from_rollups=True))
    chart = None
    per = numbers["bytes_per_receipt_measured"] if numbers is not None else None
    if per is None:
        numbers = None  # no receipts yet: nothing to measure, the page says so
    if numbers is not None and per is not None:
        chart = projection_chart(events_per_day=numbers["events_per_day"],
                                 bytes_per_receipt=per,
                                 retention_days=numbers["retention_days"])
    return render("capacity.html", numbers=numbers, chart=chart, human_bytes=human_bytes,
                  retention_seconds=svc.settings.retention_seconds, **_purge_context())


def _purge_context() -> dict[str, Any]:
    """The next purge's preview and the forensic window's cost, for the Capacity page."""
    from ledger.jobs.retention_preview import PAGE_CAP, PAGE_SCOPES, forensic_cost, preview

    svc = services()

    def read(conn: Connection) -> dict[str, Any]:
        return {"purge": preview(conn, svc.settings, svc.clock.now(), cap=PAGE_CAP,
                                 named=PAGE_SCOPES),
                "forensic": forensic_cost(conn)}

    return {**replica_read(read), "page_cap": PAGE_CAP, "now": svc.clock.now(),
            "conflict_body_seconds": svc.settings.conflict_body_seconds}

