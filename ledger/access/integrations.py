"""Integrations: one sender on one account, the scope its receipts are kept in."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Connection, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.access import audit
from ledger.access.secrets_box import SecretBox
from ledger.db.schema import integrations
from ledger.domain import Integration
from ledger.errors import NotFound, Refused
from ledger.ids import INTEGRATION_ID, SLUG, new_integration_id
from ledger.intake.signatures import PROFILES

if TYPE_CHECKING:
    from ledger.access.credentials import NewCredential

def create_integration(
    conn: Connection, box: SecretBox, actor: audit.Actor, *, account: str, name: str,
    profile: str, now: datetime, tolerance: int = 300, max_body_bytes: int | None = None,
    secret: str | None = None, sandbox: bool = False,
) -> tuple[Integration, NewCredential]:
    """Create an integration with its first active credential; audited."""
    for label, slug in (("account", account), ("name", name)):
        if not SLUG.fullmatch(slug):
            raise Refused(f"{label} {slug!r} must match [a-z0-9][a-z0-9_-]{{0,62}}")
    if profile not in PROFILES:
        raise Refused(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    if tolerance < 1 or tolerance > 86400:
        raise Refused("tolerance must be between 1 and 86400 seconds")
    if max_body_bytes is not None and not 1 <= max_body_bytes <= 64 * 1024 * 1024:
        raise Refused("max-body-bytes must be between 1 and 67108864")
    try:
        with conn.begin_nested():
            new_id = conn.execute(
                insert(integrations).values(
                    public_id=new_integration_id(), account=account, name=name, profile=profile,
                    tolerance_seconds=tolerance, max_body_bytes=max_body_bytes,
                    sandbox=sandbox, created_at=now,
                ).returning(integrations.c.id)
            ).scalar_one()
    except IntegrityError:
        raise Refused(f"integration {account}/{name} already exists") from None
    integration = get_integration_by_id(conn, new_id)
    audit.record(conn, actor, "integration.create", integration.public_id, at=now,
                 scope=integration.scope, detail={"profile": profile})
    # credentials.py looks integrations up, so it is imported here, not at the top.
    from ledger.access.credentials import add_credential

    credential = add_credential(conn, box, actor, integration, now=now, secret=secret)
    return integration, credential


def get_integration(conn: Connection, public_id: str) -> Integration:
    """Return the integration with this public id, or raise NotFound."""
    if not INTEGRATION_ID.fullmatch(public_id):
        raise NotFound("integration", public_id)
    row = conn.execute(select(integrations).where(integrations.c.public_id == public_id)).first()
    if row is None:
        raise NotFound("integration", public_id)
    return Integration.from_row(row)


def get_integration_by_id(conn: Connection, integration_id: int) -> Integration:
    """Return the integration with this internal id (the scope id)."""
    row = conn.execute(select(integrations).where(integrations.c.id == integration_id)).first()
    if row is None:
        raise NotFound("integration", str(integration_id))
    return Integration.from_row(row)


def get_integration_by_scope(conn: Connection, scope: str) -> Integration:
    """Return the integration named by `account/name`, or raise NotFound."""
    account, _, name = scope.partition("/")
    if not (SLUG.fullmatch(account) and SLUG.fullmatch(name)):
        raise NotFound("scope", scope)  # no query for what no scope can be (NUL, spaces…)
    row = conn.execute(
        select(integrations).where(integrations.c.account == account,
                                   integrations.c.name == name)
    ).first()
    if row is None:
        raise NotFound("scope", scope)
    return Integration.from_row(row)
