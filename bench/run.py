"""`make bench`: every performance promise against a baseline measured in the same run.

    python -m bench.run [--seconds 12] [--receipts 1000000] [--scopes 1000] [--only intake,...]
    python -m bench.run --only scale --scale 10m     # flat costs at 10M receipts, 10k scopes

Prints a Markdown table and writes bench/results/latest.json. Bench databases
(`ledger_bench_*`) and temp files are removed afterwards, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from statistics import mean
from typing import Any

from bench import big, ceilings, intake, report, scale, servers, sqlite_mixed, worker_bench
from bench import delivery_log as dlog_bench
from bench import env as benv
from bench.loadgen import wrk_binary
from bench.report import Figure, at_least, at_most, failed
from ledger.config import DEFAULT_WORKER_BATCH

# The 10M rows of issue 15, last recorded by `--scale 10m` (committed: a default run prints them).
RECORDED_10M = Path(__file__).resolve().parent / "recorded" / "scale_10m.json"
TEN_M = 10_000_000

MEASURES = ("intake", "sqlite", "worker", "worker-sqlite", "sqlite-worker", "big", "memory",
            "dlog", "scale", "servers", "floors")
# `make bench` runs these; "servers" (gunicorn vs granian), "floors" (the floor intake under
# gunicorn and under granian vs the thin intake; both need granian), "worker-sqlite" (the batched
# worker on SQLite vs batch 1) and "sqlite-worker" (the SQLite intake while a worker drains,
# at two batch sizes) are asked for by name.
DEFAULT_MEASURES = ("intake", "sqlite", "worker", "big", "memory", "dlog", "scale")

# Why a measure can miss on this 2-core machine, and where the evidence is (first
# matching prefix wins: the specific ones come first).
EXPLANATIONS = (
    ("rollups scheduled", "the run counts what changed since the previous one: here the"
     " intake measure's receipts entering the band and the cells they change, on top of the"
     " open set, read whole every run (bench/README.md, \"The rollups run at 10M\")"),
    ("dashboard receipts_prefix", "a prefix list across scopes reads each scope's range of the"
     " primary key in order and stops at the page; a prefix matching little probes every"
     " scope once: grows with scopes, not receipts (\"Flat costs at scale\")"),
    ("purge us per receipt", "the receipts pass is flat; the attempts pass probes the primary"
     " key once per non-complete attempt when the pending set outgrows work_mem, in an index"
     " larger than shared_buffers at 10M (bench/README.md, \"A complete 10M run\")"),
    ("intake accepted/s during", "the purge's CPU comes out of the intake's"
     " (bench/README.md, \"Retention purge\")"),
    ("intake accepted/s on the SQLite", "SQLite has one writer at a time: the claims of a"
     " process share its transactions (group commit) and the processes take turns through a"
     " file lock instead of SQLite's sleeping busy handler; with the writer busy most of the"
     " load time, what bounds it is how long each turn takes under load, its commit"
     " included, against a commit alone (bench/README.md, \"Group commit on SQLite\","
     " \"The one writer under load\")"),
    ("intake accepted/s, delivery log", "a delivery's CPU with the log on against off, above,"
     " is what the log costs; a ratio of accepted/s further from 1 than that is the run-to-run"
     " spread of this shared 2-core machine, which the two cycles show (bench/README.md,"
     " \"Delivery log\")"),
    ("intake", "CPU-bound on 2 cores shared with wrk and PostgreSQL; foreign load moves"
     " the ratio and above all the p99 of single runs (bench/README.md, \"Intake CPU\")"),
    ("duplicate", "duplicates and new events share one CPU-bound path (\"Intake CPU\")"),
    ("worker completions/s on SQLite", "see bench/README.md, \"Workers\", batches on SQLite"),
    ("SQLite intake", "a batch holds SQLite's one writer for all its jobs"
     " (bench/README.md, \"Workers\", seventh round)"),
    ("worker", "per job the ledger does about twice the raw loop's database work by design"
     " (attempt rows, fencing); a batch (16 on PostgreSQL) shares one commit and one claim;"
     " the CPU per job"
     " and the sessions' lock and WAL waits above tell which bound it met"
     " (bench/README.md, \"Workers\", sixth round)"),
    ("bytes", "not reachable while the unique key on (scope, event id) is exact: 204.6 B with"
     " every heap lever, `python -m bench.layouts` (bench/README.md, \"Bytes per receipt\")"),
    ("retention purge rows/s under", "300k/s under load needs half a core of a CPU-saturated"
     " 2-core host; the default pacing keeps the intake >= 0.8x (\"Retention purge\")"),
)


def explain(figure: Figure, figures: list[Figure] | None = None) -> str:
    """Return why a missed measure can miss here, and where its evidence is.

    The intake's ratio to the thin baseline gets the run's own ceilings: what the web
    server alone (HMAC check, no database) and PostgreSQL alone sustained in this run.
    """
    why = next((why for prefix, why in EXPLANATIONS if figure.measure.startswith(prefix)),
               "see bench/README.md, \"Findings\"")
    web = next((f for f in figures or [] if f.measure.endswith("HMAC-only ceiling")), None)
    pg = next((f for f in figures or [] if f.measure.endswith("two-insert ceiling")), None)
    if figure.measure.startswith("intake accepted/s, 16") and web and pg:
        wanted = figure.baseline_value * 2.0
        why = (f"2.0x the thin intake is {wanted:,.0f}/s; in this run gunicorn + Flask with"
               f" only the HMAC check and no database answered {web.baseline_value:,.0f}/s"
               f" (2.0x needs {wanted / web.baseline_value:.0%} of it, with the two inserts,"
               f" the pool and the ledger's own work on top) and PostgreSQL alone"
               f" {pg.baseline_value:,.0f} two-insert transactions/s; the thin intake reached"
               f" {figure.baseline_value / web.baseline_value:.0%} of the HMAC-only ceiling."
               f" {why}")
    return f"{figure.profile} {why}" if figure.profile else why


def _ms(figures: dict[str, Any]) -> str:
    return (f"{figures['web_ms']:.2f} ms in the web processes + {figures['rest_ms']:.2f} ms"
            f" in the database and the rest + {figures['wrk_ms']:.2f} ms in wrk")


def cpu_budget(r: dict[str, Any], minimum: float, database: str) -> str:
    """Return this run's CPU per delivery against what `minimum` x the thin intake allows.

    The budget is the cores' time the host left us (stolen time removed) divided by
    the deliveries per second the target asks for. The floor is the least a delivery
    can cost here: the HMAC-only server's web CPU (when measured) plus the database's
    and wrk's share of ours. A floor above the budget means no intake served this way
    reaches the target on this machine; below it, the profile says how far ours is.
    """
    ours, thin = r.get("ours_cpu"), r.get("thin_cpu")
    if not ours or not thin or not ours.get("web_ms"):
        return ""
    hmac = (r.get("ceilings") or {}).get("hmac_only", {}).get("cpu")
    text = (f"Measured in this run (CPU per delivery, bench/cpu.py): ours {_ms(ours)}, the"
            f" cores {ours['idle_share']:.0%} idle and {ours['stolen_share']:.0%} taken by the"
            f" host; the thin intake {_ms(thin)}, {thin['idle_share']:.0%} idle")
    if hmac:
        text += f"; the HMAC-only server {hmac['web_ms']:.2f} ms in its web processes"
    return text + ". " + _reach(r, minimum, f"{minimum}x", database)


def _reach(r: dict[str, Any], minimum: float, label: str, database: str) -> str:
    """Return what `minimum` x the thin intake's deliveries/s leaves per delivery, and
    whether the HMAC-only floor, or else ours, fits in it (cpu_budget's verdict)."""
    ours = r["ours_cpu"]
    cores = os.cpu_count() or 1
    wanted = minimum * r["thin_accepted_per_s"]
    budget = 1000 * cores * (1 - ours["stolen_share"]) / wanted if wanted else 0.0
    hmac = (r.get("ceilings") or {}).get("hmac_only", {}).get("cpu")
    text = (f"{label} the thin intake is {wanted:,.0f} deliveries/s, which leaves"
            f" {budget:.2f} ms of the {cores} cores per delivery.")
    spent = ours["web_ms"] + ours["rest_ms"] + ours["wrk_ms"]
    floor = (hmac["web_ms"] + ours["rest_ms"] + ours["wrk_ms"]) if hmac else None
    if floor is not None and floor > budget:
        text += (f" Even the HMAC check alone with our {database} share and wrk's"
                 f" ({floor:.2f} ms) is more than that: no intake served by gunicorn and"
                 f" Flask onto this {database} reaches it here.")
    elif spent > budget:
        allowed = max(0.0, budget - ours["rest_ms"] - ours["wrk_ms"])
        text += (f" Ours spends {spent:.2f} ms: the web processes would have to fall from"
                 f" {ours['web_ms']:.2f} to {allowed:.2f} ms per delivery.")
    else:
        text += (f" Ours spends {spent:.2f} ms, within it: the cores were left idle, so what"
                 f" bounds it is waiting, not CPU.")
    return text


def p99_profile(r: dict[str, Any], target: float) -> str:
    """Return each run's p50 and p99, their spread, and what a closed loop implies.

    wrk keeps 16 requests in flight, so the mean latency is 16 / answered per second:
    with the thin intake's spread of the tail (p99 / p50), ours reaches `target` x its
    p99 only by answering 1 / `target` x its deliveries/s, a CPU budget (_reach).
    """
    runs = r.get("runs", {})
    if not runs.get("ours") or not runs.get("thin"):
        return ""
    each = {name: ", ".join(f"{run['p99_ms']:.0f}" for run in runs[name])
            for name in ("ours", "thin")}
    text = (f"Measured in this run: p99 of each run (ms, ABBA order) ours {each['ours']},"
            f" thin {each['thin']}; the cores"
            f" {r.get('ours_cpu', {}).get('idle_share', 0):.0%} idle under ours.")
    if not all(run.get("p50_ms") for name in ("ours", "thin") for run in runs[name]):
        return text
    spread = {name: mean(run["p99_ms"] / run["p50_ms"] for run in runs[name])
              for name in ("ours", "thin")}
    p50 = {name: ", ".join(f"{run['p50_ms']:.0f}" for run in runs[name])
           for name in ("ours", "thin")}
    text += (f" p50 ours {p50['ours']}, thin {p50['thin']}: p99 / p50 ours"
             f" {spread['ours']:.1f}, thin {spread['thin']:.1f}. With {intake.CONNECTIONS}"
             f" requests always in flight the latency follows the throughput: {target}x the"
             f" thin intake's p99 takes {1 / target:.2f}x its deliveries/s at the same"
             f" p99 / p50, or at the same deliveries/s a p99 / p50 of"
             f" {target * spread['thin']:.1f}.")
    if r.get("ours_cpu", {}).get("web_ms") and r.get("thin_cpu"):
        text += " " + _reach(r, 1 / target, f"{1 / target:.2f}x", "PostgreSQL")
    return text


FLOOR = ("the gunicorn floor (bench/floor_intake.py: a plain WSGI callable, the HMAC check"
         " and one autocommit claim statement; no Flask, pool, logs, metrics or delivery log),"
         " served and loaded like both in the middle of each ABBA cycle,")


def floor_verdict(r: dict[str, Any], key: str, target: float) -> str:
    """Return what the gunicorn floor reached against the thin intake on `key`, and whether
    the target is out of reach for any intake served by gunicorn onto this PostgreSQL.

    The floor does the least an intake can (authenticate, claim receipt + job, answer) on
    the same server, shape, database and load: nothing that does more can answer faster.
    """
    if not r.get(f"floor_{key}") or not r.get(f"thin_{key}"):
        return ""
    floor, thin, ours = r[f"floor_{key}"], r[f"thin_{key}"], r[f"ours_{key}"]
    ratio = floor / thin
    lower = key.endswith("_ms")  # a latency: the target is an upper bound
    what = "p99" if lower else "accepted/s"
    text = f"In this run {FLOOR} reached {ratio:.2f}x the thin intake's {what}"
    share = (f"ours' p99 was {ours / floor:.2f}x the floor's" if lower
             else f"ours reached {ours / floor:.0%} of the floor's accepted/s")
    if (ratio > target) if lower else (ratio < target):
        text += (f", short of {target}x itself: no intake served by gunicorn onto this"
                 f" PostgreSQL met the target in this run; {share}.")
    else:
        text += f", within the target: {share}."
    spent, mine = (r.get("floor_cpu") or {}).get("web_ms"), (r.get("ours_cpu") or {}).get("web_ms")
    if not lower and spent and mine:
        text += f" The floor's web processes spent {spent:.2f} ms per delivery, ours {mine:.2f}."
    return text


def _joined(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def intake_figures(r: dict[str, Any]) -> list[Figure]:
    """Accepted/s, p99 and duplicates/s on PostgreSQL; the share of both ceilings and of
    the gunicorn floor."""
    dup = r["duplicates"]
    note = "" if not (r["thin_wraps"] or r["ours_wraps"]) else "a file of new events wrapped"
    return [
        replace(at_least("intake accepted/s, 16 connections (PostgreSQL)",
                         r["ours_accepted_per_s"], "/s", "thin intake",
                         r["thin_accepted_per_s"], 2.0, note),
                profile=_joined(floor_verdict(r, "accepted_per_s", 2.0),
                                cpu_budget(r, 2.0, "PostgreSQL"))),
        replace(at_most("intake p99 latency (PostgreSQL)", r["ours_p99_ms"], "ms",
                        "thin intake p99", r["thin_p99_ms"], 0.7),
                profile=_joined(floor_verdict(r, "p99_ms", 0.7), p99_profile(r, 0.7))),
        at_least("duplicate deliveries/s", dup["dup_per_s"], "/s",
                 "our accepted/s (new events, interleaved runs)", dup["new_accepted_per_s"],
                 1.0, f"{dup['dup_new_receipts']} new receipts during the duplicate runs"
                 " (expected 0, or a few requests wrk had prepared but not sent when the"
                 " replayed run ended)"),
        *ceiling_figures(r),
        *floor_figures(r),
    ]


def floor_figures(r: dict[str, Any]) -> list[Figure]:
    """Our accepted/s as a share of the gunicorn floor's, interleaved with it."""
    if not r.get("floor_accepted_per_s"):
        return []
    floor = r["floor_accepted_per_s"]
    return [_with_met(at_least("where the rest goes: our accepted/s vs the gunicorn floor",
                               r["ours_accepted_per_s"], "/s", "bench/floor_intake.py, HMAC +"
                               " one autocommit claim, no Flask, same shape, ABBA", floor, 0.0,
                               f"p99 {r['floor_p99_ms']:.1f} ms; thin intake"
                               f" {r['thin_accepted_per_s']:.0f}/s ="
                               f" {r['thin_accepted_per_s'] / floor:.0%} of it"),
                      True, "shown, measured in this run")]


def ceiling_figures(r: dict[str, Any]) -> list[Figure]:
    """Our accepted/s as a share of PostgreSQL's two-insert ceiling and of HMAC-only serving."""
    c = r.get("ceilings", {})
    if "error" in c or not c:
        return [failed("where the rest goes (ceilings)", c.get("error", "not run"))]
    ours, pg, web = (r["ours_accepted_per_s"], c["postgres"]["tps"],
                     c["hmac_only"]["answered_per_s"])
    shown = "shown, measured in this run"
    return [
        _with_met(at_least("where the rest goes: our accepted/s vs PostgreSQL's two-insert"
                           " ceiling", ours, "/s", "pgbench, receipt + job per transaction,"
                           f" {c['postgres']['clients']} clients", pg, 0.0,
                           "no HTTP and no Python: what the database alone sustains here"),
                  True, shown),
        _with_met(at_least("where the rest goes: our accepted/s vs the server's HMAC-only"
                           " ceiling", ours, "/s", "gunicorn + Flask, HMAC check and JSON"
                           " parse, no database", web, 0.0,
                           f"p99 {c['hmac_only']['p99_ms']:.1f} ms; thin intake"
                           f" {r['thin_accepted_per_s']:.0f}/s ="
                           f" {r['thin_accepted_per_s'] / web:.0%} of it" if web else ""),
                  True, shown),
    ]


def writer_profile(r: dict[str, Any]) -> str:
    """Return what SQLite's one writer did during our runs (the ledger's own metrics).

    Beside the CPU budget: when the cores were left idle, this says whether the one
    writer was the wait, and how long its turns took against a commit with nothing else
    running (measured after the runs, same settings).
    """
    writer = r.get("ours_writer")
    if not writer:
        return ""
    text = (f"The one writer (ledger_sqlite_writer_* on ours' /metrics, over its runs):"
            f" busy {writer['busy_share']:.0%} of the load time, {writer['turns_per_s']:,.0f}"
            f" turns/s, each held {writer['hold_ms']:.2f} ms and waited for"
            f" {writer['wait_ms']:.2f} ms, {writer['claims_per_commit']:.1f} claims per intake"
            " commit")
    if r.get("commit_alone_ms"):
        text += (f"; a commit alone takes {r['commit_alone_ms']:.2f} ms here (WAL,"
                 " synchronous=FULL, nothing else running)")
    return text + "."


def sqlite_figures(r: dict[str, Any]) -> list[Figure]:
    """The embedded default against the thin intake on SQLite."""
    return [replace(at_least("intake accepted/s on the SQLite default",
                             r["ours_accepted_per_s"], "/s", "thin intake on SQLite",
                             r["thin_accepted_per_s"], 1.5),
                    profile=_joined(cpu_budget(r, 1.5, "SQLite"), writer_profile(r)))]


def worker_figures(r: dict[str, Any]) -> list[Figure]:
    """Worker completions against the raw claim loop."""
    note = (f"CPU per job, client + PostgreSQL: ours {r['ours_cpu_ms_per_job']:.2f} +"
            f" {r['ours_db_cpu_ms_per_job']:.2f} ms, raw {r['raw_cpu_ms_per_job']:.2f} +"
            f" {r['raw_db_cpu_ms_per_job']:.2f} ms; machine idle {r['ours_idle_share']:.0%}"
            f" / {r['raw_idle_share']:.0%}")
    if "ours_lock_waits" in r:
        note += ("; PostgreSQL sessions in a row-lock wait, mean per sample:"
                 f" ours {r['ours_lock_waits']:.2f}, raw {r['raw_lock_waits']:.2f};"
                 f" in a WAL flush: ours {r['ours_wal_waits']:.2f}, raw {r['raw_wal_waits']:.2f}")
    if "other_per_s" in r:
        note += (f"; --batch {r['compare_batch']}: {r['other_per_s']:,.0f}/s"
                 f" ({r['other_per_s'] / r['raw_per_s']:.3f}x raw),"
                 f" {r['other_cpu_ms_per_job']:.2f} + {r['other_db_cpu_ms_per_job']:.2f} ms")
    batch = f", batch {r['batch']}" if r.get("batch") else ""
    if r.get("scopes", worker_bench.SCOPES) != worker_bench.SCOPES:
        batch += f", {r['scopes']:,} scopes"
    return [at_least(f"worker completions/s (demo.credit, {r['processes']} workers{batch})",
                     r["ours_per_s"], "/s", "raw claim loop", r["raw_per_s"], 1.0, note)]


def worker_sqlite_figures(r: dict[str, Any]) -> list[Figure]:
    """The batched worker on the SQLite default against the same worker at batch 1."""
    note = (f"one process each; client CPU per job {r['ours_cpu_ms_per_job']:.2f} vs"
            f" {r['base_cpu_ms_per_job']:.2f} ms; machine idle {r['ours_idle_share']:.0%}"
            f" / {r['base_idle_share']:.0%}")
    return [at_least(f"worker completions/s on SQLite, batch {r['batch']}", r["ours_per_s"],
                     "/s", f"the same worker, batch {r['baseline_batch']}", r["base_per_s"],
                     1.0, note)]


def sqlite_worker_figures(r: dict[str, Any]) -> list[Figure]:
    """The SQLite intake while a worker drains at batch B, against the same at batch A."""
    a, b = r["batch"], r["other_batch"]
    note = (f"no worker: {r['none_accepted_per_s']:,.0f}/s, p99 {r['none_p99_ms']:.1f} ms;"
            f" the worker completed {r['a_completed_per_s']:,.0f}/s at batch {a},"
            f" {r['b_completed_per_s']:,.0f}/s at batch {b}")
    return [
        at_least(f"SQLite intake while a worker drains, batch {b}", r["b_accepted_per_s"],
                 "/s", f"the same, batch {a}", r["a_accepted_per_s"], 0.9, note),
        at_most(f"SQLite intake p99 while a worker drains, batch {b}", r["b_p99_ms"], "ms",
                f"the same, batch {a}", r["a_p99_ms"], 1.1),
    ]


def big_figures(r: dict[str, Any]) -> list[Figure]:
    """Bytes per receipt, purge, intake during the purge, dashboard pages."""
    ours, naive = r["bytes"]["ours"], r["bytes"]["naive"]
    packed = r["bytes"]["packed"]
    per_row = ours["total_per_row"]
    bytes_fig = at_most(
        f"bytes per receipt ({r['receipts']:,} receipts, {r['scopes']:,} scopes)", per_row,
        "B", "naive schema", naive["total_per_row"], 200 / naive["total_per_row"],
        f"heap {ours['heap_per_row']}"
        f" + indexes {ours['indexes_per_row']} + TOAST {ours['toast_per_row']}; packed "
        f"(after REINDEX) {packed['receipts']} vs naive {packed['naive_receipts']}")
    bytes_fig = _with_met(bytes_fig, per_row <= 200, "<= 200 B")
    p, u, raw = r["purge"], r["purge_unloaded"], r["raw_purge"]["rows_per_s"]
    unloaded = at_least(
        "retention purge rows/s (1M expired, unloaded, full speed)", u["purge_rows_per_s"],
        "/s", "raw batched DELETE (naive table, no history)", raw, 300_000 / raw,
        f"PostgreSQL CPU {u['postgres_cpu_us_per_receipt']} us + client "
        f"{u['client_cpu_us_per_receipt']} us, WAL {u['wal_bytes_per_receipt']} B per receipt")
    loaded = at_least(
        f"retention purge rows/s under HTTP intake load (duty cycle {p['duty_cycle']})",
        p["purge_rows_per_s"], "/s", "raw batched DELETE (naive table, no history)", raw,
        300_000 / raw, f"{p['expired_receipts']:,} receipts in {p['purge_seconds']} s; "
        "300k/s with intake >= 0.8x needs more than 2 cores (bench/README.md)")
    figures = [
        bytes_fig,
        _with_met(unloaded, u["purge_rows_per_s"] >= 300_000, ">= 300,000/s"),
        _with_met(loaded, p["purge_rows_per_s"] >= 300_000, ">= 300,000/s"),
        at_least("intake accepted/s during the purge", p["intake_during_per_s"], "/s",
                 "intake around the purge (mean of the 4 s before and after)",
                 p["intake_around_per_s"], 0.8,
                 f"before {p['intake_before_per_s']:.0f}/s, after {p['intake_after_per_s']:.0f}/s"),
    ]
    for page, t in r["dashboard"].items():
        median = at_most(f"dashboard {page} (p95 {t['p95_ms']} ms)", t["median_ms"], "ms",
                         "target median", 150, 1.0)
        figures.append(_with_met(median, median.met and t["p95_ms"] <= 300,
                                 "median <= 150 ms, p95 <= 300 ms"))
    return figures


def scale_figures(r: dict[str, Any]) -> list[Figure]:
    """Intake, pages, rollups and purge on the biggest ledger against the smaller ones."""
    n = f"{r['receipts']:,} receipts / {r['scopes']:,} scopes"
    i, ro = r["intake"], r["rollups"]
    sched, full = ro.get("scheduled", {}), ro.get("full_recount", {})
    loads = f"{r['scopes']:,} scopes {r['scopes_seconds']} s; " + "; ".join(
        f"{size:,}: load {led['load_seconds']} s + VACUUM"
                      f" {led['vacuum_seconds']} s, {led['disk_mb']:,} MB"
                      for size, led in r["ledgers"].items())
    figures = []
    if "error" in i:
        figures.append(failed(f"intake accepted/s at {n}", f"{i['error']}; {loads}"))
    else:
        figures.append(at_least(f"intake accepted/s at {n}", i["large_accepted_per_s"], "/s",
                                f"same bench at {scale.BASELINE:,} receipts",
                                i["small_accepted_per_s"], 0.9, loads))
    if "error" in sched or "error" in ro:
        figures.append(failed(f"rollups scheduled run at {n}",
                              sched.get("error") or ro.get("error", "")))
    else:
        counts = sched["scope_counts"]
        figures.append(_with_met(at_most(
            f"rollups scheduled run at {n}", sched["run_seconds"], "s", "target", 2.0, 1.0,
            f"scope_counts {counts['seconds']} s reading {counts['receipts_read']:,}"
            f" receipts and {counts.get('repair_read', 0):,} of the scopes it recounted"
            f" whole; series and delivery hours {sched['series_recent_seconds']} s reading"
            f" {sched.get('series_receipts_read', 0):,} receipts and"
            f" {sched.get('series_repair_read', 0):,} of the hour it recounted whole; no"
            f" daily recount: the full count, on a first run, after a pause over the purge"
            f" margin or on demand, took {full['seconds']} s ({full['receipts_read']:,}"
            f" receipts) and {ro['series_full_seconds']} s for the series"),
            sched["run_seconds"] <= 2.0 and not counts["full"]
            and not sched.get("series_full", False),
            "<= 2 s, incremental"))
    if "error" in r["dashboard"]:
        figures.append(failed(f"dashboard pages at {n}", r["dashboard"]["error"]))
    else:
        for page, t in r["dashboard"].items():
            figures.append(at_most(f"dashboard {page} at {n} p95 (median {t['median_ms']} ms)",
                                   t["p95_ms"], "ms", "target p95", 300, 1.0))
    purged = sorted((k for k, v in r["purge"].items() if "error" not in v), key=int)
    figures += [failed(f"purge at {int(k):,}", v["error"]) for k, v in r["purge"].items()
                if "error" in v]
    if len(purged) >= 2:
        low, high = r["purge"][purged[0]], r["purge"][purged[-1]]
        figures.append(at_most(
            f"purge us per receipt at {int(purged[-1]):,}", high["us_per_receipt"], "us",
            f"purge at {int(purged[0]):,}", low["us_per_receipt"], 1.2,
            f"{high['expired_receipts']:,} receipts in {high['purge_seconds']} s vs"
            f" {low['expired_receipts']:,} in {low['purge_seconds']} s"))
    if r["receipts"] >= TEN_M:
        record_10m(figures, r)
    else:
        figures += recorded_10m_figures()
    return figures


def record_10m(figures: list[Figure], r: dict[str, Any]) -> None:
    """Keep a --scale 10m run's figures, so default runs can print them (commit the file)."""
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    RECORDED_10M.parent.mkdir(parents=True, exist_ok=True)
    RECORDED_10M.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(timespec="minutes"), "load_at_end": load,
        "receipts": r["receipts"], "scopes": r["scopes"],
        "figures": [asdict(f) for f in figures]}, indent=2) + "\n")


