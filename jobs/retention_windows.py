"""PostgreSQL: walk a table in heap-page windows for the retention purge.

Each table is walked in page windows: `ctid >= '(lo,0)' AND ctid < '(hi,0)'`
is a TID range scan, so a batch reads its window once and deletes in the same
pass (no LIMIT picker, no ctid array, no rescan of the rows earlier batches
deleted: 2-3x less CPU per row).
A window spans about `batch_size` rows (pg_class's rows per page); rows added
after the purge starts land past the last window or are too new to expire. The
walk covers the pages from the first to the last expired row (_expired_span);
between them a window with nothing expired costs a filter, no delete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, text

_PG_WINDOW_SIZE = text("""
SELECT pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,
       CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages END AS per_page
FROM pg_class c WHERE c.oid = CAST(:table AS regclass)
""")
# Rows per page assumed before the table was ever analyzed (a receipt is ~150 B),
# and the least assumed after: a table emptied by an earlier purge averages few
# rows per page, and a window sized on that average must not swallow its dense
# part (a page holds at most ~90 receipts or attempts) in one transaction.
DEFAULT_ROWS_PER_PAGE = 50
MIN_ROWS_PER_PAGE = 30


def page_windows(engine: Engine, table: str, rows: int, expired: str,
                 params: dict[str, Any]) -> Iterator[tuple[int, int]]:
    """Yield [lo, hi) page ranges of `table`, about `rows` rows each, that may hold expired rows."""
    with engine.connect() as conn:
        size = conn.execute(_PG_WINDOW_SIZE, {"table": table}).one()
        per_page = max(float(size.per_page or DEFAULT_ROWS_PER_PAGE), MIN_ROWS_PER_PAGE)
        width = max(1, int(rows / per_page))
        first, last = _expired_span(conn, table, expired, params, int(size.pages), width)
    for lo in range(first, last, width):
        yield lo, lo + width


def _expired_span(conn: Connection, table: str, expired: str, params: dict[str, Any],
                  pages: int, width: int) -> tuple[int, int]:
    """Return the pages [first, last) holding rows that match `expired`.

    When the first and the last window both hold some (a purge of most of the
    table), that is the whole table, found without reading it. Otherwise (the
    hourly purge of an hour's receipts) min/max(ctid) reads only the expired
    rows, found through the index on the time column (a btree on receipts, a BRIN
    on attempts), instead of a walk over days of rows that stay.
    """
    def any_in(lo: int, hi: int) -> bool:
        return bool(conn.execute(text(
            f"SELECT EXISTS (SELECT 1 FROM {table} WHERE ctid >= CAST(:lo AS tid) "
            f"AND ctid < CAST(:hi AS tid) AND {expired})"), {**params, **tid_bounds(lo, hi)}
        ).scalar_one())

    if pages == 0:
        return 0, 0
    if any_in(0, width) and any_in(max(pages - width, 0), pages):
        return 0, pages
    low, high = conn.execute(text(
        f"SELECT CAST(min(ctid) AS text), CAST(max(ctid) AS text) FROM {table} "
        f"WHERE {expired}"), params).one()
    if low is None:
        return 0, 0
    return _block(low), _block(high) + 1


def _block(tid: str) -> int:
    """Return the page number of a tid literal such as '(123,4)'."""
    return int(tid.strip("()").split(",")[0])


def tid_bounds(lo: int, hi: int) -> dict[str, str]:
    """Return the bounds of a page window as tid literals."""
    return {"lo": f"({lo},0)", "hi": f"({hi},0)"}
