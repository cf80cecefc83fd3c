"""The `/metrics` exposition: process metrics aggregated over processes, state read at scrape.

Two sources make one page:

- Counters and histograms (deliveries, intake latency, attempts, terminal
  failures, purged rows, dead-key use, scheduler runs) live in the process that
  counts them. With PROMETHEUS_MULTIPROC_DIR set (gunicorn.conf.py sets it for
  the web processes; `ledger worker` and `ledger scheduler` on the same host
  share it), prometheus-client writes them to memory-mapped files and
  `MultiProcessCollector` sums them over every process, dead ones included.
- Gauges about the ledger's state (receipts by state, oldest pending age,
  revocation lag per instance, open findings, age of each scheduled job's last
  success) are read from the database when Prometheus scrapes. A gauge copied
  from whichever scheduler process last ran a rollup would be stale when that
  process dies or lives on another host; the database is the one truth every
  web process shares. Same-named gauges from process files are dropped.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select

from ledger.clock import Clock
from ledger.config import metrics_multiproc_dir
from ledger.db.replica import measure_lag
from ledger.db.schema import (
    ROLLUP_MARK,
    findings,
    instances,
    receipts,
    rollup_marks,
    scheduler_runs,
    scope_counts,
)
from ledger.db.timestamps import as_utc
from ledger.domain import ReceiptState
from ledger.scheduling.instances import InstanceKind

# The gauges read at scrape time, each declared once: name -> (meaning, labels). The state
# collector owns these families (copies from process files are dropped); the metrics
# reference (docs/reference/metrics.md) is written from this table and ledger.metrics.
STATE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ledger_metrics_database_up": (
        "1 when /metrics could read the ledger's state from the database", ()),
    "ledger_receipts": ("Receipts by state (from the latest rollup)", ("state",)),
    "ledger_rollup_age_seconds": ("Age of the receipt rollup behind ledger_receipts", ()),
    "ledger_oldest_pending_seconds": ("Age of the oldest pending receipt (0 when none)", ()),
    "ledger_credential_view_age_seconds": (
        "Seconds since each live instance last refreshed its credential view "
        "(must stay under LEDGER_REVOCATION_BOUND_SECONDS)", ("instance",)),
    "ledger_findings_open": ("Open stuck-work and integrity findings, by kind", ("kind",)),
    "ledger_scheduler_last_success_age_seconds": (
        "Seconds since each scheduled job last finished ok", ("job",)),
    "ledger_replica_up": ("1 when the read replica (LEDGER_READ_DATABASE_URL) answered", ()),
    "ledger_replica_lag_seconds": (
        "Read replica lag: 0 when it has replayed all it received, else the age of "
        "its last replayed commit", ()),
}
STATE_FAMILIES = frozenset(STATE_GAUGES)


def _gauge(name: str) -> GaugeMetricFamily:
    """Return an empty family of the declared gauge `name`."""
    meaning, labels = STATE_GAUGES[name]
    return GaugeMetricFamily(name, meaning, labels=list(labels))


# An instance whose heartbeat is older than this many bounds is gone, not lagging.
LIVE_INSTANCE_BOUNDS = 2


class _Without(Collector):
    """Yield another collector's families except the named ones."""

    def __init__(self, source: Any, names: frozenset[str]) -> None:
        self._source = source
        self._names = names

    def collect(self) -> Iterable[Metric]:
        """Yield the source's families not owned elsewhere."""
        return (m for m in self._source.collect() if m.name not in self._names)


class LedgerStateCollector(Collector):
    """Gauges computed from the database at scrape time (cheap, indexed queries)."""

    def __init__(self, engine: Engine, clock: Clock, *, revocation_bound_seconds: float) -> None:
        self._engine = engine
        self._clock = clock
        self._bound = revocation_bound_seconds

    def collect(self) -> Iterator[Metric]:
        """Yield the state gauges, or only `ledger_metrics_database_up 0` on failure."""
        up = _gauge("ledger_metrics_database_up")
        try:
            families = list(self._families(self._clock.now()))
        except Exception:  # a scrape must never fail because the database is away
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self, now: datetime) -> Iterator[Metric]:
        """Read every state gauge in one short read-only connection."""
        with self._engine.connect() as conn:
            # A rollups run rewrites only the rows that changed: its time is the mark's.
            counted_at = conn.execute(select(rollup_marks.c.counted_at)
                                      .where(rollup_marks.c.name == ROLLUP_MARK)).scalar()
            counts = [(state, total, counted_at or refreshed) for state, total, refreshed
                      in conn.execute(select(scope_counts.c.state,
                                             func.sum(scope_counts.c.count),
                                             func.min(scope_counts.c.refreshed_at))
                                      .group_by(scope_counts.c.state))]
            # ix_receipts_open (state, accepted_at) answers this from its first entry.
            oldest = conn.execute(select(func.min(receipts.c.accepted_at))
                                  .where(receipts.c.state == ReceiptState.PENDING.code)).scalar()
            # Only web processes verify signatures and refresh a credential view: a
            # worker's or scheduler's "age" would grow forever and fire the lag alert.
            live = conn.execute(select(instances.c.id, instances.c.started_at,
                                       instances.c.credentials_refreshed_at,
                                       instances.c.heartbeat_at)
                                .where(instances.c.kind == InstanceKind.WEB.value)).all()
            open_findings = conn.execute(
                select(findings.c.kind, func.count()).where(findings.c.resolved_at.is_(None))
                .group_by(findings.c.kind)).all()
            successes = conn.execute(
                select(scheduler_runs.c.job, func.max(scheduler_runs.c.finished_at))
                .where(scheduler_runs.c.outcome == "ok").group_by(scheduler_runs.c.job)).all()
        yield from _receipt_families(counts, now)
        pending = _gauge("ledger_oldest_pending_seconds")
        pending.add_metric([], _age(now, oldest) if oldest is not None else 0.0)
        yield pending
        yield self._view_ages(live, now)
        kinds = _gauge("ledger_findings_open")
        for kind, count in open_findings:
            kinds.add_metric([kind], float(count))
        yield kinds
        last = _gauge("ledger_scheduler_last_success_age_seconds")
        for job, finished in successes:
            last.add_metric([job], _age(now, finished))
        yield last

    def _view_ages(self, rows: Iterable[Any], now: datetime) -> Metric:
        """Return each live web instance's credential view age (the revocation lag)."""
        family = _gauge("ledger_credential_view_age_seconds")
        for row in rows:
            if _age(now, row.heartbeat_at) > LIVE_INSTANCE_BOUNDS * self._bound:
                continue  # gone without deregistering; the sweep reports it
            family.add_metric([row.id], _age(now, row.credentials_refreshed_at or row.started_at))
        return family


