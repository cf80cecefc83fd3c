"""`make bench` prints every row of issue 15's targets: the 10M rows a default run does
not measure are printed as not run, with the figures `--scale 10m` last recorded."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import delivery_log as dlog
from bench import intake, report, run


def _scale(receipts: int, prefix_p95: float) -> dict[str, Any]:
    """A scale measure's result as bench.scale returns it (figures only)."""
    return {"receipts": receipts, "scopes": 10_000, "scopes_seconds": 2.1,
            "ledgers": {100_000: {"load_seconds": 9, "vacuum_seconds": 2, "disk_mb": 70},
                        receipts: {"load_seconds": 90, "vacuum_seconds": 5, "disk_mb": 499}},
            "intake": {"large_accepted_per_s": 600.0, "small_accepted_per_s": 640.0},
            "rollups": {"scheduled": {"run_seconds": 1.5, "series_recent_seconds": 0.5,
                                      "scope_counts": {"seconds": 1.0, "receipts_read": 5,
                                                       "full": False}},
                        "full_recount": {"seconds": 1.4, "receipts_read": 10},
                        "series_full_seconds": 8.0},
            "dashboard": {"overview": {"median_ms": 20.0, "p95_ms": 40.0},
                          "receipts_prefix": {"median_ms": 90.0, "p95_ms": prefix_p95}},
            "purge": {1_000_000: {"us_per_receipt": 5.0, "expired_receipts": 9,
                                  "purge_seconds": 4.9},
                      receipts: {"us_per_receipt": 5.5, "expired_receipts": 99,
                                 "purge_seconds": 54.0}}}


def test_a_default_run_prints_the_10m_rows_as_not_run_with_the_last_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "RECORDED_10M", tmp_path / "scale_10m.json")
    never = [f for f in run.scale_figures(_scale(1_000_000, 50.0)) if f.not_run]
    assert len(never) == 4 and all("never recorded" in f.note for f in never)

    run.scale_figures(_scale(10_000_000, 420.0))  # a --scale 10m run records its rows
    rows = run.scale_figures(_scale(1_000_000, 50.0))
    measured = [f.measure for f in rows if not f.not_run]
    assert "intake accepted/s at 1,000,000 receipts / 10,000 scopes" in measured
    recorded = {f.measure: f for f in rows if f.not_run}
    assert set(recorded) == {
        "intake accepted/s at 10M receipts / 10,000 scopes (>= 0.9x the 100k ledger)",
        "rollups scheduled run at 10M (<= 2 s, incremental)",
        "every dashboard page at 10M (p95 <= 300 ms)",
        "purge us per receipt, 1M -> 10M (flat within 20 %)"}
    pages = recorded["every dashboard page at 10M (p95 <= 300 ms)"]
    assert pages.value == 420.0 and "missed: receipts_prefix" in pages.note
    assert recorded["purge us per receipt, 1M -> 10M (flat within 20 %)"].ratio == 1.1
    assert all(f.note.startswith("not run in the default bench; see --scale 10m, last recorded")
               for f in recorded.values())
    table = report.table(rows)
    assert table.count("| not run |") == 4


def test_the_ceilings_are_shown_and_a_missing_one_is_not_measured() -> None:
    r = {"ours_accepted_per_s": 1000.0, "thin_accepted_per_s": 1100.0, "ours_p99_ms": 90.0,
         "thin_p99_ms": 80.0, "thin_wraps": 0, "ours_wraps": 0,
         "duplicates": {"dup_per_s": 1300.0, "new_accepted_per_s": 1200.0,
                        "dup_new_receipts": 0},
         "ceilings": {"postgres": {"tps": 7000.0, "clients": 16},
                      "hmac_only": {"answered_per_s": 4000.0, "p99_ms": 20.0}}}
    figures = run.intake_figures(r)
    shares = {f.measure.split(" vs ")[1]: f.ratio for f in figures if "rest goes" in f.measure}
    assert shares == {"PostgreSQL's two-insert ceiling": 0.143,
                      "the server's HMAC-only ceiling": 0.25}
    intake = figures[0]
    assert not intake.met  # 0.91x against the 2.0x target
    why = run.explain(intake, figures)
    assert "2,200/s" in why and "4,000/s" in why and "7,000" in why
    broken = run.intake_figures(r | {"ceilings": {"error": "RuntimeError: no pgbench"}})
    assert broken[-1].note.startswith("NOT MEASURED")


