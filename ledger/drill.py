"""The leaked-key drill (seed, last section), end to end over real HTTP.

Two fresh sandbox accounts each get a credential and deliver distinct events
plus one duplicate. A's credential is revoked: within the declared propagation
bound A's requests get 401 and A's ledger does not move, while B keeps
accepting. A is rotated to a replacement on the same scope: replaying an
accepted event with the new key answers the original receipt's outcome. Last,
in an isolated sandbox (a throwaway SQLite ledger with a clock moved past the
retention boundary) an expired event is replayed and runs again, the seed's
documented consequence. The sandbox integrations are deleted afterwards; their
audit rows stay (the audit log is append-only and keeps the record).
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.fernet import Fernet
from sqlalchemy import Connection, delete, func, select, update

from ledger import audit
from ledger.clock import FixedClock, unix
from ledger.credentials import revoke_credential, rotate_credential
from ledger.domain import JobStatus, ReceiptState
from ledger.instances import live_instances
from ledger.integrations import create_integration, get_integration_by_id
from ledger.schema import (
    attempts,
    conflicts,
    credentials,
    demo_balances,
    hourly_series,
    integrations,
    jobs,
    receipts,
    scope_counts,
    unsigned_bodies,
)
from ledger.signatures import get_profile

if TYPE_CHECKING:
    from ledger.services import Services

PROFILE = "standard-webhooks"
EVENT_TYPE = "drill.check"
POLL_SECONDS = 0.2
HTTP_TIMEOUT_SECONDS = 10.0
# Tables keyed by scope id that a sandbox integration can leave rows in.
SCOPED_TABLES = (receipts, jobs, attempts, conflicts, unsigned_bodies, demo_balances,
                 scope_counts, hourly_series)


@dataclass(frozen=True, slots=True, kw_only=True)
class DrillStep:
    """One checked step of the drill."""

    name: str
    passed: bool
    detail: str


@dataclass(slots=True, kw_only=True)
class DrillReport:
    """Every step run, in order; the drill passes when all of them pass."""

    steps: list[DrillStep] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Tell whether every step passed."""
        return bool(self.steps) and all(s.passed for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `ledger drill --json` object."""
        return {"passed": self.passed,
                "steps": [{"name": s.name, "passed": s.passed, "detail": s.detail}
                          for s in self.steps]}


class StepFailed(Exception):
    """A step's check did not hold; the message is the step's detail."""


@dataclass(slots=True, kw_only=True)
class SandboxSender:
    """A sandbox integration and the secret it currently signs with."""

    integration_id: int
    public_id: str
    scope: str
    key_id: str
    secret: str


def _body(event_id: str) -> bytes:
    """Return a small standard-webhooks body (no business handler: type drill.check)."""
    return json.dumps({"type": EVENT_TYPE, "data": {"drill": event_id}},
                      separators=(",", ":")).encode()


def post_event(base_url: str, sender: SandboxSender, event_id: str, *, now: datetime,
               secret: str | None = None) -> tuple[int, dict[str, Any]]:
    """Sign and POST one delivery like the sender would; return (status, JSON answer)."""
    body = _body(event_id)
    headers = get_profile(PROFILE).sign(secret or sender.secret, body, event_id=event_id,
                                        event_type=EVENT_TYPE, timestamp=unix(now))
    headers["Content-Type"] = "application/json"
    request = urllib.request.Request(f"{base_url.rstrip('/')}/hooks/{sender.public_id}",
                                     data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        with error:
            raw = error.read()
        try:
            return error.code, json.loads(raw or b"{}")
        except ValueError:
            return error.code, {}


def scope_snapshot(conn: Connection, scope_id: int) -> dict[str, Any]:
    """Return what the ledger holds for one scope (counts and receipt states)."""
    rows = conn.execute(
        select(receipts.c.event_id, receipts.c.state, receipts.c.accepted_at)
        .where(receipts.c.scope_id == scope_id).order_by(receipts.c.event_id)
    ).all()
    counts = {name: int(conn.execute(select(func.count()).select_from(table)
                                     .where(table.c.scope_id == scope_id)).scalar_one())
              for name, table in (("jobs", jobs), ("conflicts", conflicts))}
    return {"receipts": [(r.event_id, r.state, r.accepted_at.isoformat()) for r in rows],
            **counts}


def _expect(condition: bool, detail: str) -> None:
    """Fail the step with `detail` unless `condition` holds."""
    if not condition:
        raise StepFailed(detail)


class Drill:
    """Runs the drill's steps against one server and one database."""

    def __init__(self, base_url: str, services: Services, actor: audit.Actor) -> None:
        self.base_url = base_url
        self.svc = services
        self.actor = actor
        self.bound = services.settings.revocation_bound_seconds
        self.tag = secrets.token_hex(4)
        self.a: SandboxSender | None = None
        self.b: SandboxSender | None = None

    def now(self) -> datetime:
        """Return the drill's clock reading (the server signs against its own)."""
        return self.svc.clock.now()

    def post(self, sender: SandboxSender, event_id: str,
             secret: str | None = None) -> tuple[int, dict[str, Any]]:
        """Deliver one event to the server under test."""
        return post_event(self.base_url, sender, event_id, now=self.now(), secret=secret)

    def snapshot(self, sender: SandboxSender) -> dict[str, Any]:
        """Return the ledger's content for the sender's scope."""
        with self.svc.engine.connect() as conn:
            return scope_snapshot(conn, sender.integration_id)

    def create_accounts(self) -> str:
        """Create two sandbox accounts, each with one integration and credential."""
        senders = []
        for suffix in ("a", "b"):
            with self.svc.engine.begin() as conn:
                integration, cred = create_integration(
                    conn, self.svc.box, self.actor, account=f"drill-{self.tag}-{suffix}",
                    name="leaked-key", profile=PROFILE, now=self.now(), sandbox=True)
            senders.append(SandboxSender(
                integration_id=integration.id, public_id=integration.public_id,
                scope=integration.scope, key_id=cred.key_id, secret=cred.secret))
        self.a, self.b = senders
        return f"sandbox scopes {self.a.scope} and {self.b.scope}"

    def deliver_with_duplicates(self) -> str:
        """Each account delivers two distinct events plus one duplicate."""
        for sender in (self.a, self.b):
            assert sender is not None
            for event_id in ("evt-1", "evt-2"):
                status, answer = self.post(sender, event_id)
                _expect(status == 202 and answer.get("status") == "accepted",
                        f"{sender.scope} {event_id}: expected 202 accepted, got {status} "
                        f"{answer.get('status') or answer.get('error')}")
            status, answer = self.post(sender, "evt-1")
            _expect(answer.get("status") == "duplicate",
                    f"{sender.scope} duplicate evt-1: expected duplicate, got {status}")
            held = len(self.snapshot(sender)["receipts"])
            _expect(held == 2, f"{sender.scope}: expected 2 receipts, found {held} "
                               "(is the server on this DATABASE_URL?)")
        return "2 accepted + 1 duplicate per account; 2 receipts per scope"

    def revoke_a(self) -> str:
        """Revoke A's key; every instance must refuse it within the declared bound."""
        assert self.a is not None
        with self.svc.engine.begin() as conn:
            revoked = revoke_credential(conn, self.actor, self.a.key_id,
                                        reason="leaked-key drill", now=self.now())
        started = time.monotonic()
        refused_after = self._poll_until(lambda: self.post(self.a, "evt-1")[0] == 401)
        _expect(refused_after is not None and refused_after <= self.bound,
                f"revoked key still accepted after {time.monotonic() - started:.1f} s "
                f"(bound {self.bound} s)")
        self._await_instances(revoked.revoked_at, started)  # type: ignore[arg-type]
        return (f"401 for the revoked key after {refused_after:.1f} s "
                f"(declared bound {self.bound} s)")

    def _poll_until(self, check: Callable[[], bool]) -> float | None:
        """Poll `check` until true or bound + 2 s; return the seconds it took, or None."""
        started = time.monotonic()
        deadline = started + self.bound + 2
        while time.monotonic() < deadline:
            sent = time.monotonic() - started  # when the deciding request left, not returned
            if check():
                return sent
            time.sleep(POLL_SECONDS)
        return None

    def _await_instances(self, revoked_at: datetime, started: float) -> None:
        """Wait until every live web instance reports a view newer than the revocation.

        One 401 proves only that the process which answered it refreshed; the
        instances table shows the others. The wait never exceeds the bound,
        after which no instance may hold the key by construction.
        """
        while time.monotonic() < started + self.bound:
            with self.svc.engine.connect() as conn:
                live = live_instances(conn, now=self.now(), within_seconds=self.bound,
                                      kind="web")
            if all(i.credentials_refreshed_at is not None
                   and i.credentials_refreshed_at >= revoked_at for i in live):
                return
            time.sleep(POLL_SECONDS)

    def revoked_changes_nothing(self) -> str:
        """A's revoked key gets 401 for new and duplicate events, and A's ledger stays put."""
        assert self.a is not None
        before = self.snapshot(self.a)
        answers = [self.post(self.a, event_id)[0] for event_id in ("evt-3", "evt-2")]
        _expect(answers == [401, 401], f"revoked key answered {answers}, expected 401s")
        _expect(self.snapshot(self.a) == before, "A's ledger changed under a revoked key")
        return "new and duplicate deliveries under the revoked key: 401, ledger unchanged"

    def b_keeps_accepting(self) -> str:
        """B's credential is untouched by A's revocation."""
        assert self.b is not None
        status, answer = self.post(self.b, "evt-3")
        _expect(status == 202 and answer.get("status") == "accepted",
                f"B's new event answered {status} {answer.get('status') or answer.get('error')}")
        return "B accepted a new event after A's revocation"

    def rotate_a(self) -> str:
        """Rotate A on the same scope; a replay under the new key gets the original outcome."""
        assert self.a is not None
        before = self.snapshot(self.a)
        with self.svc.engine.begin() as conn:
            integration = get_integration_by_id(conn, self.a.integration_id)
            rotation = rotate_credential(conn, self.svc.box, self.actor, integration,
                                         now=self.now(), overlap_seconds=0)
        self.a.key_id, self.a.secret = rotation.key_id, rotation.secret
        answer: dict[str, Any] = {}

        def replay() -> bool:
            nonlocal answer
            status, answer = self.post(self.a, "evt-1")
            return status != 401

        took = self._poll_until(replay)
        _expect(took is not None, f"new key not accepted within {self.bound} s")
        after = self.snapshot(self.a)
        states = {ReceiptState.from_code(s).value for e, s, _ in before["receipts"] + after[
            "receipts"] if e == "evt-1"}
        _expect(answer.get("status") == "duplicate" and answer.get("state") in states,
                f"replay under the new key answered {answer}, receipt states {sorted(states)}")
        _expect(len(after["receipts"]) == len(before["receipts"]) and after["jobs"] <= before[
            "jobs"], "the replay under the new key created new work")
        return (f"replay under {rotation.key_id} answered duplicate/{answer['state']} "
                f"(the original receipt) after {took:.1f} s; one receipt, same scope")

    def run(self, report: DrillReport) -> None:
        """Run every step in order, stopping at the first that fails; always clean up."""
        steps = (("sandbox_accounts", self.create_accounts),
                 ("distinct_events_and_duplicates", self.deliver_with_duplicates),
                 ("revoked_key_refused_within_bound", self.revoke_a),
                 ("revoked_key_changes_nothing", self.revoked_changes_nothing),
                 ("other_account_keeps_accepting", self.b_keeps_accepting),
                 ("rotated_key_gets_original_outcome", self.rotate_a),
                 ("replay_after_retention_runs_again",
                  lambda: retention_replay(self.svc.settings.retention_seconds)))
        try:
            for name, step in steps:
                if not _run_step(report, name, step):
                    break
        finally:
            _run_step(report, "cleanup", self.cleanup)

    def cleanup(self) -> str:
        """Delete the sandbox integrations' rows (never audit rows)."""
        ids = [s.integration_id for s in (self.a, self.b) if s is not None]
        with self.svc.engine.begin() as conn:
            removed = delete_sandbox_integrations(conn, ids)
            audit.record(conn, self.actor, "drill.cleanup", f"drill-{self.tag}",
                         at=self.now(), detail={"integrations": len(ids), **removed})
        return f"removed {removed.get('integrations', 0)} sandbox integrations and their rows"


def _run_step(report: DrillReport, name: str, step: Callable[[], str]) -> bool:
    """Run one step, record its outcome, and tell whether it passed."""
    try:
        detail = step()
    except StepFailed as failure:
        report.steps.append(DrillStep(name=name, passed=False, detail=str(failure)))
        return False
    except Exception as error:  # report, never crash: the report is the product here
        report.steps.append(DrillStep(name=name, passed=False,
                                      detail=f"{type(error).__name__}: {error}"))
        return False
    report.steps.append(DrillStep(name=name, passed=True, detail=detail))
    return True


def delete_sandbox_integrations(conn: Connection, integration_ids: list[int]) -> dict[str, int]:
    """Delete sandbox integrations and every row of their scopes; real ones are never touched."""
    ids = list(conn.execute(
        select(integrations.c.id).where(integrations.c.id.in_(integration_ids),
                                        integrations.c.sandbox.is_(True))
    ).scalars())
    removed: dict[str, int] = {}
    if not ids:
        return removed
    for table in SCOPED_TABLES:
        removed[table.name] = conn.execute(
            delete(table).where(table.c.scope_id.in_(ids))).rowcount
    removed["credentials"] = conn.execute(
        delete(credentials).where(credentials.c.integration_id.in_(ids))).rowcount
    removed["integrations"] = conn.execute(
        delete(integrations).where(integrations.c.id.in_(ids))).rowcount
    return removed


def run_drill(base_url: str, services: Services, *,
              actor: audit.Actor | None = None) -> DrillReport:
    """Run the leaked-key drill against the server at `base_url` (same database)."""
    report = DrillReport()
    Drill(base_url, services, actor or audit.Actor.cli()).run(report)
    return report


# --- the isolated retention sandbox -------------------------------------------------------


def retention_replay(retention_seconds: int) -> str:
    """In a throwaway ledger, replay an event after its receipt expired: it runs again."""
    from ledger.config import Settings
    from ledger.db import upgrade
    from ledger.services import build_services

    with tempfile.TemporaryDirectory(prefix="ledger-drill-") as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'sandbox.sqlite3'}",
                            var_dir=Path(tmp), master_key=Fernet.generate_key().decode(),
                            retention_seconds=retention_seconds)
        clock = FixedClock()
        svc = build_services(settings, clock=clock)
        try:
            upgrade(svc.engine)
            return _replay_across_retention(svc, clock)
        finally:
            svc.close()


