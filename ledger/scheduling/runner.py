"""`ledger scheduler`: the scheduled jobs, once per period across every scheduler instance.

Each instance fires every job at the boundaries of its period. A firing computes
period_start = floor(now / period) * period and, in ONE short transaction, takes
the guard (PostgreSQL `pg_try_advisory_xact_lock`, transaction-scoped so it also
works behind PgBouncer transaction pooling; SQLite the BEGIN IMMEDIATE write
lock every transaction takes) and inserts the scheduler_runs row with ON
CONFLICT DO NOTHING on (job, period_start). Only the inserter runs the job, in
its own short transactions, and then records the outcome on that row. The row
is leased (LEDGER_LEASE_SECONDS) and the holder renews the lease every third of
it while the job runs; a holder that dies leaves its row 'running' until the
lease runs out, and then the next claim of that job (or the sweep, for every
job) marks it abandoned. It blocks nothing: the next period has a new
period_start.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers import SchedulerNotRunningError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine, text
from sqlalchemy import exc as sa_exc

from ledger.clock import Clock
from ledger.config import Settings
from ledger.db.locks import advisory_key
from ledger.errors import error_summary
from ledger.logs import get_logger
from ledger.metrics import SCHEDULER_RUNS
from ledger.scheduling import runs
from ledger.scheduling.instances import new_instance_id
from ledger.services import Services

log = get_logger("ledger.scheduler")
JobFunc = Callable[[Engine, Settings, Clock], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledJob:
    """A job function and how often it runs (seconds)."""

    name: str
    period_seconds: float
    func: JobFunc


# The outer layer (the app, through ledger.jobs.catalogue) registers what the scheduler
# runs: this room never imports the jobs it schedules.
Catalogue = Callable[[Settings], list[ScheduledJob]]
_CATALOGUE: list[Catalogue] = []


def register_jobs(catalogue: Catalogue) -> None:
    """Make `catalogue` the source of the scheduled jobs (the app calls this once)."""
    _CATALOGUE[:] = [catalogue]


def default_jobs(settings: Settings) -> list[ScheduledJob]:
    """Return the registered scheduled jobs with their default periods."""
    if not _CATALOGUE:
        raise RuntimeError("no scheduled jobs registered: build the app first "
                           "(ledger.app.create_app registers ledger.jobs.catalogue)")
    return _CATALOGUE[0](settings)


def period_start(now: datetime, period_seconds: float) -> datetime:
    """Return the start of the period holding `now`: floor(now / period) * period."""
    floor = math.floor(now.timestamp() / period_seconds) * period_seconds
    return datetime.fromtimestamp(floor, UTC)


def claim_period(engine: Engine, job: ScheduledJob, *, instance: str, now: datetime,
                 lease_seconds: float = 60) -> int | None:
    """Take this period of `job` for `instance`; return the run id, or None if taken.

    The winner also marks the job's earlier runs whose lease ran out abandoned.
    """
    start = period_start(now, job.period_seconds)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Transaction-scoped: released at COMMIT, so it never outlives this
            # short transaction and survives PgBouncer transaction pooling.
            got = conn.execute(text("SELECT pg_try_advisory_xact_lock(:key)"),
                               {"key": advisory_key(job.name)}).scalar()
            if not got:
                return None
        run_id = runs.claim_run(conn, job=job.name, period_start=start, instance=instance,
                                now=now, lease_seconds=lease_seconds)
        if run_id is not None:
            runs.mark_abandoned_runs(conn, now=now, job=job.name,
                                     grace_seconds=runs.ABANDONED_RUN_GRACE_SECONDS)
        return run_id


class LeaseKeeper:
    """Renews a run's lease every third of it while the job runs (a daemon thread)."""

    def __init__(self, engine: Engine, clock: Clock, run_id: int, lease_seconds: float) -> None:
        self._engine, self._clock, self._run_id = engine, clock, run_id
        self._lease = lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"ledger-run-lease-{run_id}",
                                        daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _renew(self) -> None:
        """Renew until stopped; a failed renewal is logged and tried again next time."""
        while not self._stop.wait(self._lease / 3):
            try:
                with self._engine.begin() as conn:
                    runs.renew_lease(conn, self._run_id, now=self._clock.now(),
                                     lease_seconds=self._lease)
            except sa_exc.SQLAlchemyError as error:
                log.warning("scheduler could not renew a run's lease", run_id=self._run_id,
                            error=error_summary(error))


# Retrying a claim the database refused: first after 1 s, doubling up to 15 s, until the
# period ends. A period whose firing met an outage still runs once the database is back.
CLAIM_RETRY_FIRST_SECONDS = 1.0
CLAIM_RETRY_MAX_SECONDS = 15.0


