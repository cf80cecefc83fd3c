"""The retention purge on a distributed (Citus) ledger against the same purge on one PostgreSQL.

    python -m bench.citus_purge --url postgresql+psycopg://…/ledger \\
        --plain-url postgresql+psycopg://…/ledger_plain --receipts 200000 --scopes 1000

`--url` names the coordinator of a ledger database already migrated and distributed
(`ledger db upgrade`, `ledger db distribute`); `--plain-url` a migrated ledger database on
an ordinary PostgreSQL (the baseline, measured in the same run). Both must be empty. Each
gets the same ledger from bench/fastload.py (`--receipts` over `--scopes` scopes, the last
seven days, mostly complete), then the purge runs once at full speed with a one-minute
retention, so every finished receipt expires (bench.big.purge_unloaded, as the scale bench
measures it). Reported: receipts expired, seconds, microseconds per receipt, and the ratio
of the distributed purge's µs per receipt to the plain one's. Not a test: the README quotes
its output.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import big, fastload
from bench.env import BenchEnv
from ledger.access.secrets_box import load_box
from ledger.db import citus
from ledger.services import ledger_engine


def _load_and_purge(e: BenchEnv, url: str, receipts: int, scopes: int) -> dict[str, Any]:
    """Fill the ledger at `url`, then purge it; return the load time and the purge figures."""
    settings = e.settings(url)
    engine = ledger_engine(settings)
    try:
        distributed = citus.distributed(engine)
        started = time.perf_counter()
        fastload.load(engine, load_box(settings.master_key, settings.var_dir), receipts, scopes)
        load_seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    result = big.purge_unloaded(e, url)
    result.update(distributed=distributed, load_seconds=round(load_seconds, 1),
                  us_per_receipt=round(result["purge_seconds"]
                                       / max(result["expired_receipts"], 1) * 1e6, 2))
    result.pop("purge_rows_per_s", None)
    return result


def run(url: str, plain_url: str, receipts: int, scopes: int) -> dict[str, Any]:
    """Measure the purge on both ledgers; return the figures and their ratio."""
    e = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-citus-purge-")))
    out: dict[str, Any] = {"receipts": receipts, "scopes": scopes}
    out["plain"] = _load_and_purge(e, plain_url, receipts, scopes)
    out["citus"] = _load_and_purge(e, url, receipts, scopes)
    if not out["citus"]["distributed"]:
        raise SystemExit("--url is not distributed: run `ledger db distribute` on it")
    out["citus_vs_plain_us_per_receipt"] = round(
        out["citus"]["us_per_receipt"] / max(out["plain"]["us_per_receipt"], 1e-9), 2)
    return out


def main() -> None:
    """Parse the arguments, measure, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--plain-url", required=True)
    parser.add_argument("--receipts", type=int, default=200_000)
    parser.add_argument("--scopes", type=int, default=1_000)
    args = parser.parse_args()
    print(json.dumps(run(args.url, args.plain_url, args.receipts, args.scopes), indent=2))


if __name__ == "__main__":
    main()
