"""`ledger scheduler`, `ledger purge`, `ledger capacity`: scheduled jobs and their figures."""

from __future__ import annotations

import click

from ledger.access import audit
from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.db.engine import storage_guard
from ledger.services import Services


@ledger_cli.command("scheduler")
@click.option("--instance-id", default=None, help="Name of this instance in the runs table.")
def scheduler_command(instance_id: str | None) -> None:
    """Run the scheduled jobs until stopped (any number of instances; each job runs once
    per period across all of them)."""
    from ledger.scheduling.instances import InstanceKind, beat_interval, registered
    from ledger.scheduling.runner import run_scheduler

    svc = services()  # periods: LEDGER_SCHEDULER_PERIODS / _PERIOD_SCALE, read at start
    click.echo("scheduler running; stop with Ctrl-C or SIGTERM", err=True)
    interval = beat_interval(svc.settings.revocation_bound_seconds)
    with registered(svc.engine, svc.clock, InstanceKind.SCHEDULER, interval=interval) as me:
        run_scheduler(svc, instance_id=instance_id or me.instance_id)


@ledger_cli.command("purge")
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option("--preview", is_flag=True,
              help="Show what the next scheduled purge will do, per scope; delete nothing.")
@click.option("--batch-size", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Receipts deleted per transaction.")
@json_option
@handles_ledger_errors
def purge_command(dry_run: bool, preview: bool, batch_size: int, as_json: bool) -> None:
    """Expire finished receipts older than the retention and drop reviewed failed payloads."""
    from ledger.jobs.retention import purge

    svc = services()
    if preview:
        _purge_preview(svc, as_json)
        return
    with storage_guard():
        result = purge(svc.engine, svc.settings, svc.clock, dry_run=dry_run,
                       batch_size=batch_size, actor=audit.Actor.cli())
    verb = "would expire" if dry_run else "expired"
    emit(as_json, result.to_json(),
         text=f"{verb} {result.expired_receipts} receipts; "
              f"{'would drop' if dry_run else 'dropped'} {result.payloads_dropped} payloads")


def _purge_preview(svc: Services, as_json: bool) -> None:
    """Print what the next scheduled purge will do (every expired receipt counted)."""
    from ledger.jobs.retention_preview import preview

    with storage_guard(), svc.engine.connect() as conn:
        result = preview(conn, svc.settings, svc.clock.now())
    when = result.next_run_at.isoformat() if result.next_run_at else "never (job off)"
    lines = [f"next run: {when}", f"would expire {result.expired_receipts} receipts; "
             f"would drop {result.payloads_dropped} payloads and "
             f"{result.conflict_bodies_dropped} conflict bodies"]
    lines += [f"  {item['scope']}: {item['expired_receipts']}" for item in result.by_scope]
    emit(as_json, result.to_json(), text="\n".join(lines))


@ledger_cli.command("capacity")
@click.option("--replicas", type=click.IntRange(min=1), default=None,
              help="Copies of the database (primary + standbys); multiplies the projection.")
@json_option
@handles_ledger_errors
def capacity_command(replicas: int | None, as_json: bool) -> None:
    """Measure bytes per receipt and project events/day x retention days x bytes."""
    from ledger.reads.capacity import describe, measure

    svc = services()
    with storage_guard():
        figures = measure(svc.engine, svc.settings, replicas=replicas or 1,
                          now=svc.clock.now())
    if replicas is not None:
        figures["replicas"] = replicas
    emit(as_json, figures, text=describe(figures))