def recorded_10m_figures() -> list[Figure]:
    """Issue 15's 10M rows, not measured by this run: the last recorded figures, marked so."""
    rows = ("intake accepted/s at 10M receipts / 10,000 scopes (>= 0.9x the 100k ledger)",
            "rollups scheduled run at 10M (<= 2 s, incremental)",
            "every dashboard page at 10M (p95 <= 300 ms)",
            "purge us per receipt, 1M -> 10M (flat within 20 %)")
    try:
        doc = json.loads(RECORDED_10M.read_text())
    except (OSError, ValueError):
        return [_not_run(row, "not run in the default bench; see --scale 10m, never recorded")
                for row in rows]
    recorded = [Figure(**f) for f in doc["figures"]]
    when = (f"not run in the default bench; see --scale 10m, last recorded {doc['date']}"
            f" (load {doc.get('load_at_end', '?')})"
            + (f" [{doc['note']}]" if doc.get("note") else ""))
    picks = {rows[0]: [f for f in recorded if f.measure.startswith("intake accepted/s at")],
             rows[1]: [f for f in recorded if f.measure.startswith("rollups scheduled")],
             rows[2]: [f for f in recorded if f.measure.startswith("dashboard ")],
             rows[3]: [f for f in recorded if f.measure.startswith("purge us per receipt")]}
    out = []
    for row, found in picks.items():
        if not found:
            out.append(_not_run(row, f"{when}: not measured then"))
        elif row == rows[2]:
            worst = max(found, key=lambda f: f.value)
            missed = [f.measure.split(" at ")[0].removeprefix("dashboard ") for f in found
                      if not f.met]
            out.append(replace(worst, measure=row, not_run=True, met=False,
                               note=f"{when}: worst p95 {worst.measure}; "
                               f"{len(found) - len(missed)} of {len(found)} pages met"
                               + (f", missed: {', '.join(missed)}" if missed else "")))
        else:
            f = found[0]
            out.append(replace(f, measure=row, not_run=True, met=False,
                               note=f"{when}: {'met' if f.met else 'missed'} ({f.measure})"
                               + (f"; {f.note}" if f.note else "")))
    return out


