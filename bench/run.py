"""`make bench`: every performance claim of the docs against a baseline measured in the same run.

    python -m bench.run [--seconds 12] [--only intake,sqlite,...]
    python -m bench.run --only scale --scale 10m     # purge and pages at 10M receipts
    python -m bench.run --only sweep                 # the web defaults against other shapes
    python -m bench.run --only async                 # the experimental async intake
    python -m bench.run --only granian               # the ledger's app served by granian
    python -m bench.run --only intake --against REF  # this tree's intake against REF's

Prints a Markdown table (each row met or missed, with what this run measured) and writes
one record per measure to bench/results/<measure>.json. Bench databases (`ledger_bench_*`)
and temp files are removed afterwards, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import (
    against,
    big,
    cli_start,
    destination_bench,
    granian_intake,
    intake,
    report,
    scale,
    worker_bench,
)
from bench import env as benv
from bench.loadgen import wrk_binary
from bench.report import Figure, at_least, at_most, failed, shown

MEASURES = ("intake", "sqlite", "worker", "destinations", "big", "scale", "cli", "memory",
            "sweep", "features", "async", "granian")
DEFAULT_MEASURES = ("intake", "sqlite", "worker", "destinations", "big", "scale", "cli",
                    "memory")
# A web process may grow this much between two recycles (gunicorn.conf.py's max_requests).
MEMORY_GROWTH_MAX = 1.2
TEN_M = 10_000_000


def _cpu(r: dict[str, Any], side: str, figure: str = "web_ms") -> float:
    return float((r.get(f"{side}_cpu") or {}).get(figure, 0.0))


def _p(r: dict[str, Any], side: str, key: str) -> str:
    return ", ".join(f"{run[key]:.0f}" for run in r["runs"][side])


def intake_figures(r: dict[str, Any]) -> list[Figure]:
    """The shipped shape against the thin intake as written, its shaped twin and the floor."""
    n, dup = r["workers"], r["duplicates"]
    thin = f"thin intake, gunicorn -w {n} (sync)"
    idle = (r.get("ours_cpu") or {}).get("idle_share", 0.0)
    floor_share = r["floor_accepted_per_s"] / r["thin_accepted_per_s"]
    why_rate = (f"the floor (HMAC + one claim, nothing else) reached {floor_share:.2f}x the"
                f" thin intake and ours {r['ours_accepted_per_s'] / r['floor_accepted_per_s']:.0%}"
                f" of the floor; web CPU per delivery ours {_cpu(r, 'ours'):.2f} ms, thin"
                f" {_cpu(r, 'thin'):.2f} ms; cores {idle:.0%} idle under ours")
    why_p99 = (f"p99 per run (ms) ours {_p(r, 'ours', 'p99_ms')}, thin"
               f" {_p(r, 'thin', 'p99_ms')}; p50 ours {_p(r, 'ours', 'p50_ms')}, thin"
               f" {_p(r, 'thin', 'p50_ms')}; in the ledger's threaded shape the floor's p99 was"
               f" {r['floor_p99_ms'] / r['thin_p99_ms']:.2f}x the thin intake's and the thin"
               f" intake's own {r['thin_shaped_p99_ms'] / r['thin_p99_ms']:.2f}x"
               + (f"; the floor served sync as the thin intake is, {r['floor_sync_p99_ms']:.0f} ms"
                  f" ({r['floor_sync_p99_ms'] / r['thin_p99_ms']:.2f}x)"
                  if "floor_sync_p99_ms" in r else ""))
    return [
        at_least("accepted/s, shipped vs thin as written", r["ours_accepted_per_s"], "/s",
                 thin, r["thin_accepted_per_s"], 1.3, why_rate),
        at_most("p99, shipped vs thin as written", r["ours_p99_ms"], "ms", thin,
                r["thin_p99_ms"], 0.7, why_p99),
        at_least("duplicates/s vs accepted/s, shipped", dup["dup_per_s"], "/s",
                 "new events, interleaved", dup["new_accepted_per_s"], 1.0,
                 f"{dup['dup_new_receipts']} receipts created by the duplicate runs"),
        at_most("web CPU per delivery, shipped vs the floor", _cpu(r, "ours"), "ms",
                "bench/floor_intake.py, same run", _cpu(r, "floor"), 1.35,
                f"the rest of a delivery (PostgreSQL, wrk, the machine): ours"
                f" {_cpu(r, 'ours', 'rest_ms'):.2f} ms; of the web CPU, in"
                f" the kernel: ours {_cpu(r, 'ours', 'web_system_ms'):.2f} ms, the floor"
                f" {_cpu(r, 'floor', 'web_system_ms'):.2f} ms"),
        shown("accepted/s, shipped vs thin in the ledger's shape", r["ours_accepted_per_s"],
              "/s", f"thin intake, {n} x {r['threads']} gthread", r["thin_shaped_accepted_per_s"],
              f"p99 {r['ours_p99_ms']:.0f} vs {r['thin_shaped_p99_ms']:.0f} ms"),
        *([shown("p99, the floor served sync vs thin as written", r["floor_sync_p99_ms"], "ms",
                 thin, r["thin_p99_ms"],
                 f"the floor (HMAC + one claim) under gunicorn -w {n}, sync: accepted/s"
                 f" {r['floor_sync_accepted_per_s'] / r['thin_accepted_per_s']:.2f}x the thin"
                 f" intake's")] if "floor_sync_p99_ms" in r else []),
    ]


def async_figures(r: dict[str, Any]) -> list[Figure]:
    """The experimental async intake against the thin intake as written, the floor and the
    ledger as shipped, all in one run (bench/asgi_intake.py)."""
    a, ours, thin, floor = r["async"], r["ours"], r["thin"], r["floor"]
    n, rounds = r["workers"], r["rounds"]
    written = f"thin intake, gunicorn -w {n} (sync)"

    def runs(side: dict[str, Any], key: str) -> str:
        return ", ".join(f"{v:.0f}" for v in side[f"{key}_runs"])

    def web(side: dict[str, Any]) -> float:
        return float((side.get("cpu") or {}).get("web_ms", 0.0))

    spread = (f"{rounds} rounds; accepted/s per run async {runs(a, 'accepted_per_s')}, shipped"
              f" {runs(ours, 'accepted_per_s')}, thin {runs(thin, 'accepted_per_s')}, floor"
              f" {runs(floor, 'accepted_per_s')}")
    p99s = (f"p99 per run (ms) async {runs(a, 'p99_ms')}, shipped {runs(ours, 'p99_ms')},"
            f" thin {runs(thin, 'p99_ms')}, floor {runs(floor, 'p99_ms')}")
    dup_a, dup_ours = r["duplicates"]["async"], r["duplicates"]["ours"]
    return [
        at_least("accepted/s, async intake vs thin as written", a["accepted_per_s"], "/s",
                 written, thin["accepted_per_s"], 1.3, spread),
        at_most("p99, async intake vs thin as written", a["p99_ms"], "ms", written,
                thin["p99_ms"], 0.7, p99s),
        at_least("duplicates/s vs accepted/s, async intake", dup_a["dup_per_s"], "/s",
                 "new events, interleaved", dup_a["new_accepted_per_s"], 1.0,
                 f"{dup_a['dup_new_receipts']} receipts created by the duplicate runs"),
        at_most("web CPU per delivery, async intake vs the floor", web(a), "ms",
                "bench/floor_intake.py, same run", web(floor), 1.35,
                f"shipped {web(ours):.2f} ms, thin {web(thin):.2f} ms in the same run"),
        shown("accepted/s, async intake vs shipped", a["accepted_per_s"], "/s",
              "shipped (gunicorn), same run", ours["accepted_per_s"],
              f"errors async {a['errors']}, shipped {ours['errors']}"),
        shown("p99, async intake vs shipped", a["p99_ms"], "ms", "shipped (gunicorn), same run",
              ours["p99_ms"]),
        shown("web CPU per delivery, async intake vs shipped", web(a), "ms",
              "shipped (gunicorn), same run", web(ours)),
        shown("accepted/s, shipped vs thin as written (async run)", ours["accepted_per_s"],
              "/s", written, thin["accepted_per_s"],
              f"p99 {ours['p99_ms']:.0f} vs {thin['p99_ms']:.0f} ms; web CPU vs the floor"
              f" {web(ours) / web(floor) if web(floor) else 0:.2f}x"),
        shown("duplicates/s vs accepted/s, shipped (async run)", dup_ours["dup_per_s"], "/s",
              "new events, interleaved", dup_ours["new_accepted_per_s"],
              f"{dup_ours['dup_new_receipts']} receipts created by the duplicate runs"),
    ]


def granian_figures(r: dict[str, Any]) -> list[Figure]:
    """The ledger's app under granian (WSGI, and RSGI with bodies read on the loop) against
    the thin intake as written and the floor, all in one run; then the slow-body probe of
    each against the ledger as shipped."""
    thin, floor = r["thin"], r["floor"]
    n, threads = r["workers"], r["threads"]
    written = f"thin intake, gunicorn -w {n} (sync)"

    def web(side: dict[str, Any]) -> float:
        return float((side.get("cpu") or {}).get("web_ms", 0.0))

    def runs(side: dict[str, Any], key: str) -> str:
        return ", ".join(f"{v:.0f}" for v in side[f"{key}_runs"])

    figures: list[Figure] = []
    for name, label in (("granian", f"granian WSGI {n} x {threads}"),
                        ("rsgi", f"granian RSGI {n} x 1, bodies on the loop")):
        g = r[name]
        figures += [
            at_least(f"accepted/s, {label} vs thin as written", g["accepted_per_s"], "/s",
                     written, thin["accepted_per_s"], 1.3,
                     f"per run {runs(g, 'accepted_per_s')}; thin"
                     f" {runs(thin, 'accepted_per_s')}; errors {g['errors']}"),
            at_most(f"p99, {label} vs thin as written", g["p99_ms"], "ms", written,
                    thin["p99_ms"], 0.7, f"per run (ms) {runs(g, 'p99_ms')}; thin"
                    f" {runs(thin, 'p99_ms')}"),
            at_most(f"web CPU per delivery, {label} vs the floor", web(g), "ms",
                    "bench/floor_intake.py, same run", web(floor), 1.35,
                    f"thin {web(thin):.2f} ms in the same run"),
        ]
    probe = r["probe"]
    ok = probe["ours"]

    def healthz(found: dict[str, Any]) -> str:
        seconds = found["healthz_seconds"]
        return (f"{seconds} s" if seconds is not None
                else f"not within {found['healthz_wait_seconds']:.0f} s")

    for name, label, shape in (
            ("granian", "granian WSGI", f"{granian_intake.PROBE_THREADS} threads"),
            ("rsgi", "granian RSGI", "its event loop")):
        slow = probe[name]
        figures.append(at_least(
            f"slow bodies ended by the body deadline, {label} vs shipped", slow["ended"],
            "sockets", "shipped, same probe", ok["ended"], 1.0,
            f"{slow['slow_sockets']} bodies sent a byte a second to 1 process ({shape}),"
            f" deadline {slow['deadline_seconds']} s (+{slow['margin_seconds']} s);"
            f" /healthz beside them: {label} {healthz(slow)}, shipped {healthz(ok)}"))
    return figures


def against_figures(r: dict[str, Any]) -> list[Figure]:
    """This tree's intake against another tree's, same run: met within the pairs' noise."""
    ref = r["ref"] if r["sha"].startswith(r["ref"]) else f"{r['ref']} ({r['sha'][:7]})"
    other = f"the tree at {ref}, same run"
    pairs = r["pair_ratios"]
    rate = at_least("accepted/s vs another tree", r["current_accepted_per_s"], "/s", other,
                    r["against_accepted_per_s"], 1.0,
                    f"per pair of runs {', '.join(f'{x:.2f}' for x in pairs['accepted'])};"
                    f" noise (2 standard errors) {r['accepted_noise']:.2f}; errors"
                    f" {r['current_errors']} vs {r['against_errors']}")
    p99 = at_most("p99 vs another tree", r["current_p99_ms"], "ms", other,
                  r["against_p99_ms"], 1.0,
                  f"per pair of runs {', '.join(f'{x:.2f}' for x in pairs['p99'])};"
                  f" noise (2 standard errors) {r['p99_noise']:.2f}")
    cpu_note = (f"cores {(r.get('current_cpu') or {}).get('idle_share', 0):.0%} idle under this"
                f" tree, {(r.get('against_cpu') or {}).get('idle_share', 0):.0%} under the other")
    return [replace(rate, target=">= 1.0x within noise",
                    met=rate.ratio + r["accepted_noise"] >= 1.0),
            replace(p99, target="<= 1.0x within noise", met=p99.ratio - r["p99_noise"] <= 1.0),
            shown("web CPU per delivery vs another tree", _cpu(r, "current"), "ms", other,
                  _cpu(r, "against"), cpu_note)]


