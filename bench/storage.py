"""The 1M-receipt database: bytes per receipt (ledger vs naive schema) and the raw purge.

The ledger's receipts come from bench.datagen (time order, random `evt_` ids,
1,000 scopes, with attempts/jobs/conflicts history). The naive table receives
the same rows in the same order, so both primary keys fill the same way.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, Engine, text

from bench.schemas import NAIVE

SIZES = """
SELECT pg_total_relation_size('{t}') AS total, pg_relation_size('{t}') AS heap,
       pg_indexes_size('{t}') AS indexes,
       coalesce(pg_total_relation_size(reltoastrelid), 0) AS toast,
       (SELECT count(*) FROM {t}) AS n
FROM pg_class WHERE oid = '{t}'::regclass
"""

FILL_NAIVE = """
INSERT INTO naive_receipts
SELECT i.account || '/' || i.name, r.event_id, r.event_type,
       CASE r.state WHEN 0 THEN 'pending' WHEN 1 THEN 'complete' ELSE 'failed' END,
       r.attempts, r.accepted_at, r.completed_at, r.body_sha256, r.result_ref
FROM receipts r JOIN integrations i ON i.id = r.scope_id
ORDER BY r.accepted_at
"""

RAW_PURGE_BATCH = """
DELETE FROM naive_receipts
WHERE ctid = ANY(ARRAY(SELECT ctid FROM naive_receipts WHERE status <> 'pending' LIMIT 10000))
"""


def vacuum(engine: Engine, table: str) -> None:
    """VACUUM ANALYZE one table (outside a transaction)."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            f"VACUUM ANALYZE {table}")


def sizes(engine: Engine, table: str) -> dict[str, Any]:
    """Return heap, index, TOAST and total bytes of `table`, per row."""
    with engine.connect() as conn:
        return sizes_in(conn, table)


def sizes_in(conn: Connection, table: str) -> dict[str, Any]:
    """Return heap, index, TOAST and total bytes of `table`, per row, on `conn`."""
    row = conn.execute(text(SIZES.format(t=table))).one()._mapping
    n = max(int(row["n"]), 1)
    out: dict[str, Any] = {"rows": int(row["n"])}
    for key in ("total", "heap", "indexes", "toast"):
        out[f"{key}_bytes"] = int(row[key])
        out[f"{key}_per_row"] = round(int(row[key]) / n, 1)
    out["per_index_per_row"] = {
        name: round(int(size) / n, 2) for name, size in conn.execute(text(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) "
            "FROM pg_index WHERE indrelid = CAST(:t AS regclass)"), {"t": table})}
    return out


def measure_bytes(engine: Engine) -> dict[str, Any]:
    """Measure receipts and the naive table loaded with the same rows."""
    vacuum(engine, "receipts")
    ours = sizes(engine, "receipts")
    with engine.begin() as conn:
        conn.exec_driver_sql(NAIVE)
        conn.exec_driver_sql(FILL_NAIVE)
    vacuum(engine, "naive_receipts")
    return {"ours": ours, "naive": sizes(engine, "naive_receipts")}


def raw_purge(engine: Engine) -> dict[str, float]:
    """Delete the naive table's finished rows in 10,000-row batches, a commit each."""
    deleted, started = 0, time.perf_counter()
    while True:
        with engine.begin() as conn:
            count = conn.exec_driver_sql(RAW_PURGE_BATCH).rowcount
        deleted += count
        if count < 10_000:
            break
    seconds = time.perf_counter() - started
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE naive_receipts")
    return {"rows": deleted, "seconds": round(seconds, 2), "rows_per_s": deleted / seconds}
