"""The instance registry: every process reports that it lives (web ones: how fresh their keys are).

A web process registers itself on its first request, a worker or a scheduler when
it starts (`registered`), and then a daemon thread
beats every quarter of the revocation bound: it drops the credential view if
the view outlived its ttl (so an idle process holds no stale keys either) and
records `heartbeat_at` (alive) and `credentials_refreshed_at` (the moment its
view was last emptied). `jobs.credential_jobs.check_revocation_propagation`
compares the latter with the newest revocation (web instances only: they are
the ones that verify signatures). An instance whose heartbeat is older than the
revocation bound is dead: the overview greys it out and counts only the live
ones. Nothing here runs on a delivery's path: a failed heartbeat is logged and
retried, never raised. Short-lived CLI processes never register.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import Connection, Engine, delete, select

from ledger.clock import Clock
from ledger.db.engine import conflict_insert
from ledger.db.schema import instances
from ledger.intake.credential_view import CredentialView
from ledger.logs import get_logger

log = get_logger("ledger.instances")
MIN_BEAT_SECONDS = 0.25


class InstanceKind(StrEnum):
    """What a registered process does; the stored `instances.kind`."""

    WEB = "web"  # serves HTTP and verifies signatures
    WORKER = "worker"
    SCHEDULER = "scheduler"


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """One registered process."""

    id: str
    kind: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    credentials_refreshed_at: datetime | None
    handles: tuple[str, ...] | None = None  # a worker's event types


def new_instance_id() -> str:
    """Return `hostname:pid:random`: unique even when a pid is reused, names the process.

    The one id format of every process kind (web, worker, scheduler): a drill or an
    operator reads the host and pid to find the process.
    """
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def beat(conn: Connection, instance_id: str, *, kind: str, now: datetime,
         refreshed_at: datetime | None, handles: tuple[str, ...] | None = None) -> None:
    """Register the instance or record its heartbeat (an upsert)."""
    hostname, pid = instance_id.split(":")[0], int(instance_id.split(":")[1])
    stmt = conflict_insert(conn, instances).values(
        id=instance_id, kind=kind, hostname=hostname, pid=pid, started_at=now,
        heartbeat_at=now, credentials_refreshed_at=refreshed_at,
        handles=None if handles is None else json.dumps(sorted(handles)))
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["id"],
        set_={"heartbeat_at": now, "credentials_refreshed_at": refreshed_at}))


def remove_instance(conn: Connection, instance_id: str) -> None:
    """Forget an instance that stops cleanly."""
    conn.execute(delete(instances).where(instances.c.id == instance_id))


def prune_instances(conn: Connection, *, silent_since: datetime) -> int:
    """Forget instances whose last heartbeat is older than `silent_since` (crashed ones)."""
    return conn.execute(delete(instances).where(instances.c.heartbeat_at < silent_since)).rowcount


def live_instances(conn: Connection, *, now: datetime, within_seconds: float,
                   kind: str | None = None) -> list[Instance]:
    """Return the instances whose heartbeat is at most `within_seconds` old."""
    query = select(instances).where(
        instances.c.heartbeat_at >= now - timedelta(seconds=within_seconds))
    if kind is not None:
        query = query.where(instances.c.kind == kind)
    rows = conn.execute(query.order_by(instances.c.id)).all()
    return [Instance(id=r.id, kind=r.kind, hostname=r.hostname, pid=r.pid,
                     started_at=r.started_at, heartbeat_at=r.heartbeat_at,
                     credentials_refreshed_at=r.credentials_refreshed_at,
                     handles=handled_types(r.handles)) for r in rows]


def handled_types(stored: str | None) -> tuple[str, ...] | None:
    """Return the event types of a stored `handles` (None: not a worker, or unreadable)."""
    try:
        types = json.loads(stored) if stored else None
    except ValueError:
        return None
    return tuple(str(t) for t in types) if isinstance(types, list) else None


def live_handled_types(conn: Connection, *, now: datetime, within_seconds: float) -> set[str]:
    """Return the event types some live worker instance has a handler for."""
    rows = conn.execute(select(instances.c.handles).where(
        instances.c.kind == InstanceKind.WORKER.value,
        instances.c.heartbeat_at >= now - timedelta(seconds=within_seconds))).all()
    return {t for (stored,) in rows for t in (handled_types(stored) or ())}


def beat_interval(bound_seconds: float) -> float:
    """Beat four times per bound: twice per view ttl."""
    return max(bound_seconds / 4, MIN_BEAT_SECONDS)


class InstanceHeartbeat:
    """Registers this process and keeps its instance row fresh from a daemon thread."""

    def __init__(self, engine: Engine, clock: Clock, *, interval: float,
                 kind: str = InstanceKind.WEB, handles: tuple[str, ...] | None = None) -> None:
        self._engine = engine
        self._handles = handles
        self._clock = clock
        self._interval = interval
        self._kind = kind
        self._view: CredentialView | None = None
        self._pid: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._disabled = False
        self.instance_id: str | None = None

    def disable(self) -> None:
        """Never register this process (a short-lived CLI command that may serve a request)."""
        self._disabled = True

    def attach(self, view: CredentialView) -> None:
        """Name the credential view whose freshness this heartbeat reports."""
        self._view = view

    def on_refresh(self, _now: datetime) -> None:
        """Called by the view when it drops its cache: report it soon, off the request path."""
        if threading.current_thread() is not self._thread:  # our own drop is reported anyway
            self._wake.set()

    def ensure_started(self) -> None:
        """Start beating in this process (idempotent; restarts after a fork)."""
        if self._pid == os.getpid() or self._stop.is_set() or self._disabled:
            return
        with self._start_lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self.instance_id = new_instance_id()
            self._thread = threading.Thread(target=self._run, name="ledger-heartbeat",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the instance row (best effort)."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is None or self._pid != os.getpid():
            return
        thread.join(timeout=5)
        try:
            with self._engine.begin() as conn:
                remove_instance(conn, self.instance_id or "")
        except Exception as error:  # a stopping process must not fail on this
            log.warning("instance.remove_failed", instance=self.instance_id,
                        error=type(error).__name__)

    def beat_once(self) -> None:
        """Drop a stale view and record the heartbeat once."""
        refreshed_at = None
        if self._view is not None:
            self._view.drop_if_stale()
            refreshed_at = self._view.refreshed_at
        with self._engine.begin() as conn:
            beat(conn, self.instance_id or "", kind=self._kind, now=self._clock.now(),
                 refreshed_at=refreshed_at, handles=self._handles)

    def _run(self) -> None:
        """Beat until stopped; a failed beat is logged and tried again next time."""
        while True:
            self._wake.clear()  # before the stop check, so that stop() always wakes us
            if self._stop.is_set():
                return
            try:
                self.beat_once()
            except Exception as error:  # the database may be briefly away; keep beating
                log.warning("instance.heartbeat_failed", instance=self.instance_id,
                            error=type(error).__name__)
            self._wake.wait(self._interval)


@contextmanager
def registered(engine: Engine, clock: Clock, kind: InstanceKind, *, interval: float,
               handles: tuple[str, ...] | None = None) -> Iterator[InstanceHeartbeat]:
    """Register a worker or scheduler for the duration of the block; deregister on exit.

    The first beat is written before the block starts, so the overview sees the
    process at once; the instance id names the process in leases and runs too.
    A worker publishes the event types it `handles`.
    """
    heartbeat = InstanceHeartbeat(engine, clock, interval=interval, kind=kind, handles=handles)
    heartbeat.ensure_started()
    try:
        heartbeat.beat_once()
    except Exception as error:  # the thread keeps trying; the process still starts
        log.warning("instance.heartbeat_failed", instance=heartbeat.instance_id,
                    error=type(error).__name__)
    try:
        yield heartbeat
    finally:
        heartbeat.stop()