def sqlite_figures(r: dict[str, Any]) -> list[Figure]:
    """The embedded default against the thin intake as written, on SQLite."""
    writer = r.get("ours_writer") or {}
    return [at_least("accepted/s on SQLite, shipped vs thin as written",
                     r["ours_accepted_per_s"], "/s", "thin intake on SQLite",
                     r["thin_accepted_per_s"], 1.5,
                     f"the one writer busy {writer.get('busy_share', 0):.0%} of the load time,"
                     f" {writer.get('claims_per_commit', 0):.1f} claims per commit, each turn"
                     f" held {writer.get('hold_ms', 0):.2f} ms"),
            shown(f"accepted/s on SQLite, {r['fewer_threads']} threads per process (PostgreSQL's"
                  f" default) vs {r['threads']} (SQLite's)", r["fewer_threads_accepted_per_s"],
                  "/s", f"{r['threads']} threads, same run", r["ours_accepted_per_s"],
                  f"p99 {r['fewer_threads_p99_ms']:.0f} vs {r['ours_p99_ms']:.0f} ms")]


def worker_figures(r: dict[str, Any]) -> list[Figure]:
    """Worker completions against the raw claim loop."""
    return [at_least(f"worker completions/s ({r['processes']} workers, batch {r['batch']})",
                     r["ours_per_s"], "/s", "raw claim loop", r["raw_per_s"], 1.0,
                     f"CPU per job, client + PostgreSQL: ours {r['ours_cpu_ms_per_job']:.2f} +"
                     f" {r['ours_db_cpu_ms_per_job']:.2f} ms, raw"
                     f" {r['raw_cpu_ms_per_job']:.2f} + {r['raw_db_cpu_ms_per_job']:.2f} ms")]