def _claim_within_period(engine: Engine, clock: Clock, job: ScheduledJob, *, instance: str,
                         lease: float, stopping: threading.Event) -> int | None:
    """Claim the period that holds now, retrying storage errors until that period ends."""
    fired = clock.now()
    period_end = period_start(fired, job.period_seconds).timestamp() + job.period_seconds
    delay = CLAIM_RETRY_FIRST_SECONDS
    while True:
        try:
            # Always the period the firing belonged to, however late the retry succeeds.
            return claim_period(engine, job, instance=instance, now=fired, lease_seconds=lease)
        except sa_exc.SQLAlchemyError as error:
            left = period_end - clock.now().timestamp()
            if delay >= left:
                log.warning("scheduler could not claim a period before it ended", job=job.name,
                            error=error_summary(error))
                return None
            log.warning("scheduler could not claim a period, retrying", job=job.name,
                        error=error_summary(error), retry_in_seconds=delay)
        if stopping.wait(delay):
            return None
        delay = min(delay * 2, CLAIM_RETRY_MAX_SECONDS)


def run_once(engine: Engine, settings: Settings, clock: Clock, job: ScheduledJob, *,
             instance: str, stopping: threading.Event | None = None
             ) -> runs.RunOutcome | None:
    """Run `job` if this instance wins its current period; return the outcome or None."""
    lease = settings.lease_seconds
    run_id = _claim_within_period(engine, clock, job, instance=instance, lease=lease,
                                  stopping=stopping or threading.Event())
    if run_id is None:
        SCHEDULER_RUNS.labels(job.name, "skipped").inc()
        return None
    outcome, rows, error_text = runs.RunOutcome.OK, None, None
    started = time.perf_counter()
    try:
        with LeaseKeeper(engine, clock, run_id, lease):
            rows = int(job.func(engine, settings, clock))
    except Exception as error:
        outcome, error_text = runs.RunOutcome.ERROR, error_summary(error)
        log.error("scheduled job failed", job=job.name, error=error_text)
    try:
        with engine.begin() as conn:
            runs.finish_run(conn, run_id, outcome=outcome, now=clock.now(),
                            rows_affected=rows, error=error_text)
    except sa_exc.SQLAlchemyError as error:
        log.warning("scheduler could not record a run", job=job.name,
                    error=error_summary(error))
    SCHEDULER_RUNS.labels(job.name, outcome.value).inc()
    log.info("scheduled job ran", job=job.name, outcome=outcome.value, rows_affected=rows,
             latency_ms=round((time.perf_counter() - started) * 1000, 2))
    return outcome


def build_scheduler(services: Services, *, instance_id: str | None = None,
                    period_overrides: Mapping[str, float] | None = None,
                    period_scale: float = 1.0, background: bool = False,
                    jobs: list[ScheduledJob] | None = None,
                    stopping: threading.Event | None = None) -> Any:
    """Return a Blocking (or Background) scheduler firing every job on its period.

    Setting `stopping` ends the claim retries of firings that met an outage.
    """
    instance = instance_id or new_instance_id()
    overrides = dict(period_overrides or {})
    cls = BackgroundScheduler if background else BlockingScheduler
    scheduler = cls(timezone=UTC, executors={"default": ThreadPoolExecutor(max_workers=4)})
    for job in jobs if jobs is not None else default_jobs(services.settings):
        period = overrides.get(job.name, job.period_seconds * period_scale)
        if period <= 0:
            continue  # a period of 0 switches the job off
        job = ScheduledJob(name=job.name, period_seconds=period, func=job.func)
        first = period_start(services.clock.now(), period).timestamp() + period
        scheduler.add_job(
            run_once, IntervalTrigger(seconds=period, start_date=datetime.fromtimestamp(
                first, UTC), timezone=UTC),
            args=(services.engine, services.settings, services.clock, job),
            kwargs={"instance": instance, "stopping": stopping}, id=job.name, name=job.name,
            coalesce=True, max_instances=1, misfire_grace_time=max(1, int(period)))
    log.info("scheduler built", instance=instance, jobs=[j.id for j in scheduler.get_jobs()])
    return scheduler


def run_scheduler(services: Services, stop: threading.Event | None = None, *,
                  instance_id: str | None = None,
                  period_overrides: Mapping[str, float] | None = None,
                  period_scale: float | None = None,
                  jobs: list[ScheduledJob] | None = None) -> None:
    """Run the scheduled jobs until SIGTERM/SIGINT, or until `stop` is set.

    Periods not given come from the settings (LEDGER_SCHEDULER_PERIODS /
    _PERIOD_SCALE), so `ledger dev` honours them too.
    """
    settings = services.settings
    stopping = threading.Event()
    options: dict[str, Any] = {
        "instance_id": instance_id, "jobs": jobs, "stopping": stopping,
        "period_overrides": (settings.scheduler_periods if period_overrides is None
                             else period_overrides),
        "period_scale": (settings.scheduler_period_scale if period_scale is None
                         else period_scale)}
    if stop is not None:
        scheduler = build_scheduler(services, background=True, **options)
        scheduler.start()
        try:
            stop.wait()
        finally:
            stopping.set()
            scheduler.shutdown(wait=True)
        return
    scheduler = build_scheduler(services, **options)

    def _stop(signum: int, _frame: Any) -> None:
        log.info("scheduler stopping", signal=signum)
        stopping.set()
        with contextlib.suppress(SchedulerNotRunningError):
            scheduler.shutdown(wait=False)  # running jobs finish and record their runs

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    scheduler.start()
