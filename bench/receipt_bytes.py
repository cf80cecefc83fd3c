"""Where a receipt's bytes go on PostgreSQL: each column, the tuple's overhead, each index.

    python -m bench.receipt_bytes [--receipts 100000] [--scopes 1000]

Fills a fresh ledger with bench.datagen's receipts (the `big` measure's mix, fewer of
them), VACUUMs it and prints, per receipt: the heap (each column's average stored width
from `pg_column_size`, the tuple header and line pointer, and what alignment and the
pages' free space leave), and each index. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench import env as benv
from bench import storage
from bench.datagen import DataSpec, generate
from ledger.access.secrets_box import load_box
from ledger.db.schema import receipts
from ledger.services import ledger_engine

LINE_POINTER = 4  # bytes of each tuple's ItemId in its page


def breakdown(e: benv.BenchEnv, count: int, scopes: int) -> dict[str, Any]:
    """Load `count` receipts and return bytes per receipt by column, overhead and index."""
    url = e.migrated_pg("bytes")
    settings = e.settings(url).with_(statement_timeout_ms=600_000)
    engine = ledger_engine(settings)
    try:
        generate(engine, load_box(settings.master_key, settings.var_dir),
                 DataSpec(receipts=count, scopes=scopes, end=datetime.now(UTC)))
        storage.vacuum(engine, "receipts")
        sizes = storage.sizes(engine, "receipts")
        names = [c.name for c in receipts.columns]
        widths = ", ".join(f"avg(coalesce(pg_column_size({n}), 0)) AS {n}" for n in names)
        with engine.connect() as conn:
            row = conn.execute(text(
                f"SELECT {widths}, avg(t_hoff) AS header, count(*) FILTER"
                " (WHERE completed_at IS NULL OR result_ref IS NULL) AS with_nulls"
                " FROM receipts r, LATERAL (SELECT CASE WHEN r.completed_at IS NULL OR"
                " r.result_ref IS NULL THEN 32 ELSE 24 END AS t_hoff) h")).one()._mapping
    finally:
        engine.dispose()
    columns = {n: round(float(row[n]), 1) for n in names}
    header = round(float(row["header"]), 1)
    heap = sizes["heap_per_row"]
    return {"receipts": sizes["rows"], "heap_per_row": heap, "columns": columns,
            "columns_sum": round(sum(columns.values()), 1), "tuple_header": header,
            "line_pointer": LINE_POINTER,
            "alignment_and_free_space": round(
                heap - sum(columns.values()) - header - LINE_POINTER, 1),
            "share_with_nulls": round(int(row["with_nulls"]) / max(sizes["rows"], 1), 3),
            "indexes_per_row": sizes["per_index_per_row"], "total_per_row": sizes["total_per_row"]}


def main(argv: list[str] | None = None) -> None:
    """Print the breakdown as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--scopes", type=int, default=1_000)
    args = parser.parse_args(argv)
    e = benv.BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bytes-")))
    try:
        print(json.dumps(breakdown(e, args.receipts, args.scopes), indent=2))
    finally:
        e.drop_all()
        shutil.rmtree(e.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