def destination_figures(r: dict[str, Any]) -> list[Figure]:
    """Forwarded events/s against the worker's own completions/s with a Python handler."""
    return [at_least(f"forwarded events/s to a no-op destination ({r['processes']} workers)",
                     r["forward_per_s"], "/s", "Python handler completions, same run",
                     r["handler_per_s"], r["target"],
                     f"CPU per job, workers + PostgreSQL: forward {r['forward_cpu_ms_per_job']:.2f}"
                     f" + {r['forward_db_cpu_ms_per_job']:.2f} ms, handler"
                     f" {r['handler_cpu_ms_per_job']:.2f} + {r['handler_db_cpu_ms_per_job']:.2f}"
                     " ms")] + ([at_least(
        f"forwarded events/s beside {r['other_destinations']:,} other scopes' destinations",
        r["crowded_per_s"], "/s", "forwarded events/s without them, same run",
        r["forward_per_s"], r["crowded_target"],
        f"CPU per job, workers + PostgreSQL: {r['crowded_cpu_ms_per_job']:.2f}"
        f" + {r['crowded_db_cpu_ms_per_job']:.2f} ms")] if "crowded_per_s" in r else [])


def big_figures(r: dict[str, Any]) -> list[Figure]:
    """Bytes per receipt, the purge (alone and under intake), dashboard pages at 1M."""
    ours, naive = r["bytes"]["ours"], r["bytes"]["naive"]
    u, p = r["purge_unloaded"], r["purge"]
    figures = [
        report.absolute(f"bytes per receipt ({r['receipts']:,} receipts)",
                        ours["total_per_row"], "B", 230, f"heap {ours['heap_per_row']} +"
                        f" TOAST {ours['toast_per_row']} + indexes: " + ", ".join(
                            f"{name} {size}" for name, size in
                            ours.get("per_index_per_row", {}).items())
                        + f"; naive schema {naive['total_per_row']}"),
        shown("retention purge rows/s (unloaded, full speed)", u["purge_rows_per_s"], "/s",
              "raw batched DELETE, naive table", r["raw_purge"]["rows_per_s"],
              f"WAL {u['wal_bytes_per_receipt']} B per receipt"),
        at_least("intake accepted/s during the purge", p["intake_during_per_s"], "/s",
                 "intake around the purge", p["intake_around_per_s"], 0.8,
                 f"purge {p['purge_rows_per_s']:,.0f} rows/s at duty cycle {p['duty_cycle']}"),
    ]
    return figures + page_figures(r["dashboard"], r["receipts"])


