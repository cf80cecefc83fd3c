"""`ledger worker`: claim and run due jobs until stopped (or, with --burst, until none is due)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import click

from ledger.cli import ledger_cli
from ledger.cli.common import services
from ledger.config import MAX_WORKER_BATCH
from ledger.errors import error_summary
from ledger.logs import get_logger
from ledger.scheduling.instances import InstanceKind, beat_interval, registered
from ledger.services import Services
from ledger.worker.destinations import handler_conflicts
from ledger.worker.handlers import RegistrationError, Registry, load_registry
from ledger.worker.loop import is_storage_error, run_worker

log = get_logger("ledger.worker")


def _install_stop_signals(stop: threading.Event) -> dict[int, Any]:
    """Make SIGTERM/SIGINT finish the current job and exit; a second SIGINT interrupts."""
    previous: dict[int, Any] = {}

    def graceful(signum: int, _frame: FrameType | None) -> None:
        log.info("worker.stopping", signal=signal.Signals(signum).name)
        stop.set()
        # A second Ctrl-C means "now": restore the default KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, graceful)
    return previous


def load_handlers_or_exit(svc: Services) -> Registry:
    """Return the configured handlers; a bad source ends the command with exit 2."""
    try:
        return load_registry(svc.settings)
    except RegistrationError as error:
        click.echo(f"Error: {error}", err=True)
        raise SystemExit(2) from None


def refuse_destination_conflicts(svc: Services, registry: Registry) -> None:
    """End the command with exit 2 when a destination takes a type a handler here takes.

    `destination create` refuses such a type, but a worker may load a new handler
    module later: one receipt completes with one result_ref, never two.
    """
    try:
        with svc.engine.connect() as conn:
            conflicts = handler_conflicts(conn, registry)
    except Exception as error:
        if not is_storage_error(error):
            raise
        # A worker outlives a database outage, and so does its start: each job still
        # goes to its Python handler first.
        log.warning("worker.destination_check_skipped", error=error_summary(error))
        return
    if conflicts:
        click.echo("Error: " + "; ".join(conflicts) +
                   " (a type has either a Python handler or a destination)", err=True)
        svc.close()
        raise SystemExit(2)


@ledger_cli.command("worker")
@click.option("--burst", is_flag=True, help="Exit 0 once no job is due.")
@click.option("--concurrency", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Worker loops (threads) in this process.")
@click.option("--batch", type=click.IntRange(1, MAX_WORKER_BATCH), default=None,
              help="Jobs claimed and committed together (default LEDGER_WORKER_BATCH).")
def worker(burst: bool, concurrency: int, batch: int | None) -> None:
    """Claim due jobs and run their handlers; SIGTERM/SIGINT finish the current job first.

    Handlers come from the modules named in LEDGER_HANDLER_MODULES (comma-separated
    import paths; a handler declared by any module they import counts too), from the
    entry points of the group `replay_ledger.handlers` of installed distributions,
    and from the demo when LEDGER_DEMO_HANDLERS=1. A module that cannot be imported
    or registers nothing, or two handlers for one event type, stop the worker at
    start (exit 2), and so does a handler for a type a destination takes. The worker
    logs and publishes the event types it handles; an event of a type it lacks is left
    to a live worker that has the handler, or sent to the destination that takes it, and
    completes as ignored:no-handler only when neither exists.
    """
    svc = services()
    registry = load_handlers_or_exit(svc)
    refuse_destination_conflicts(svc, registry)
    stop = threading.Event()
    previous = _install_stop_signals(stop)
    interval = beat_interval(svc.settings.revocation_bound_seconds)
    try:
        # Registered while it runs, under the id its leases carry (leased_by).
        with registered(svc.engine, svc.clock, InstanceKind.WORKER, interval=interval,
                        handles=tuple(registry.types())) as me:
            processed = run_worker(svc, burst=burst, concurrency=concurrency, stop=stop,
                                   worker_id=me.instance_id, batch_size=batch,
                                   handlers=registry)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    click.echo(f"processed {processed} job(s)", err=True)