def _not_run(measure: str, why: str) -> Figure:
    """A target row this run did not measure."""
    return Figure(measure=measure, value=0.0, unit="", baseline="", baseline_value=0.0,
                  ratio=0.0, target="", met=False, not_run=True,
                  note=why)


def _with_met(figure: Figure, met: bool, target: str) -> Figure:
    """Return the figure judged on an absolute target instead of its ratio."""
    return replace(figure, met=met, target=target)


def memory_figures(r: dict[str, Any]) -> list[Figure]:
    """Peak RSS per gunicorn worker after the requests."""
    figure = at_most(f"peak RSS per gunicorn worker after {r['requests']:,} requests",
                     r["max_peak_rss_mb"], "MB", "target", 150, 1.0,
                     f"per worker: {r['peak_rss_mb']}")
    return [_with_met(figure, figure.met and r["requests"] >= 100_000, "<= 150 MB")]


def server_figures(r: dict[str, Any]) -> list[Figure]:
    """The ledger under another server (or shape) against the ledger under gunicorn."""
    figures = []
    for name, label in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        side, b = r[name], r["against"]
        figures += [
            at_least(f"{b} accepted/s vs gunicorn ({label})", side["ours_accepted_per_s"],
                     "/s", "the ledger under gunicorn", side["thin_accepted_per_s"], 1.0),
            at_most(f"{b} p99 vs gunicorn ({label})", side["ours_p99_ms"], "ms",
                    "the ledger under gunicorn, p99", side["thin_p99_ms"], 1.0),
        ]
    return figures