def page_figures(timings: dict[str, Any], receipts: int) -> list[Figure]:
    """One row per page (p95 against 300 ms), the CLI's uncapped preview, untimed pages."""
    figures = [report.absolute(f"dashboard {page} p95 at {receipts:,}", t["p95_ms"], "ms", 300,
                               f"median {t['median_ms']} ms")
               for page, t in timings.items() if isinstance(t, dict) and "p95_ms" in t]
    figures += [failed(f"dashboard {page} at {receipts:,}", t["error"])
                for page, t in timings.items() if isinstance(t, dict) and "error" in t]
    if "cli_purge_preview" in timings:
        t = timings["cli_purge_preview"]
        figures.append(shown(f"ledger purge --preview at {receipts:,} (uncapped count)",
                             t["median_ms"], "ms", "the slowest of 3", t["max_ms"], ""))
    if "audit_verify_walk" in timings:
        t = timings["audit_verify_walk"]
        figures.append(shown(f"audit chain verified whole, chunk by chunk, at {receipts:,}",
                             t["seconds"], "s", "requests", t["requests"],
                             f"{t['rows']:,} audit rows; ok {t['ok']}"))
    if timings.get("pages_not_timed"):
        figures.append(failed("dashboard pages", "not timed (no sample): "
                              + ", ".join(timings["pages_not_timed"])))
    return figures


