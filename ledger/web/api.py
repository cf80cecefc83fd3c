"""/api/v1: the dashboard's reads as JSON, for an operator API token or a session.

The reads run through replica_read (the read replica when configured; headers say
where), except an integration's credentials and the audit chain's verification,
which read the primary.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.errors import NotFound
from ledger.reads import BadCursor, Page
from ledger.reads.admin import list_audit, list_conflicts, list_integrations, read_credentials
from ledger.reads.capacity import measure_on
from ledger.reads.deliveries import list_deliveries
from ledger.reads.destinations import hide_responses, read_destinations
from ledger.reads.models import DeliveryItem
from ledger.reads.overview import read_overview
from ledger.reads.receipts import list_receipts, payload_value, read_receipt
from ledger.reads.work import read_failures, read_stuck_work
from ledger.web.auth import require_login, services
from ledger.web.filters import (
    BadFilter,
    account_of,
    audit_after,
    audit_filter,
    delivery_filter,
    page_size,
    receipt_filter,
    scope_id_of,
)
from ledger.web.read_source import replica_read

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


def _cursor() -> str | None:
    """Return the page cursor of the request."""
    return request.args.get("cursor") or None


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


@bp.errorhandler(NotFound)
def _missing(_error: NotFound) -> Response:
    """Answer a missing record: 404 not_found."""
    return _not_found()


@bp.get("/me")
def me() -> Response:
    """Who the token or session belongs to."""
    return jsonify({"username": g.operator.username, "role": g.operator.role})


@bp.get("/overview")
def overview() -> Response:
    """Headline numbers, a page of scopes with rollup counts, instances, scheduled runs."""
    svc = services()
    now = svc.clock.now()
    view = replica_read(lambda conn: read_overview(
        conn, now, cursor=_cursor(), live_within=svc.settings.revocation_bound_seconds))
    return jsonify(plain({
        "headline": view.headline, "rollups_refreshed_at": view.rollups_refreshed_at,
        "scopes": view.scopes.items, "next_cursor": view.scopes.next_cursor,
        "instances": view.instances, "live_instances": view.live_counts,
        "scheduler_runs": view.scheduler_runs}))


@bp.get("/receipts")
def receipts() -> Response:
    """Receipts filtered by scope, state, event_type, since, until, prefix; keyset paged."""
    svc = services()
    page = replica_read(lambda conn: list_receipts(
        conn, receipt_filter(conn, request.args), now=svc.clock.now(), cursor=_cursor(),
        limit=page_size(request.args)))
    return _page(page)


@bp.get("/receipts/<public_id>/<path:event_id>")
def receipt(public_id: str, event_id: str) -> Response:
    """One receipt with attempts, conflicts and audit rows; the payload for oncall and up."""
    _integration, item = replica_read(lambda conn: read_receipt(conn, public_id, event_id))
    item["deliveries"] = visible_deliveries(item["deliveries"])
    if not g.operator.can("oncall"):
        item.pop("payload", None)
        item["destination_attempts"] = [{**a, "response_excerpt": None}
                                        for a in item["destination_attempts"]]
    elif (payload := item.get("payload")) is not None:
        item["payload"] = payload_value(payload)
    return jsonify(plain(item))


@bp.get("/stuck")
def stuck() -> Response:
    """Stuck and retrying work, pending past the threshold, overdue work items, findings."""
    svc = services()
    now = svc.clock.now()
    view = replica_read(lambda conn: read_stuck_work(
        conn, now, threshold_seconds=svc.settings.stuck_pending_seconds,
        max_attempts=svc.settings.max_attempts,
        live_within=svc.settings.revocation_bound_seconds))
    return jsonify(plain({"stuck": view.stuck, "retrying": view.retrying,
                          "live_workers": view.live_workers,
                          "pending": view.pending, "overdue_jobs": view.overdue_jobs,
                          "findings": view.findings,
                          "threshold_seconds": view.threshold_seconds}))


@bp.get("/failures")
def failures() -> Response:
    """Failed receipts with their last error; `total` is capped (see `total_capped`)."""
    view = replica_read(lambda conn: read_failures(
        conn, receipt_filter(conn, request.args), cursor=_cursor(),
        limit=page_size(request.args)))
    return _page(view.page, total=view.total, total_capped=view.capped)


@bp.get("/conflicts")
def conflicts() -> Response:
    """Conflicts, most recent first; `open=1` for unacknowledged only."""
    page = replica_read(lambda conn: list_conflicts(
        conn, scope_id=scope_id_of(conn, request.args.get("scope")),
        unacknowledged=request.args.get("open") == "1", cursor=_cursor(),
        limit=page_size(request.args)))
    return _page(page)


@bp.get("/integrations")
def integrations() -> Response:
    """Integrations by scope."""
    page = replica_read(lambda conn: list_integrations(
        conn, account=account_of(request.args.get("account")), cursor=_cursor(),
        limit=page_size(request.args)))
    return _page(page)


@bp.get("/deliveries")
def deliveries() -> Response:
    """The delivery log newest first; `reason` only for security and admin."""
    page = replica_read(lambda conn: list_deliveries(
        conn, delivery_filter(conn, request.args), cursor=_cursor(),
        limit=page_size(request.args)))
    return _page(Page(items=visible_deliveries(page.items), next_cursor=page.next_cursor))


def visible_deliveries(items: Sequence[DeliveryItem]) -> list[DeliveryItem]:
    """Blank the refusal reasons for roles below security (CONTRACT section 7)."""
    if g.operator.can("security"):
        return list(items)
    return [{**item, "reason": None} for item in items]


@bp.get("/destinations")
def destinations() -> Response:
    """Destinations with state and health (never a secret); `integration=in_…` filters.

    The response excerpts of failed attempts only for oncall and up (they may hold payload).
    """
    svc = services()
    public_id = request.args.get("integration")

    def read(conn: Any) -> list[dict[str, Any]]:
        integration_id = get_integration(conn, public_id).id if public_id else None
        return read_destinations(conn, svc.clock.now(), integration_id=integration_id)

    items = replica_read(read)
    if not g.operator.can("oncall"):
        items = hide_responses(items)
    return jsonify(plain({"destinations": items}))


@bp.get("/integrations/<public_id>/credentials")
def credentials(public_id: str) -> Response:
    """An integration's credentials: states, fingerprints, dates, use; never a secret."""
    svc = services()
    with svc.engine.connect() as conn:
        integration, rows = read_credentials(conn, public_id, svc.clock.now())
    return jsonify(plain({"integration": public_id, "scope": integration.scope,
                          "credentials": rows}))


@bp.get("/audit")
def audit_rows() -> Response:
    """Audit rows newest first, filtered by actor, action, scope, since, until."""
    page = replica_read(lambda conn: list_audit(
        conn, audit_filter(request.args), cursor=_cursor(), limit=page_size(request.args)))
    return _page(page)


@bp.get("/audit/verify")
def audit_verify() -> Response:
    """Verify a chunk of the hash chain: {"ok", "rows", "first_bad", "next"} (continue
    with `?after=<next>` while `next` is not null; `ok` is then null)."""
    after = audit_after(request.args)
    with services().reads.local.connect() as conn:
        return jsonify(audit.verify_chunk(conn, after))


@bp.get("/capacity")
def capacity() -> Response:
    """The capacity equation's measured inputs and projection."""
    svc = services()
    return jsonify(plain(replica_read(lambda conn: measure_on(
        conn, svc.settings, now=svc.clock.now(), from_rollups=True))))
