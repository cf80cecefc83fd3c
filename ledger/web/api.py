"""/api/v1: the dashboard's reads as JSON, for an operator API token or a session."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.errors import NotFound
from ledger.reads import BadCursor, Page
from ledger.reads.admin import credential_rows, list_audit, list_conflicts, list_integrations
from ledger.reads.overview import headline, instance_rows, last_runs, scope_rows
from ledger.reads.receipts import list_receipts, payload_value, receipt_detail
from ledger.reads.work import (
    count_failures,
    list_failures,
    open_findings,
    overdue_jobs,
    stuck_pending,
)
from ledger.web.auth import require_login, services
from ledger.web.filters import (
    BadFilter,
    account_of,
    audit_filter,
    page_size,
    receipt_filter,
    scope_id_of,
)

bp = Blueprint("api", __name__, url_prefix="/api/v1")
bp.before_request(require_login)
HIDDEN_KEYS = frozenset({"id_sha256", "secret_enc", "series"})


def plain(value: Any) -> Any:
    """Make a value JSON-friendly: ISO times, hex bytes, nested dicts and lists."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in HIDDEN_KEYS}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _page(page: Page, **extra: Any) -> Response:
    """Answer one keyset page."""
    return jsonify({"items": plain(page.items), "next_cursor": page.next_cursor,
                    **plain(extra)})


def _bad(error: Exception) -> Response:
    """Answer a filter the client must correct."""
    response = jsonify({"error": "bad_request", "detail": str(error)})
    response.status_code = 400
    return response


def _not_found() -> Response:
    """Answer a missing record."""
    response = jsonify({"error": "not_found"})
    response.status_code = 404
    return response


@bp.after_request
def _no_store(response: Response) -> Response:
    """Keep operator data out of shared caches."""
    response.headers["Cache-Control"] = "no-store"
    response.vary.add("Authorization")
    return response


@bp.errorhandler(BadFilter)
@bp.errorhandler(BadCursor)
def _bad_input(error: Exception) -> Response:
    return _bad(error)


@bp.get("/me")
def me() -> Response:
    """Who the token or session belongs to."""
    return jsonify({"username": g.operator.username, "role": g.operator.role})


@bp.get("/overview")
def overview() -> Response:
    """Headline numbers, a page of scopes with rollup counts, instances and job runs."""
    svc = services()
    now = svc.clock.now()
    with svc.engine.connect() as conn:
        page, refreshed = scope_rows(conn, now, cursor=request.args.get("cursor") or None)
        body = {"headline": headline(conn, now), "rollups_refreshed_at": refreshed,
                "scopes": page.items, "next_cursor": page.next_cursor,
                "instances": instance_rows(conn, now), "scheduler_runs": last_runs(conn)}
    return jsonify(plain(body))


@bp.get("/receipts")
def receipts() -> Response:
    """Receipts filtered by scope, state, event_type, since, until, prefix; keyset paged."""
    svc = services()
    with svc.engine.connect() as conn:
        f = receipt_filter(conn, request.args)
        page = list_receipts(conn, f, now=svc.clock.now(),
                             cursor=request.args.get("cursor") or None,
                             limit=page_size(request.args))
    return _page(page)


@bp.get("/receipts/<public_id>/<path:event_id>")
def receipt(public_id: str, event_id: str) -> Response:
    """One receipt with attempts, conflicts and audit rows; the payload for oncall and up."""
    svc = services()
    with svc.engine.connect() as conn:
        try:
            integration = get_integration(conn, public_id)
        except NotFound:
            return _not_found()
        item = receipt_detail(conn, integration.id, event_id)
    if item is None:
        return _not_found()
    if not g.operator.can("oncall"):
        item.pop("payload", None)
    elif item.get("payload") is not None:
        item["payload"] = payload_value(item["payload"])
    return jsonify(plain(item))


@bp.get("/stuck")
def stuck() -> Response:
    """Pending past the threshold, overdue jobs and open findings."""
    svc = services()
    now = svc.clock.now()
    with svc.engine.connect() as conn:
        body = {"pending": stuck_pending(conn, now, svc.settings.stuck_pending_seconds),
                "overdue_jobs": overdue_jobs(conn, now, 30), "findings": open_findings(conn),
                "threshold_seconds": svc.settings.stuck_pending_seconds}
    return jsonify(plain(body))


@bp.get("/failures")
def failures() -> Response:
    """Failed receipts with their last error; `total` is capped (see `total_capped`)."""
    svc = services()
    with svc.engine.connect() as conn:
        f = receipt_filter(conn, request.args)
        page = list_failures(conn, f, cursor=request.args.get("cursor") or None,
                             limit=page_size(request.args))
        total, capped = count_failures(conn, f)
    return _page(page, total=total, total_capped=capped)


@bp.get("/conflicts")
def conflicts() -> Response:
    """Conflicts, most recent first; `open=1` for unacknowledged only."""
    svc = services()
    with svc.engine.connect() as conn:
        page = list_conflicts(conn, scope_id=scope_id_of(conn, request.args.get("scope")),
                              unacknowledged=request.args.get("open") == "1",
                              cursor=request.args.get("cursor") or None,
                              limit=page_size(request.args))
    return _page(page)


@bp.get("/integrations")
def integrations() -> Response:
    """Integrations by scope."""
    svc = services()
    with svc.engine.connect() as conn:
        page = list_integrations(conn, account=account_of(request.args.get("account")),
                                 cursor=request.args.get("cursor") or None,
                                 limit=page_size(request.args))
    return _page(page)


@bp.get("/integrations/<public_id>/credentials")
def credentials(public_id: str) -> Response:
    """An integration's credentials: states, fingerprints, dates; never a secret."""
    svc = services()
    with svc.engine.connect() as conn:
        try:
            integration = get_integration(conn, public_id)
        except NotFound:
            return _not_found()
        rows = credential_rows(conn, integration.id)
    return jsonify(plain({"integration": public_id, "scope": integration.scope,
                          "credentials": rows}))


@bp.get("/audit")
def audit_rows() -> Response:
    """Audit rows newest first, filtered by actor, action, scope, since, until."""
    svc = services()
    with svc.engine.connect() as conn:
        page = list_audit(conn, audit_filter(request.args),
                          cursor=request.args.get("cursor") or None,
                          limit=page_size(request.args))
    return _page(page)


@bp.get("/audit/verify")
def audit_verify() -> Response:
    """Walk the hash chain: {"ok", "rows", "first_bad"}."""
    with services().engine.connect() as conn:
        return jsonify(audit.verify_chain(conn))


@bp.get("/capacity")
def capacity() -> Response:
    """The capacity equation's measured inputs and projection."""
    from ledger.web.dashboard.pages import measure_capacity

    numbers = measure_capacity()
    if numbers is None:
        response = jsonify({"error": "unavailable", "detail": "capacity not measurable yet"})
        response.status_code = 503
        return response
    return jsonify(plain(numbers))
