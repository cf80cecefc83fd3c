"""The long-lived objects one process needs, built once from Settings."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from ledger.access.audit import keyed, load_audit_key
from ledger.access.secrets_box import MasterKeyError, SecretBox, load_box
from ledger.clock import Clock, SystemClock
from ledger.config import Settings, SettingsError, log_hash_key
from ledger.db.engine import make_engine, snapshot_engine
from ledger.db.replica import ReplicaReads
from ledger.intake.credential_view import CredentialView, ttl_for_bound
from ledger.intake.delivery_log import DeliveryLog
from ledger.intake.pipeline import Intake
from ledger.logs import use_event_ref_key
from ledger.scheduling.instances import InstanceHeartbeat, beat_interval


@dataclass(slots=True, kw_only=True)
class Services:
    """Settings, engine, secret box, clock, credential view and intake of one process."""

    settings: Settings
    engine: Engine  # carries the audit key (ledger.access.audit.keyed)
    box: SecretBox
    clock: Clock
    view: CredentialView
    intake: Intake
    delivery_log: DeliveryLog
    reads: ReplicaReads  # the dashboard's and the API's reads: the replica when configured
    heartbeat: InstanceHeartbeat | None = None

    def close(self) -> None:
        """Stop the heartbeat and write the delivery log's buffer; release the pool."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.delivery_log.close()
        self.intake.close()
        self.engine.dispose()
        if self.reads.replica is not None:
            self.reads.replica.dispose()
        if self.reads.local is not self.engine:
            self.reads.local.dispose()


def ledger_engine(settings: Settings, **overrides: object) -> Engine:
    """Return an engine for `settings` whose transactions chain audit rows with the audit key."""
    return keyed(make_engine(settings, **overrides), load_audit_key(settings))


def build_services(settings: Settings, clock: Clock | None = None,
                   engine: Engine | None = None) -> Services:
    """Wire the process's services; opens no connection yet."""
    clock = clock or SystemClock()
    try:
        box = load_box(settings.master_key, settings.var_dir, production=settings.production)
    except MasterKeyError as error:  # a setting's fault: stop with its name, no traceback
        raise SettingsError("LEDGER_MASTER_KEY", str(error)) from None
    use_event_ref_key(log_hash_key(settings))
    engine = (keyed(engine, load_audit_key(settings)) if engine is not None
              else ledger_engine(settings))
    bound = settings.revocation_bound_seconds
    # The heartbeat starts only when the process serves HTTP (app.py), never for a CLI run.
    heartbeat = InstanceHeartbeat(engine, clock, interval=beat_interval(bound))
    view = CredentialView(engine, box, clock, ttl_for_bound(bound),
                          on_refresh=heartbeat.on_refresh)
    heartbeat.attach(view)
    replica = (make_engine(settings.with_(database_url=settings.read_database_url))
               if settings.read_database_url else None)
    # SQLite: the reads run on snapshots that take no writer turn (its audit key too, for
    # the chain's verification).
    snapshot = snapshot_engine(engine.url.render_as_string(hide_password=False))
    reads = ReplicaReads(engine, replica, max_lag_seconds=settings.read_max_lag_seconds,
                         snapshot=snapshot if snapshot is None
                         else keyed(snapshot, load_audit_key(settings)))
    return Services(settings=settings, engine=engine, box=box, clock=clock, view=view,
                    reads=reads,
                    intake=Intake(engine, view, clock, max_json_depth=settings.max_json_depth,
                                  claim_connections=settings.claim_connections),
                    delivery_log=DeliveryLog(
                        engine, clock, enabled=settings.delivery_log,
                        refusals_per_minute=settings.delivery_log_refusals_per_minute),
                    heartbeat=heartbeat)
