"""A demo ledger for `make run`: two accounts, one integration per profile, real deliveries."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select

from ledger.access import audit
from ledger.access.integrations import create_integration, get_integration_by_scope
from ledger.clock import unix
from ledger.db.schema import demo_balances
from ledger.demo.history import seed_history
from ledger.errors import NotFound
from ledger.intake.signatures import get_profile

if TYPE_CHECKING:
    from ledger.services import Services

DEMO_INTEGRATIONS = (
    ("acme", "stripe-prod", "stripe"),
    ("acme", "github-app", "github"),
    ("acme", "svix-hooks", "standard-webhooks"),
    ("globex", "stripe-prod", "stripe"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SentDelivery:
    """One demo delivery and the status the intake answered."""

    scope: str
    event_id: str
    status: int
    answer: dict[str, Any]


def balance(conn: Connection, scope_id: int) -> int:
    """Return the demo balance of a scope (0 before its first credit)."""
    value = conn.execute(
        select(demo_balances.c.balance).where(demo_balances.c.scope_id == scope_id)
    ).scalar()
    return int(value or 0)


def _body(profile: str, event_id: str, event_type: str, data: dict[str, Any]) -> bytes:
    """Build a body in the sender's shape (Stripe carries id and type in the body)."""
    body: dict[str, Any] = {"type": event_type, "data": data}
    if profile == "stripe":
        body = {"id": event_id, "object": "event", **body}
    if profile == "github":
        body = {"action": event_type.partition(".")[2] or None, "data": data}
    return json.dumps(body, separators=(",", ":")).encode()


# POST one delivery to the intake: (path, body, headers) -> (status, JSON answer). The CLI
# passes the app's test client, so the demo goes through the real intake without Flask here.
Post = Callable[[str, bytes, dict[str, str]], tuple[int, dict[str, Any]]]


def deliver(svc: Services, post: Post, public_id: str, profile_name: str, secret: str, *,
            event_id: str, event_type: str, data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Sign and POST one delivery through the real intake."""
    profile = get_profile(profile_name)
    body = _body(profile_name, event_id, event_type, data)
    now = unix(svc.clock.now())
    headers = profile.sign(secret, body, event_id=event_id, event_type=event_type,
                           timestamp=now)
    headers["Content-Type"] = "application/json"
    return post(f"/hooks/{public_id}", body, headers)


def seed(svc: Services, post: Post) -> list[SentDelivery]:
    """Create the demo integrations (once) and send a few deliveries through the intake."""
    created: dict[str, tuple[str, str, str]] = {}
    with svc.engine.begin() as conn:
        for account, name, profile in DEMO_INTEGRATIONS:
            try:
                get_integration_by_scope(conn, f"{account}/{name}")
                continue
            except NotFound:
                pass
            integration, credential = create_integration(
                conn, svc.box, audit.Actor(name="demo-seed", role="cli"), account=account,
                name=name, profile=profile, now=svc.clock.now())
            created[integration.scope] = (integration.public_id, profile, credential.secret)
        if created:  # two days of history for the dashboard's lists and charts
            seed_history(conn, [get_integration_by_scope(conn, s).id for s in created],
                         svc.clock.now())
    sent: list[SentDelivery] = []
    for scope, (public_id, profile, secret) in created.items():
        plan = [("evt_42", "demo.credit", {"amount": 100}),
                ("evt_42", "demo.credit", {"amount": 100}),     # a redelivery: duplicate
                ("evt_43", "demo.credit", {"amount": 25}),
                ("evt_43", "demo.credit", {"amount": 9999}),    # same id, other body: conflict
                ("evt_44", "demo.fail", {}),
                ("evt_45", "demo.flaky", {"amount": 5, "fail_times": 2})]
        for event_id, event_type, data in plan:
            status, answer = deliver(svc, post, public_id, profile, secret,
                                     event_id=event_id, event_type=event_type, data=data)
            sent.append(SentDelivery(scope=scope, event_id=event_id, status=status,
                                     answer=answer))
    return sent
