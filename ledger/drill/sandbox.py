"""The drill's shared pieces and its isolated retention sandbox.

The retention step must not wait days nor touch the shared ledger, so it runs
in a throwaway SQLite ledger whose clock is moved past the retention boundary:
the expired receipt is purged by the real purge and a replay of that event is
accepted as new work, the consequence the seed documents.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.fernet import Fernet
from sqlalchemy import select

from ledger.access import audit
from ledger.access.integrations import create_integration
from ledger.clock import FixedClock, unix
from ledger.config import Settings
from ledger.db.schema import receipts
from ledger.intake.signatures import get_profile

if TYPE_CHECKING:
    from ledger.services import Services

PROFILE = "standard-webhooks"
EVENT_TYPE = "drill.check"  # no handler: a worker completes it as ignored:no-handler


class StepFailed(Exception):
    """A step's check did not hold; the message is the step's detail."""


def expect(condition: bool, detail: str) -> None:
    """Fail the step with `detail` unless `condition` holds."""
    if not condition:
        raise StepFailed(detail)


@dataclass(slots=True, kw_only=True)
class SandboxSender:
    """A sandbox integration and the secret it currently signs with."""

    integration_id: int
    public_id: str
    scope: str
    key_id: str
    secret: str


def event_body(event_id: str) -> bytes:
    """Return a small standard-webhooks body."""
    return json.dumps({"type": EVENT_TYPE, "data": {"drill": event_id}},
                      separators=(",", ":")).encode()


def sign(secret: str, body: bytes, event_id: str, now: datetime) -> dict[str, str]:
    """Return the headers the sender's library would attach."""
    headers = get_profile(PROFILE).sign(secret, body, event_id=event_id,
                                        event_type=EVENT_TYPE, timestamp=unix(now))
    headers["Content-Type"] = "application/json"
    return headers


def retention_replay(settings: Settings) -> str:
    """In a throwaway ledger, replay an event after its receipt expired: it runs again."""
    from ledger.db.engine import upgrade
    from ledger.services import build_services

    with tempfile.TemporaryDirectory(prefix="ledger-drill-") as tmp:
        sandbox = Settings(database_url=f"sqlite:///{Path(tmp) / 'sandbox.sqlite3'}",
                           var_dir=Path(tmp), master_key=Fernet.generate_key().decode(),
                           retention_seconds=settings.retention_seconds,
                           review_window_seconds=settings.review_window_seconds)
        clock = FixedClock()
        svc = build_services(sandbox, clock=clock)
        try:
            upgrade(svc.engine)
            return _replay_across_retention(svc, clock)
        finally:
            svc.close()


def _accept(svc: Services, sender: SandboxSender, event_id: str) -> dict[str, Any]:
    """Deliver through the sandbox's real intake pipeline, signed at the sandbox's time."""
    body = event_body(event_id)
    headers = sign(sender.secret, body, event_id, svc.clock.now())
    header_map = {k.lower(): [v] for k, v in headers.items()}
    return svc.intake.accept(svc.intake.lookup(sender.public_id), header_map, body).body


def _accepted_at(svc: Services, scope_id: int, event_id: str) -> datetime | None:
    """Return when the sandbox's receipt of `event_id` was accepted (None if absent)."""
    with svc.engine.connect() as conn:
        return conn.execute(select(receipts.c.accepted_at).where(
            receipts.c.scope_id == scope_id, receipts.c.event_id == event_id)).scalar()


def _replay_across_retention(svc: Services, clock: FixedClock) -> str:
    """Accept and finish an event, replay it (duplicate), pass retention, purge, replay."""
    from ledger.jobs.retention import purge
    from ledger.worker.loop import run_worker

    with svc.engine.begin() as conn:
        integration, cred = create_integration(
            conn, svc.box, audit.Actor(name="drill", role="sandbox"), account="sandbox",
            name="retention", profile=PROFILE, now=clock.now(), sandbox=True)
    sender = SandboxSender(integration_id=integration.id, public_id=integration.public_id,
                           scope=integration.scope, key_id=cred.key_id, secret=cred.secret)
    expect(_accept(svc, sender, "evt-old")["status"] == "accepted",
           "sandbox: first delivery not accepted")
    run_worker(svc, burst=True)  # only finished receipts ever expire
    first = _accepted_at(svc, integration.id, "evt-old")
    inside = _accept(svc, sender, "evt-old")
    expect(inside.get("state") == "complete",
           f"sandbox: replay inside retention answered {inside}, expected duplicate/complete")
    clock.advance(svc.settings.retention_seconds + 1)
    purged = purge(svc.engine, svc.settings, clock).expired_receipts
    again = _accept(svc, sender, "evt-old")
    fresh = _accepted_at(svc, integration.id, "evt-old")
    expect(again["status"] == "accepted" and first is not None and fresh is not None
           and fresh > first,
           f"sandbox: replay after retention answered {again} (purged {purged})")
    return (f"inside retention: duplicate/complete; {svc.settings.retention_seconds} s later "
            f"the purge expired {purged} receipt(s) and the replay was accepted again "
            "as new work (a fresh pending receipt)")