def floors_figures(r: dict[str, Any]) -> list[Figure]:
    """The gunicorn floor under gunicorn and under granian against the thin intake: shown.

    Whether the intake's 2.0x and 0.7x p99 are within the server's reach on this machine
    at all, whatever the ledger does on top (bench/README.md, "The gunicorn floor")."""
    thin, thin_p99 = r["thin_accepted_per_s"], r["thin_p99_ms"]
    figures = []
    for name, label in (("gunicorn_floor", "under gunicorn"), ("granian_floor", "under granian")):
        rate, p99 = r[f"{name}_accepted_per_s"], r[f"{name}_p99_ms"]
        verdict = "reaches" if rate >= 2.0 * thin else "falls short of"
        figures.append(_with_met(at_least(
            f"the floor intake {label}: accepted/s vs the thin intake (PostgreSQL)", rate, "/s",
            "thin intake (gunicorn)", thin, 0.0,
            f"{verdict} the intake's 2.0x; p99 {p99:.1f} ms = {p99 / thin_p99:.2f}x the thin"
            f" intake's (target 0.7x)"), True, "shown, measured in this run"))
    return figures


def dlog_figures(r: dict[str, Any]) -> list[Figure]:
    """Accepted/s with the delivery log on vs off; a forged flood's rows vs the log's bound."""
    f = r["flood"]
    on_log = at_least("intake accepted/s, delivery log on (PostgreSQL)", r["on_accepted_per_s"],
                      "/s", "delivery log off", r["off_accepted_per_s"], 0.95)
    on_cpu, off_cpu = r.get("on_cpu") or {}, r.get("off_cpu") or {}
    if on_cpu.get("web_ms") and off_cpu.get("web_ms"):
        on_ms = on_cpu["web_ms"] + on_cpu["rest_ms"]
        off_ms = off_cpu["web_ms"] + off_cpu["rest_ms"]
        cycles = ", ".join(f"{x:.3f}x" for x in r.get("cycle_ratios", []))
        on_log = replace(on_log, profile=(
            f"Measured in this run (CPU per delivery, bench/cpu.py): log on {on_cpu['web_ms']:.3f}"
            f" ms in the web processes + {on_cpu['rest_ms']:.3f} ms in the database and the"
            f" rest, log off {off_cpu['web_ms']:.3f} + {off_cpu['rest_ms']:.3f} ms: the log"
            f" cost {on_ms / off_ms - 1:+.1%} of a delivery's CPU; its two ABBA cycles read"
            f" {cycles} on over off."))
    return [
        on_log,
        at_most("delivery log rows added by a forged flood", f["rows_added"], "rows",
                "the log's bound", f["bound_rows"], 1.0,
                f"{f['forged_requests']} forged requests at {f['forged_per_s']:.0f}/s ="
                f" {f['forged_per_s'] / max(r['on_accepted_per_s'], 1):.1f}x the accepted rate;"
                f" {f['refusals_counted']} refusals counted in the rows"),
    ]


