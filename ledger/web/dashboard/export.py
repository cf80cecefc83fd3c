"""CSV and JSON export of every filtered list, streamed page by page, capped.

Each export reads the list's own keyset pages (the same query as the page, 200 rows
at a time, one short connection per page: no transaction stays open while the
client reads) and stops at EXPORT_ROW_LIMIT rows, which it says in a header and
in a trailing note.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

from flask import Response, abort, request, stream_with_context
from sqlalchemy import Connection
from werkzeug.exceptions import NotFound as UnknownList

from ledger.reads import BadCursor, Page
from ledger.reads.admin import list_audit, list_conflicts
from ledger.reads.receipts import MAX_LIMIT, list_receipts
from ledger.reads.work import read_failures
from ledger.web.api import plain
from ledger.web.auth import requires, services
from ledger.web.dashboard import bp
from ledger.web.filters import BadFilter, audit_filter, receipt_filter, scope_id_of

EXPORT_ROW_LIMIT = 100_000
Fetch = Callable[[Connection, "str | None"], Page]


def _fetcher(kind: str, conn: Connection, args: Any) -> Fetch:
    """Return a page reader for the list `kind` under the request's filters (BadFilter)."""
    now = services().clock.now()
    if kind == "receipts":
        f = receipt_filter(conn, args)
        return lambda c, cur: list_receipts(c, f, now=now, cursor=cur, limit=MAX_LIMIT)
    if kind == "failures":
        f = receipt_filter(conn, args)
        return lambda c, cur: read_failures(c, f, cursor=cur, limit=MAX_LIMIT).page
    if kind == "conflicts":
        scope_id = scope_id_of(conn, args.get("scope"))
        open_only = args.get("open", "1") == "1"
        return lambda c, cur: list_conflicts(c, scope_id=scope_id, unacknowledged=open_only,
                                             cursor=cur, limit=MAX_LIMIT)
    if kind == "audit":
        af = audit_filter(args)
        return lambda c, cur: list_audit(c, af, cursor=cur, limit=MAX_LIMIT)
    raise UnknownList()


def _rows(fetch: Fetch, first: Page) -> Iterator[tuple[dict[str, Any] | None, bool]]:
    """Yield (row, False) up to the cap, then (None, capped) once at the end."""
    page, count = first, 0
    while True:
        for item in page.items:
            if count == EXPORT_ROW_LIMIT:
                yield None, True
                return
            count += 1
            yield plain(item), False
        if page.next_cursor is None:
            yield None, False
            return
        with services().reads.local.connect() as conn:
            page = fetch(conn, page.next_cursor)


# A cell a spreadsheet would read as a formula (OWASP "CSV injection"): reasons, errors and
# client addresses come from people and senders, and `=HYPERLINK(...)` must stay text.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """Return a value as a CSV cell: JSON for structures, a leading quote before a formula."""
    if isinstance(value, dict | list):
        value = json.dumps(value)
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def _csv(rows: Iterator[tuple[dict[str, Any] | None, bool]]) -> Iterator[str]:
    """Stream rows as CSV; a capped export ends with a note row."""
    buffer = io.StringIO()
    writer: csv.DictWriter[str] | None = None
    for row, capped in rows:
        if row is None:
            if capped:
                buffer.write(f"# capped at {EXPORT_ROW_LIMIT} rows: narrow the filter to "
                             "export the rest\r\n")
            break
        if writer is None:
            writer = csv.DictWriter(buffer, fieldnames=list(row), extrasaction="ignore")
            writer.writeheader()
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
        if buffer.tell() > 64 * 1024:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _json(rows: Iterator[tuple[dict[str, Any] | None, bool]]) -> Iterator[str]:
    """Stream rows as one JSON object: items, then whether the cap cut them."""
    yield '{"items": ['
    first = True
    for row, capped in rows:
        if row is None:
            yield (f'], "truncated": {json.dumps(capped)}, '
                   f'"row_limit": {EXPORT_ROW_LIMIT}}}\n')
            return
        yield ("" if first else ",\n") + json.dumps(row, ensure_ascii=False)
        first = False


@bp.get("/export/<kind>.<fmt>")
@requires("viewer")
def export_list(kind: str, fmt: str) -> Response:
    """Download a list under the page's filters as CSV or JSON (at most EXPORT_ROW_LIMIT rows)."""
    if fmt not in ("csv", "json"):
        abort(404)
    svc = services()
    try:
        with svc.reads.local.connect() as conn:
            fetch = _fetcher(kind, conn, request.args)
            first = fetch(conn, None)
    except (BadFilter, BadCursor):
        abort(400)
    body = (_csv if fmt == "csv" else _json)(_rows(fetch, first))
    response = Response(stream_with_context(body),
                        mimetype="text/csv" if fmt == "csv" else "application/json")
    response.headers["Content-Disposition"] = f'attachment; filename="ledger-{kind}.{fmt}"'
    response.headers["X-Export-Row-Limit"] = str(EXPORT_ROW_LIMIT)
    response.headers["Cache-Control"] = "no-store"
    return response
