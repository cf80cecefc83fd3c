"""Turn query-string filters into query filters (shared by the dashboard and the API)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy import Connection

from ledger.access.integrations import get_integration, get_integration_by_scope
from ledger.domain import ReceiptState
from ledger.errors import NotFound
from ledger.ids import EVENT_ID, EVENT_TYPE, INTEGRATION_ID, KEY_ID, SLUG
from ledger.reads.admin import AuditFilter
from ledger.reads.cursor import EARLIEST_INSTANT, LATEST_INSTANT, in_instant_range
from ledger.reads.deliveries import OUTCOMES, DeliveryFilter
from ledger.reads.receipts import ReceiptFilter
from ledger.reads.search import scope_ids_with_prefix

MAX_FIELD = 200
MAX_PREFIX_SCOPES = 200


class BadFilter(ValueError):
    """A filter value the operator has to correct."""


def parse_time(raw: str | None, label: str) -> datetime | None:
    """Parse an ISO time (a bare one is UTC), or raise BadFilter."""
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadFilter(f"{label}: use a time like 2026-11-30T09:00 (UTC)") from None
    # Range first: converting a far date with an offset to UTC would overflow.
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    if not in_instant_range(moment):
        raise BadFilter(f"{label}: use a time between {EARLIEST_INSTANT.year} "
                        f"and {LATEST_INSTANT.year}")
    return moment.astimezone(UTC)


def scope_id_of(conn: Connection, raw: str | None) -> int | None:
    """Resolve `account/name` or an integration id to the scope id, or raise BadFilter."""
    if not raw:
        return None
    raw = raw.strip()[:MAX_FIELD]
    try:
        if INTEGRATION_ID.fullmatch(raw):
            return get_integration(conn, raw).id
        return get_integration_by_scope(conn, raw).id
    except NotFound:
        raise BadFilter(f"no such scope: {raw}") from None


def scopes_of(conn: Connection, raw: str | None) -> tuple[int | None, tuple[int, ...] | None]:
    """Resolve a scope filter: `account/name` or an integration id to one scope id, or an
    account alone to the scope ids of all its integrations; raise BadFilter otherwise."""
    from ledger.reads.search import account_scope_ids

    raw = (raw or "").strip()[:MAX_FIELD]
    if raw and "/" not in raw and not INTEGRATION_ID.fullmatch(raw) and SLUG.fullmatch(raw):
        ids = account_scope_ids(conn, raw)
        if not ids:
            raise BadFilter(f"no such scope or account: {raw}")
        return None, ids
    return scope_id_of(conn, raw), None


def account_of(raw: str | None) -> str | None:
    """Return an account slug filter, or raise BadFilter for what no account can be."""
    raw = (raw or "").strip()
    if raw and not SLUG.fullmatch(raw):
        raise BadFilter("account must match [a-z0-9][a-z0-9_-]{0,62}")
    return raw or None


def audit_after(args: Mapping[str, str]) -> int:
    """Return the audit row id chain verification continues after (0: from the start)."""
    raw = (args.get("after") or "0").strip()
    if not raw.isdigit() or len(raw) > 18:
        raise BadFilter("after: use an audit row id (a whole number)")
    return int(raw)


def receipt_filter(conn: Connection, args: Mapping[str, str]) -> ReceiptFilter:
    """Build a receipt filter from request arguments, or raise BadFilter."""
    state = (args.get("state") or "").strip()
    if state and state not in {s.value for s in ReceiptState}:
        raise BadFilter("state must be pending, complete or failed")
    event_type = (args.get("event_type") or "").strip()
    if event_type and not EVENT_TYPE.fullmatch(event_type):
        raise BadFilter("event type has characters no event type can have")
    prefix = (args.get("prefix") or "").strip()
    if prefix and not EVENT_ID.fullmatch(prefix):  # a prefix of an id has an id's form
        raise BadFilter("event id prefix has characters no event id can have")
    since, until = parse_time(args.get("since"), "since"), parse_time(args.get("until"), "until")
    if since and until and since >= until:
        raise BadFilter("since must be before until")
    scope_id, scope_ids = scopes_of(conn, args.get("scope"))
    return ReceiptFilter(scope_id=scope_id, scope_ids=scope_ids,
                         state=ReceiptState(state) if state else None,
                         event_type=event_type or None, since=since, until=until,
                         prefix=prefix or None)


def delivery_filter(conn: Connection, args: Mapping[str, str]) -> DeliveryFilter:
    """Build a delivery log filter from request arguments, or raise BadFilter."""
    key_id = (args.get("key_id") or "").strip()
    if key_id and not KEY_ID.fullmatch(key_id):
        raise BadFilter("key_id must look like key_ followed by 22 letters and digits")
    outcome = (args.get("outcome") or "").strip()
    if outcome and outcome not in OUTCOMES:
        raise BadFilter(f"outcome must be one of {', '.join(OUTCOMES)}")
    since, until = parse_time(args.get("since"), "since"), parse_time(args.get("until"), "until")
    if since and until and since >= until:
        raise BadFilter("since must be before until")
    event_id = (args.get("event_id") or "").strip()
    if event_id and not EVENT_ID.fullmatch(event_id):
        raise BadFilter("event_id has characters an event id cannot have")
    one, many = scope_prefix_of(conn, (args.get("integration") or "").strip())
    return DeliveryFilter(integration_id=one, integration_ids=many, key_id=key_id or None,
                          event_id=event_id or None, outcome=outcome or None,
                          since=since, until=until)


def scope_prefix_of(conn: Connection, raw: str) -> tuple[int | None, tuple[int, ...] | None]:
    """Resolve an integration filter: one scope exactly, else every scope it is a prefix of
    (`acme` → acme's integrations, `acme/str` → acme/stripe-…); raise BadFilter for none."""
    raw = raw[:MAX_FIELD]
    if not raw:
        return None, None
    try:
        return scope_id_of(conn, raw), None
    except BadFilter:
        if INTEGRATION_ID.fullmatch(raw):
            raise
    _printable(raw, "integration")
    ids = scope_ids_with_prefix(conn, raw, limit=MAX_PREFIX_SCOPES + 1)
    if not ids:
        raise BadFilter(f"no scope starts with {raw}")
    if len(ids) > MAX_PREFIX_SCOPES:
        raise BadFilter(f"more than {MAX_PREFIX_SCOPES} scopes start with {raw}: type more")
    return None, ids


def _printable(value: str, label: str) -> str:
    """Refuse control characters (NUL cannot even be stored in PostgreSQL text)."""
    if not value.isprintable():
        raise BadFilter(f"{label} has characters it cannot have")
    return value


def audit_filter(args: Mapping[str, str]) -> AuditFilter:
    """Build an audit filter from request arguments, or raise BadFilter."""
    for label in ("actor", "action", "scope"):
        _printable(args.get(label) or "", label)
    since, until = parse_time(args.get("since"), "since"), parse_time(args.get("until"), "until")
    return AuditFilter(actor=(args.get("actor") or "").strip()[:MAX_FIELD] or None,
                       action=(args.get("action") or "").strip()[:MAX_FIELD] or None,
                       scope=(args.get("scope") or "").strip()[:MAX_FIELD] or None,
                       since=since, until=until)


def page_size(args: Mapping[str, str], default: int = 50) -> int:
    """Return the requested page size (1-200)."""
    try:
        return max(1, min(int(args.get("limit", default)), 200))
    except ValueError:
        raise BadFilter("limit must be a number") from None