def run_measures(e: benv.BenchEnv, args: argparse.Namespace) -> tuple[list[Figure], dict]:
    """Run the selected measures; a broken one is reported, the rest still run."""
    shape = benv.ServerShape(worker_class=args.worker_class, workers=args.workers,
                             threads=args.threads)
    plan: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[dict], list[Figure]]]] = {
        "intake": (lambda: intake.measure_pg(e, shape, args.seconds)
                   | {"ceilings": measure_ceilings(e, shape, args.seconds / 2)}, intake_figures),
        "sqlite": (lambda: intake.measure_sqlite(e, shape, args.seconds), sqlite_figures),
        "worker": (lambda: worker_bench.measure(e, args.seconds, batch=args.worker_batch,
                                                compare_batch=args.worker_compare_batch,
                                                scopes=args.worker_scopes),
                   worker_figures),
        "worker-sqlite": (lambda: worker_bench.measure_sqlite(
            e, args.seconds, args.worker_batch or DEFAULT_WORKER_BATCH,
            args.worker_compare_batch or 1, scopes=args.worker_scopes), worker_sqlite_figures),
        "sqlite-worker": (lambda: sqlite_mixed.measure(
            e, shape, args.seconds, args.worker_compare_batch or DEFAULT_WORKER_BATCH,
            args.worker_batch or 16), sqlite_worker_figures),
        "big": (lambda: big.measure(e, shape, args.receipts, args.scopes, args.rounds),
                big_figures),
        "memory": (lambda: intake.measure_memory(e, shape, args.memory_requests),
                   memory_figures),
        "servers": (lambda: servers.measure(e, shape, args.seconds, args.against), server_figures),
        "floors": (lambda: servers.floors(e, shape, args.seconds), floors_figures),
        "dlog": (lambda: dlog_bench.measure(e, shape, args.seconds), dlog_figures),
        "scale": (lambda: scale.measure(e, shape, args.scale, args.scale_scopes, args.seconds,
                                        args.rounds), scale_figures),
    }
    figures: list[Figure] = []
    details: dict[str, Any] = {"shape": shape.args(), "seconds": args.seconds}
    for name in args.only:
        started = time.perf_counter()
        print(f"-- {name} ...", file=sys.stderr, flush=True)
        try:
            result = plan[name][0]()
            figures += plan[name][1](result)
            details[name] = _jsonable(result)
        except Exception as error:
            traceback.print_exc()
            figures.append(failed(name, f"{type(error).__name__}: {error}"))
        details[f"{name}_seconds"] = round(time.perf_counter() - started, 1)
        print(f"   {name} took {details[f'{name}_seconds']} s", file=sys.stderr, flush=True)
    return figures, details