def _sandbox_accept(svc: Services, sender: SandboxSender, event_id: str) -> dict[str, Any]:
    """Deliver through the sandbox's real intake pipeline, signed at the sandbox's time."""
    body = _body(event_id)
    headers = get_profile(PROFILE).sign(sender.secret, body, event_id=event_id,
                                        event_type=EVENT_TYPE, timestamp=unix(svc.clock.now()))
    header_map = {k.lower(): [v] for k, v in headers.items()}
    answer = svc.intake.accept(svc.intake.lookup(sender.public_id), header_map, body)
    return answer.body


def _replay_across_retention(svc: Services, clock: FixedClock) -> str:
    """Accept, complete, replay (duplicate), pass retention, purge, replay (new work)."""
    from jobs.retention import purge

    with svc.engine.begin() as conn:
        integration, cred = create_integration(
            conn, svc.box, audit.Actor(name="drill", role="sandbox"), account="sandbox",
            name="retention", profile=PROFILE, now=clock.now(), sandbox=True)
    sender = SandboxSender(integration_id=integration.id, public_id=integration.public_id,
                           scope=integration.scope, key_id=cred.key_id, secret=cred.secret)
    _expect(_sandbox_accept(svc, sender, "evt-old")["status"] == "accepted",
            "sandbox: first delivery not accepted")
    first = _complete_like_a_worker(svc, integration.id, "evt-old")
    inside = _sandbox_accept(svc, sender, "evt-old")
    _expect(inside["status"] == "duplicate", f"sandbox: replay inside retention got {inside}")
    clock.advance(svc.settings.retention_seconds + 1)
    purged = purge(svc.engine, svc.settings, clock).expired_receipts
    again = _sandbox_accept(svc, sender, "evt-old")
    with svc.engine.connect() as conn:
        fresh = conn.execute(select(receipts.c.accepted_at, receipts.c.state).where(
            receipts.c.scope_id == integration.id, receipts.c.event_id == "evt-old")).first()
    _expect(again["status"] == "accepted" and fresh is not None and fresh.accepted_at > first,
            f"sandbox: replay after retention answered {again} (purged {purged})")
    return (f"inside retention: duplicate; after {svc.settings.retention_seconds} s and a purge "
            f"({purged} expired): accepted again as a fresh pending receipt")


def _complete_like_a_worker(svc: Services, scope_id: int, event_id: str) -> datetime:
    """Finish the sandbox's one job the way a worker commits it; return when it was accepted.

    TODO(integrator): run the real worker (`ledger worker --burst` equivalent) here
    once its in-process entry point is settled; the end state is the same.
    """
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        conn.execute(update(receipts).where(receipts.c.scope_id == scope_id,
                                            receipts.c.event_id == event_id)
                     .values(state=ReceiptState.COMPLETE.code, completed_at=now,
                             attempts=1, result_ref="ignored:no-handler"))
        conn.execute(delete(jobs).where(jobs.c.scope_id == scope_id,
                                        jobs.c.event_id == event_id,
                                        jobs.c.status == JobStatus.QUEUED.value))
        return conn.execute(select(receipts.c.accepted_at).where(
            receipts.c.scope_id == scope_id, receipts.c.event_id == event_id)).scalar_one()
