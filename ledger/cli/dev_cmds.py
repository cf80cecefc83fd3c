"""`ledger dev`: web + worker + scheduler in one process, for a first look."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click
from werkzeug.serving import run_simple

from ledger.cli import ledger_cli
from ledger.cli.common import current_flask_app, services
from ledger.cli.demo_cmds import password_line, seed_demo
from ledger.cli.worker_cmds import load_handlers_or_exit
from ledger.scheduling.instances import InstanceKind, beat_interval, registered
from ledger.services import Services
from ledger.worker.handlers import Registry

ANNOUNCE_AFTER_SECONDS = 3.0


def _registered_worker(svc: Services, registry: Registry, stop: threading.Event) -> None:
    """Run a worker registered as a worker instance until `stop` is set."""
    from ledger.worker.loop import run_worker

    interval = beat_interval(svc.settings.revocation_bound_seconds)
    with registered(svc.engine, svc.clock, InstanceKind.WORKER, interval=interval,
                    handles=tuple(registry.types())) as me:
        run_worker(svc, stop=stop, worker_id=me.instance_id, handlers=registry)


def _registered_scheduler(svc: Services, stop: threading.Event) -> None:
    """Run the scheduled jobs registered as a scheduler instance until `stop` is set."""
    from ledger.scheduling.runner import run_scheduler

    interval = beat_interval(svc.settings.revocation_bound_seconds)
    with registered(svc.engine, svc.clock, InstanceKind.SCHEDULER, interval=interval) as me:
        run_scheduler(svc, stop=stop, instance_id=me.instance_id)


def _start_worker(svc: Services, registry: Registry, stop: threading.Event
                  ) -> threading.Thread:
    """Run a worker in a daemon thread until `stop` is set."""
    thread = threading.Thread(target=_registered_worker, args=(svc, registry, stop),
                              name="ledger-worker", daemon=True)
    thread.start()
    return thread


def _start_scheduler(svc: Services, stop: threading.Event) -> threading.Thread:
    """Run the scheduled jobs in a daemon thread until `stop` is set."""
    thread = threading.Thread(target=_registered_scheduler, args=(svc, stop),
                              name="ledger-scheduler", daemon=True)
    thread.start()
    return thread


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    """Stop serving on SIGTERM as on Ctrl-C, so that every instance deregisters."""
    raise KeyboardInterrupt


@ledger_cli.command("dev")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=int)
@click.option("--demo", is_flag=True,
              help="Seed the demo first; print the admin's password last, after startup.")
def dev(host: str, port: int, demo: bool) -> None:
    """Serve the dashboard and intake with a worker and the scheduler in one process."""
    svc = services(serving=True)
    registry = load_handlers_or_exit(svc)  # before anything starts: a bad source exits 2
    password = seed_demo(serving=True) if demo else None
    stop = threading.Event()
    threads = [_start_worker(svc, registry, stop), _start_scheduler(svc, stop)]
    click.echo(f"Replay Ledger on http://{host}:{port}/  (dashboard: /login, "
               f"intake: POST /hooks/<integration id>, health: /healthz)")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    if password:
        # After the startup burst of worker and scheduler log lines, so it is not buried.
        announce = threading.Timer(ANNOUNCE_AFTER_SECONDS, click.echo,
                                   args=(f"\n{password_line(password)}\n"
                                         f"open http://{host}:{port}/login\n",))
        announce.daemon = True
        announce.start()
    try:
        run_simple(host, port, current_flask_app(),
                   threaded=True, use_reloader=False)
    finally:
        stop.set()
        for thread in threads:  # each deregisters its instance on the way out
            thread.join(timeout=10)
        if svc.heartbeat is not None:
            svc.heartbeat.stop()