def measure_ceilings(e: benv.BenchEnv, shape: benv.ServerShape, seconds: float
                     ) -> dict[str, Any]:
    """Both ceilings right after the intake runs; a failure is reported, not fatal."""
    try:
        return ceilings.measure(e, shape, "in_ceiling", seconds)
    except Exception as error:
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"}


def _jsonable(value: Any) -> Any:
    """Turn run results (dataclasses inside) into JSON-friendly values."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "to_json"):
        return value.to_json()
    return value if isinstance(value, int | float | str | bool | type(None)) else str(value)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12, help="per load run")
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--scopes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=15, help="timed visits per page")
    parser.add_argument("--memory-requests", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--worker-class", default="gthread")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--against", default="granian",
                        help='"servers": side B, granian[:N] or threads:N (gunicorn, N threads)')
    parser.add_argument("--worker-batch", type=int, default=None,
                        help='"worker", "worker-sqlite": the ledger\'s --batch (default'
                        ' LEDGER_WORKER_BATCH\'s); "sqlite-worker": the batch compared'
                        ' (default 16)')
    parser.add_argument("--worker-compare-batch", type=int, default=None,
                        help='"worker": also run --batch N as a third side (A B C C B A);'
                        ' "worker-sqlite": the baseline batch (default 1); "sqlite-worker":'
                        ' the baseline batch (default LEDGER_WORKER_BATCH\'s)')
    parser.add_argument("--worker-scopes", type=int, default=worker_bench.SCOPES,
                        help='"worker", "worker-sqlite": scopes of the backlog')
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(DEFAULT_MEASURES))
    parser.add_argument("--scale", type=scale.parse_scale, default=scale.parse_scale("1m"),
                        help="receipts of the biggest ledger of the scale measure: 1m"
                        " (default, in make bench), 2m, 10m (~hours on 2 cores; bench/README.md)")
    parser.add_argument("--scale-scopes", type=int, default=10_000)
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(MEASURES)
    if unknown:
        parser.error(f"unknown measure(s) {sorted(unknown)}; choose from {MEASURES}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write latest.json; exit 0 when every measure ran."""
    args = parse(argv)
    wrk_binary()
    # The in-process dashboard app would log every page view to this terminal.
    logging.getLogger("ledger").setLevel(logging.WARNING)
    started = time.perf_counter()
    e = benv.BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-")))
    try:
        figures, details = run_measures(e, args)
    finally:
        e.drop_all()
        shutil.rmtree(e.tmp, ignore_errors=True)
    details["total_seconds"] = round(time.perf_counter() - started, 1)
    path = report.write(figures, details)
    print(report.table(figures))
    missed = [f for f in figures
              if not f.met and not f.not_run and not f.note.startswith("NOT MEASURED")]
    if missed:
        print("\nMissed, and why:")
        for figure in missed:
            print(f"- {figure.measure}: {explain(figure, figures)}")
    measured = [f for f in figures if not f.not_run]
    skipped = len(figures) - len(measured)
    print(f"\n{sum(f.met for f in measured)}/{len(measured)} targets met"
          + (f" ({skipped} rows not run: see --scale 10m)" if skipped else "")
          + f" in {details['total_seconds']} s; details in {path}")
    return 1 if any(f.note.startswith("NOT MEASURED") for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
