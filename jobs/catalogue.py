"""The scheduled jobs and their default periods, registered with the runner by the app."""

from __future__ import annotations

from sqlalchemy import Engine

from ledger.clock import Clock
from ledger.config import Settings
from ledger.scheduling.runner import ScheduledJob

from . import credential_jobs, delivery_log, retention, rollups, sweep


def _expire_credentials(engine: Engine, _settings: Settings, clock: Clock) -> int:
    """Mark retiring credentials past their expiry expired."""
    return credential_jobs.expire_credentials(engine, clock)


def scheduled_jobs(settings: Settings) -> list[ScheduledJob]:
    """Return the ledger's scheduled jobs with their default periods."""
    return [
        ScheduledJob(name="retention", period_seconds=3600, func=retention.run),
        ScheduledJob(name="delivery_log_retention", period_seconds=600, func=delivery_log.run),
        ScheduledJob(name="sweep", period_seconds=60, func=sweep.run),
        ScheduledJob(name="rollups", period_seconds=60, func=rollups.run),
        ScheduledJob(name="credential_expiry", period_seconds=60, func=_expire_credentials),
        ScheduledJob(name="revocation_propagation",
                     period_seconds=max(5, settings.revocation_bound_seconds),
                     func=credential_jobs.check_revocation_propagation),
    ]