def scale_figures(r: dict[str, Any]) -> list[Figure]:
    """The purge's cost per receipt and the pages on the biggest ledger."""
    figures = [failed("scale dashboard", r["dashboard"]["error"])] if "error" in r[
        "dashboard"] else []
    if "error" not in r["dashboard"]:
        figures += page_figures(r["dashboard"], r["receipts"])
    # keys are sizes: ints as measured, strings when read back from a record
    purged = sorted((int(k), v) for k, v in r["purge"].items() if "error" not in v)
    if len(purged) >= 2:
        (small, low), (large, high) = purged[0], purged[-1]
        figures.append(at_most(
            f"purge us per receipt, {small:,} -> {large:,}", high["us_per_receipt"],
            "us", f"at {small:,}", low["us_per_receipt"], 1.2,
            f"{high['expired_receipts']:,} receipts in {high['purge_seconds']} s vs"
            f" {low['expired_receipts']:,} in {low['purge_seconds']} s"))
    return figures


def cli_figures(r: dict[str, Any]) -> list[Figure]:
    """The ledger command's start time, and that it warns of nothing."""
    return [replace(report.absolute(f"{name} start time", t["median_s"], "s", 1.0,
                                    f"runs {t['runs_s']}; warnings: {t['warnings'] or 'none'}"),
                    met=t["median_s"] <= 1.0 and not t["warnings"])
            for name, t in r.items()]