def test_a_missed_delivery_log_row_prints_the_logs_cpu_and_each_cycle() -> None:
    flood = {"rows_added": 110, "bound_rows": 2400, "forged_requests": 6000,
             "forged_per_s": 5000.0, "refusals_counted": 6000}
    r = {"on_accepted_per_s": 930.0, "off_accepted_per_s": 1000.0, "flood": flood,
         "on_cpu": {"web_ms": 0.84, "rest_ms": 0.36}, "off_cpu": {"web_ms": 0.82, "rest_ms": 0.35},
         "cycle_ratios": [0.9, 0.961]}
    row = run.dlog_figures(r)[0]
    assert not row.met
    why = run.explain(row)
    assert "log on 0.840 ms" in why and "off 0.820 + 0.350 ms" in why
    assert "+2.6% of a delivery's CPU" in why and "0.900x, 0.961x" in why
    assert "run-to-run spread" in why
    # A run without CPU figures (an older latest.json) still prints its row.
    assert run.dlog_figures({k: v for k, v in r.items() if "cpu" not in k})[0].profile == ""


def test_the_sqlite_row_prints_what_the_one_writer_did_during_our_runs() -> None:
    def ran(seconds: float, held: float, turns: float, claims: float, commits: float) -> Any:
        return SimpleNamespace(wrk=SimpleNamespace(seconds=seconds), writer={
            "ledger_sqlite_writer_held_seconds_sum": held,
            "ledger_sqlite_writer_held_seconds_count": turns,
            "ledger_sqlite_writer_wait_seconds_sum": turns * 0.006,
            "ledger_sqlite_writer_wait_seconds_count": turns,
            "ledger_sqlite_claims_per_commit_sum": claims,
            "ledger_sqlite_claims_per_commit_count": commits})
    writer = intake.writer_summary([ran(6.0, 4.5, 1800, 5800, 1700),
                                    ran(6.0, 4.5, 1800, 6200, 1700), SimpleNamespace(writer=None)])
    assert writer is not None
    assert writer["busy_share"] == 0.75  # 9 s of turns in 12 s of load
    assert writer["turns_per_s"] == 300 and writer["hold_ms"] == 2.5
    assert round(writer["wait_ms"], 3) == 6.0 and round(writer["claims_per_commit"], 3) == 3.529
    r = {"ours_accepted_per_s": 1150.0, "thin_accepted_per_s": 950.0, "ours_writer": writer,
         "commit_alone_ms": 0.31}
    row = run.sqlite_figures(r)[0]
    assert not row.met
    why = run.explain(row)
    assert "busy 75% of the load time" in why and "held 2.50 ms" in why
    assert "3.5 claims per intake commit" in why and "a commit alone takes 0.31 ms" in why
    # The thin intake has no writer metrics: no run measured, no writer text.
    assert intake.writer_summary([SimpleNamespace(writer=None)]) is None
    assert run.writer_profile({}) == ""


def test_cycle_ratios_pair_each_cycles_two_runs_a_side() -> None:
    def runs(*rates: int) -> list[Any]:
        return [SimpleNamespace(accepted=rate * 6, wrk=SimpleNamespace(seconds=6.0))
                for rate in rates]
    assert dlog.cycle_ratios(runs(90, 100, 95, 95), runs(100, 100, 100, 100)) == [0.95, 0.95]
    assert dlog.cycle_ratios(runs(100, 100), runs(50, 150)) == [1.0]


@pytest.mark.parametrize(("samples", "q", "expected"), [
    ([5.0, 1.0], 95, 5.0),            # two rounds: p95 is the slower one, not the minimum
    ([3.0], 95, 3.0),
    ([float(n) for n in range(1, 101)], 95, 95.0),
    ([float(n) for n in range(1, 101)], 99, 99.0),
    ([float(n) for n in range(1, 21)], 50, 10.0),
    ([], 95, 0.0),
])
def test_the_bench_percentile_is_the_nearest_rank(samples: list[float], q: float,
                                                  expected: float) -> None:
    assert report.percentile(samples, q) == expected


def test_the_floors_rows_show_each_server_against_the_thin_intake() -> None:
    from bench.servers import floor_sides

    r = floor_sides({"runs": {"thin": [], "ours": [], "floor": []},
                     "thin_accepted_per_s": 1000.0, "thin_p99_ms": 60.0,
                     "ours_accepted_per_s": 1800.0, "ours_p99_ms": 36.0,
                     "floor_accepted_per_s": 3100.0, "floor_p99_ms": 18.0})
    assert set(r["runs"]) == {"thin", "gunicorn_floor", "granian_floor"}
    gunicorn, granian = run.floors_figures(r)
    assert gunicorn.measure.startswith("the floor intake under gunicorn")
    assert gunicorn.ratio == 1.8 and gunicorn.met
    assert "falls short of the intake's 2.0x; p99 36.0 ms = 0.60x" in gunicorn.note
    assert granian.ratio == 3.1 and "reaches the intake's 2.0x; p99 18.0 ms = 0.30x" in granian.note
