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

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, func, select

from ledger.access import audit
from ledger.access.credentials import revoke_credential, rotate_credential
from ledger.access.integrations import create_integration, get_integration_by_id
from ledger.db.schema import (
    attempts,
    conflicts,
    credentials,
    demo_balances,
    hourly_latency,
    hourly_refusals,
    hourly_series,
    integrations,
    jobs,
    receipts,
    scope_counts,
    scope_totals,
    sender_tokens,
    unsigned_bodies,
)
from ledger.domain import ReceiptState
from ledger.drill.profiles import ProfileDrill, post_signed
from ledger.drill.sandbox import (
    PROFILE,
    SandboxSender,
    StepFailed,
    event_body,
    expect,
    retention_replay,
    sign,
)
from ledger.jobs.rollup_series import retotal
from ledger.scheduling.instances import live_instances

if TYPE_CHECKING:
    from ledger.services import Services

POLL_SECONDS = 0.2
# Tables keyed by scope id that a sandbox integration can leave rows in.
SCOPED_TABLES = (receipts, jobs, attempts, conflicts, unsigned_bodies, sender_tokens,
                 demo_balances, scope_counts, scope_totals, hourly_series, hourly_refusals,
                 hourly_latency)


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


def post_event(base_url: str, sender: SandboxSender, event_id: str, *, now: datetime,
               secret: str | None = None) -> tuple[int, dict[str, Any]]:
    """Sign and POST one delivery like the sender would; return (status, JSON answer)."""
    body = event_body(event_id)
    headers = sign(secret or sender.secret, body, event_id, now)
    return post_signed(base_url, sender.public_id, body, headers)


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
        self.profiles = ProfileDrill(base_url, services, actor, f"drill-{self.tag}-p")

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
                expect(status == 202 and answer.get("status") == "accepted",
                       f"{sender.scope} {event_id}: expected 202 accepted, got {status} "
                       f"{answer.get('status') or answer.get('error')}")
            status, answer = self.post(sender, "evt-1")
            expect(answer.get("status") == "duplicate",
                   f"{sender.scope} duplicate evt-1: expected duplicate, got {status}")
            held = len(self.snapshot(sender)["receipts"])
            expect(held == 2, f"{sender.scope}: expected 2 receipts, found {held} "
                               "(is the server on this DATABASE_URL?)")
        return "2 accepted + 1 duplicate per account; 2 receipts per scope"

    def revoke_a(self) -> str:
        """Revoke A's key; every instance must refuse it within the declared bound."""
        sender = self.a
        assert sender is not None
        with self.svc.engine.begin() as conn:
            revoked = revoke_credential(conn, self.actor, sender.key_id,
                                        reason="leaked-key drill", now=self.now())
        assert revoked.revoked_at is not None  # revoke_credential sets it
        started = time.monotonic()
        refused_after = self._poll_until(lambda: self.post(sender, "evt-1")[0] == 401)
        expect(refused_after is not None and refused_after <= self.bound,
               f"revoked key still accepted after {time.monotonic() - started:.1f} s "
               f"(bound {self.bound} s)")
        self._await_instances(revoked.revoked_at, started)
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
        expect(answers == [401, 401], f"revoked key answered {answers}, expected 401s")
        expect(self.snapshot(self.a) == before, "A's ledger changed under a revoked key")
        return "new and duplicate deliveries under the revoked key: 401, ledger unchanged"

    def b_keeps_accepting(self) -> str:
        """B's credential is untouched by A's revocation."""
        assert self.b is not None
        status, answer = self.post(self.b, "evt-3")
        expect(status == 202 and answer.get("status") == "accepted",
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
        assert rotation.secret is not None  # sender A signs with a shared secret
        self.a.key_id, self.a.secret = rotation.key_id, rotation.secret
        answer: dict[str, Any] = {}
        sender = self.a

        def replay() -> bool:
            nonlocal answer
            status, answer = self.post(sender, "evt-1")
            return status != 401

        took = self._poll_until(replay)
        expect(took is not None, f"new key not accepted within {self.bound} s")
        after = self.snapshot(self.a)
        # A worker may finish the receipt meanwhile: either state it held is the original's.
        held = before["receipts"] + after["receipts"]
        states = {ReceiptState.from_code(state).value for e, state, _ in held if e == "evt-1"}
        expect(answer.get("status") == "duplicate" and answer.get("state") in states,
               f"replay under the new key answered {answer}, receipt states {sorted(states)}")
        no_new_work = (len(after["receipts"]) == len(before["receipts"])
                       and after["jobs"] <= before["jobs"])
        expect(no_new_work, "the replay under the new key created new work")
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
                  lambda: retention_replay(self.svc.settings)),
                 ("every_profile_revoked_within_bound",
                  lambda: self.profiles.run(self.bound, expect)))
        try:
            for name, step in steps:
                if not _run_step(report, name, step):
                    break
        finally:
            _run_step(report, "cleanup", self.cleanup)

    def cleanup(self) -> str:
        """Delete the sandbox integrations' rows (never audit rows)."""
        ids = [s.integration_id for s in (self.a, self.b) if s is not None]
        ids += [s.integration_id for s in self.profiles.senders]
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
    hours = [h for (h,) in conn.execute(select(hourly_series.c.hour).distinct().where(
        hourly_series.c.scope_id.in_(ids)))]
    for table in SCOPED_TABLES:
        removed[table.name] = conn.execute(
            delete(table).where(table.c.scope_id.in_(ids))).rowcount
    retotal(conn, hours)  # the ledger's hourly totals no longer count the sandbox
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