def memory_figures(r: dict[str, Any]) -> list[Figure]:
    """The web processes' RSS after a recycle's worth of requests each, against before."""
    pairs = list(zip(r["rss_after_mb"], r["rss_before_mb"], strict=True))
    after, before = max(pairs, key=lambda pair: pair[0] / pair[1])
    return [at_most(f"web process RSS after ~{r['requests'] // r['processes']:,} requests each",
                    after, "MB", "the same process before", before, MEMORY_GROWTH_MAX,
                    f"{r['processes']} processes, MB before {r['rss_before_mb']}, "
                    f"after {r['rss_after_mb']}; recycling off while measured")]


def sweep_figures(r: dict[str, Any]) -> list[Figure]:
    """Each other web shape against the shipped defaults, in the same run."""
    return [shown(f"web shape {name} vs the defaults", pair["other"]["accepted_per_s"], "/s",
                  "defaults", pair["ours"]["accepted_per_s"],
                  f"p99 {pair['other']['p99_ms']:.0f} vs {pair['ours']['p99_ms']:.0f} ms")
            for name, pair in r.items()]


def features_figures(r: dict[str, Any]) -> list[Figure]:
    """The ledger without a feature against the defaults: what the feature costs."""
    return [shown(f"accepted/s with {name}, vs the defaults", pair["other"]["accepted_per_s"],
                  "/s", "defaults", pair["ours"]["accepted_per_s"],
                  f"p99 {pair['other']['p99_ms']:.0f} vs {pair['ours']['p99_ms']:.0f} ms")
            for name, pair in r.items()]


def plan(e: benv.BenchEnv, args: argparse.Namespace
         ) -> dict[str, tuple[Callable[[], dict[str, Any]], Callable[[dict], list[Figure]]]]:
    """Return each measure: how to run it and how to read its figures."""
    return {
        "intake": ((lambda: against.measure(e, args.against, args.seconds,
                                            args.against_rounds), against_figures)
                   if args.against else
                   (lambda: intake.measure_pg(e, args.seconds), intake_figures)),
        "sqlite": (lambda: intake.measure_sqlite(e, args.seconds), sqlite_figures),
        "worker": (lambda: worker_bench.measure(e, args.seconds), worker_figures),
        "destinations": (lambda: destination_bench.measure(e, args.seconds),
                         destination_figures),
        "big": (lambda: big.measure(e, args.receipts, args.scopes, args.rounds), big_figures),
        "scale": (lambda: scale.measure(e, args.scale, args.scale_scopes, args.seconds,
                                        args.rounds, args.pages_only, args.keep_db,
                                        args.reuse_db), scale_figures),
        "cli": (lambda: cli_start.measure(e), cli_figures),
        "memory": (lambda: intake.measure_memory(e), memory_figures),
        "sweep": (lambda: intake.measure_sweep(e, args.seconds, args.shapes), sweep_figures),
        "features": (lambda: intake.measure_sweep(e, args.seconds, None, intake.FEATURES),
                     features_figures),
        "async": (lambda: intake.measure_async(e, args.seconds, args.async_rounds),
                  async_figures),
        "granian": (lambda: granian_intake.measure(e, args.seconds), granian_figures),
    }


