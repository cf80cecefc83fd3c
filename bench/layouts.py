"""What other receipt layouts would weigh: the measurement behind the bytes/receipt verdict.

`python -m bench.layouts [--receipts N] [--scopes S]` loads the representative
receipts of `bench.datagen` into a scratch PostgreSQL database (the ledger's
own table), then copies the same rows, in the same order, into tables laid out
the ways that could save bytes, each with its unique key in place while rows
arrive (so its btree fills the way random ids make it fill), and prints heap +
indexes + TOAST per row for each. Not part of `make bench` (about 3 minutes).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sqlalchemy import text

from bench.datagen import NO_HANDLER, DataSpec, generate
from bench.env import BenchEnv
from bench.storage import sizes, vacuum
from ledger.access.secrets_box import SecretBox
from ledger.services import ledger_engine

HEAD = ("accepted_at timestamptz NOT NULL, completed_at timestamptz, scope_id int NOT NULL,"
        " state smallint NOT NULL, attempts smallint NOT NULL")
# A 64-bit hash of the event id (md5's first 8 bytes here; a keyed hash in real use).
ID_HASH = "('x' || substr(md5(event_id), 1, 16))::bit(64)::bigint"
TYPE_ID = "(SELECT id FROM layout_types t WHERE t.name = event_type)"
# 'ignored:no-handler' as its own state code, result_ref NULL.
STATE_IGNORED = f"CASE WHEN result_ref = '{NO_HANDLER}' THEN 3 ELSE state END"
RESULT_IGNORED = f"NULLIF(result_ref, '{NO_HANDLER}')"

LAYOUTS: dict[str, tuple[str, str, str]] = {
    "event type as a smallint code (dictionary table)": (
        f"{HEAD}, type_id smallint NOT NULL, event_id text NOT NULL, body_sha256 bytea NOT NULL,"
        " result_ref text, PRIMARY KEY (scope_id, event_id)",
        f"accepted_at, completed_at, scope_id, state, attempts, {TYPE_ID}, event_id,"
        " body_sha256, result_ref", "dict"),
    "+ 'ignored:no-handler' folded into the state code": (
        f"{HEAD}, type_id smallint NOT NULL, event_id text NOT NULL, body_sha256 bytea NOT NULL,"
        " result_ref text, PRIMARY KEY (scope_id, event_id)",
        f"accepted_at, completed_at, scope_id, {STATE_IGNORED}, attempts, {TYPE_ID}, event_id,"
        f" body_sha256, {RESULT_IGNORED}", "dict_ignored"),
    "unique key on a 64-bit hash of the event id instead of the id": (
        f"{HEAD}, id_hash bigint NOT NULL, event_id text NOT NULL, event_type text NOT NULL,"
        " body_sha256 bytea NOT NULL, result_ref text, PRIMARY KEY (scope_id, id_hash)",
        f"accepted_at, completed_at, scope_id, state, attempts, {ID_HASH}, event_id, event_type,"
        " body_sha256, result_ref", "hashkey"),
    "hashed key + smallint type + folded 'ignored'": (
        f"{HEAD}, type_id smallint NOT NULL, id_hash bigint NOT NULL, event_id text NOT NULL,"
        " body_sha256 bytea NOT NULL, result_ref text, PRIMARY KEY (scope_id, id_hash)",
        f"accepted_at, completed_at, scope_id, {STATE_IGNORED}, attempts, {TYPE_ID},"
        f" {ID_HASH}, event_id, body_sha256, {RESULT_IGNORED}", "hashkey_all"),
}


def measure(receipts: int, scopes: int) -> dict[str, dict[str, float]]:
    """Load the receipts, copy them into each layout; return bytes per row by layout."""
    env = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-layouts-")))
    try:
        url = env.migrated_pg("layouts")
        # No statement timeout: the copies below are single long statements.
        engine = ledger_engine(env.settings(url), connect_args={})
        generate(engine, SecretBox([env.master_key]),
                 DataSpec(receipts=receipts, scopes=scopes, history=False))
        vacuum(engine, "receipts")
        out = {"ledger (as shipped)": sizes(engine, "receipts")}
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE layout_types (id smallserial PRIMARY KEY,"
                              " name text UNIQUE NOT NULL)"))
            conn.execute(text("INSERT INTO layout_types (name)"
                              " SELECT DISTINCT event_type FROM receipts"))
        for label, (columns, select, table) in LAYOUTS.items():
            with engine.begin() as conn:
                conn.execute(text(f"CREATE TABLE layout_{table} ({columns})"))
                conn.execute(text(f"INSERT INTO layout_{table}"
                                  f" SELECT {select} FROM receipts ORDER BY accepted_at"))
            vacuum(engine, f"layout_{table}")
            out[label] = sizes(engine, f"layout_{table}")
        engine.dispose()
        return out
    finally:
        env.drop_all()


def main() -> None:
    """Print bytes per receipt for each layout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--scopes", type=int, default=1_000)
    args = parser.parse_args()
    results = measure(args.receipts, args.scopes)
    print("| layout | heap B | indexes B | total B per receipt |")
    print("|---|---|---|---|")
    for label, row in results.items():
        print(f"| {label} | {row['heap_per_row']} | {row['indexes_per_row']}"
              f" | {row['total_per_row']} |")
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