def _receipt_families(rows: Iterable[Any], now: datetime) -> Iterator[Metric]:
    """Return receipts by state and the age of the rollup they come from."""
    by_state = _gauge("ledger_receipts")
    totals = {state: 0.0 for state in ReceiptState}
    refreshed: list[datetime] = []
    for code, total, refreshed_at in rows:
        totals[ReceiptState.from_code(code)] = float(total or 0)
        if refreshed_at is not None:
            refreshed.append(refreshed_at)
    for state, total in totals.items():
        by_state.add_metric([state.value], total)
    yield by_state
    if refreshed:
        age = _gauge("ledger_rollup_age_seconds")
        age.add_metric([], _age(now, min(refreshed)))
        yield age


def _age(now: datetime, moment: datetime | str | None) -> float:
    """Return seconds from `moment` to `now` (SQLite aggregates return text)."""
    aware = as_utc(moment)
    if aware is None:
        return 0.0
    return max(0.0, round((now - aware).total_seconds(), 3))


# A process metrics file begins with its used length (4 bytes, padded to 8).
FILE_HEADER_BYTES = 8


def settled_files(path: str) -> list[str]:
    """Return the process metrics files in `path` that are past their creation.

    prometheus-client creates a process's file before it sizes it, so for a moment it is
    empty; MultiProcessCollector then fails the whole scrape on it (struct.error: a 500
    for every process's metrics, prometheus/client_python#1199), and a process killed in
    that moment leaves it empty for good. Such a file holds no sample yet: it is skipped.
    Files only grow, so one found sized stays readable.
    """
    files = []
    for name in glob.glob(os.path.join(path, "*.db")):
        try:
            if os.path.getsize(name) >= FILE_HEADER_BYTES:
                files.append(name)
        except FileNotFoundError:  # removed since the listing: a dead process's live gauges
            continue
    return files


class ProcessFiles(Collector):
    """The process metrics of every process sharing PROMETHEUS_MULTIPROC_DIR, summed."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Iterable[Metric]:
        """Return the merged families of the settled files."""
        from prometheus_client import multiprocess

        merged: Iterable[Metric] = multiprocess.MultiProcessCollector.merge(
            settled_files(self._path), accumulate=True)
        return merged


def process_source() -> Any:
    """Return the collector of this server's process metrics (multiprocess when configured)."""
    path = metrics_multiproc_dir()
    if path:
        return ProcessFiles(path)
    return REGISTRY


class ReplicaLagCollector(Collector):
    """The read replica's state at scrape time: up, and its lag when known."""

    def __init__(self, replica: Engine) -> None:
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        """Yield ledger_replica_up and, when the lag is known, ledger_replica_lag_seconds."""
        up = _gauge("ledger_replica_up")
        try:
            with self._replica.connect() as conn:
                lag, _note = measure_lag(conn)
        except Exception:  # a scrape must never fail because the replica is away
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        if lag is not None:  # unknown (no replay yet): no sample rather than a made-up one
            family = _gauge("ledger_replica_lag_seconds")
            family.add_metric([], lag)
            yield family


def render_metrics(engine: Engine, clock: Clock, *, revocation_bound_seconds: float,
                   replica: Engine | None = None) -> tuple[bytes, str]:
    """Return the exposition text and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Without(process_source(), STATE_FAMILIES))
    registry.register(LedgerStateCollector(engine, clock,
                                           revocation_bound_seconds=revocation_bound_seconds))
    if replica is not None:
        registry.register(ReplicaLagCollector(replica))
    return generate_latest(registry), CONTENT_TYPE_LATEST