def run_measures(e: benv.BenchEnv, args: argparse.Namespace) -> list[Figure]:
    """Run the selected measures, each writing its record; a broken one is reported."""
    figures: list[Figure] = []
    measures = plan(e, args)
    for name in args.only:
        started = time.perf_counter()
        print(f"-- {name} ...", file=sys.stderr, flush=True)
        result: dict[str, Any] = {}
        try:  # a result whose figures fail is still recorded
            result = measures[name][0]()
            found = measures[name][1](result)
        except Exception as error:
            traceback.print_exc()
            found = [failed(name, f"{type(error).__name__}: {error}")]
        figures += found
        record = {"scale": f"scale-{args.scale}",
                  "intake": "intake-against" if args.against else "intake"}.get(name, name)
        if name == "scale" and args.pages_only:
            found = found + kept_purge_rows(record)
        report.write(record, found, result, round(time.perf_counter() - started, 1))
    return figures


def kept_purge_rows(record: str) -> list[Figure]:
    """The purge rows of a scale record, for a pages-only run that did not purge."""
    try:
        doc = json.loads((report.RESULTS / f"{record}.json").read_text())
    except (OSError, ValueError):
        return []
    return [Figure(**f) for f in doc.get("figures", []) if f["measure"].startswith("purge")]


def recorded_10m() -> list[Figure]:
    """The 10M rows from the last `--scale 10m` record, marked as not measured now."""
    path = report.RESULTS / f"scale-{TEN_M}.json"
    try:
        figures = [Figure(**f) for f in json.loads(path.read_text())["figures"]]
    except (OSError, ValueError, TypeError):
        return []
    return [replace(f, not_run=True) for f in figures]


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12, help="per side of a load measure")
    parser.add_argument("--receipts", type=int, default=1_000_000, help='"big": its ledger')
    parser.add_argument("--scopes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=15, help="timed visits per page")
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(DEFAULT_MEASURES))
    parser.add_argument("--scale", type=scale.parse_scale, default=scale.parse_scale("1m"),
                        help="receipts of the biggest ledger of the scale measure: 1m"
                        " (default), 10m (hours on 2 cores)")
    parser.add_argument("--scale-scopes", type=int, default=10_000)
    parser.add_argument("--async-rounds", type=int, default=3,
                        help='"async": rounds of the four sides, each in turn then reversed')
    parser.add_argument("--pages-only", action="store_true",
                        help='"scale": load the biggest ledger alone and time its pages (no'
                        " purge); its record keeps the purge rows of the previous one")
    parser.add_argument("--keep-db", metavar="NAME", default=None,
                        help='"scale": keep the biggest ledger as database NAME (drop it'
                        " yourself: DROP DATABASE NAME)")
    parser.add_argument("--reuse-db", metavar="NAME", default=None,
                        help='"scale": time the pages of a ledger kept by --keep-db, no load'
                        " (implies --pages-only)")
    parser.add_argument("--shapes", type=lambda s: s.split(","), default=None,
                        help='"sweep": only these of intake.SWEEP (default all)')
    parser.add_argument("--against", metavar="GIT_REF", default=None,
                        help='"intake": load this tree and GIT_REF (checked out and installed'
                        " under var/) in turn instead of the thin baselines")
    parser.add_argument("--against-rounds", type=int, default=against.ROUNDS,
                        help="--against: ABBA rounds (each loads both trees twice)")
    args = parser.parse_args(argv)
    args.pages_only = args.pages_only or bool(args.reuse_db)
    unknown = set(args.only) - set(MEASURES)
    if unknown:
        parser.error(f"unknown measure(s) {sorted(unknown)}; choose from {MEASURES}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print the table; exit 1 when a measure could not run."""
    args = parse(argv)
    wrk_binary()
    logging.getLogger("ledger").setLevel(logging.WARNING)  # the in-process dashboard app
    e = benv.BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-")))
    try:
        figures = run_measures(e, args)
    finally:
        e.drop_all()
        shutil.rmtree(e.tmp, ignore_errors=True)
    if "scale" in args.only and args.scale < TEN_M:
        figures += recorded_10m()
    print(report.table(figures))
    measured = [f for f in figures if not f.not_run and f.target]
    print(f"\n{sum(f.met for f in measured)}/{len(measured)} targets met; records in"
          f" {report.RESULTS}")
    return 1 if any(f.note.startswith("NOT MEASURED") for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
