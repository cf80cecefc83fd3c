"""Integrations (one sender on one account) and their signing credentials."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from ledger.access import audit
from ledger.access.secrets_box import FINGERPRINT_PREFIX, SecretBox, fingerprint
from ledger.db.schema import credentials, integrations
from ledger.domain import Credential, CredentialState, Integration
from ledger.errors import NotFound, Refused
from ledger.ids import INTEGRATION_ID, SLUG, new_integration_id, new_key_id
from ledger.intake.signatures import PROFILES, get_profile

MAX_SECRET_LENGTH = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class NewCredential:
    """A credential as created: the only moment its secret is shown."""

    key_id: str
    secret: str


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


def add_credential(
    conn: Connection, box: SecretBox, actor: audit.Actor, integration: Integration, *,
    now: datetime, secret: str | None = None, action: str = "credential.add",
    reason: str | None = None, detail: dict[str, Any] | None = None,
) -> NewCredential:
    """Add an active credential to the integration; audited. Returns the secret once."""
    profile = get_profile(integration.profile)
    if secret is None:
        secret = profile.generate_secret()
    _check_secret(integration.profile, secret)
    key_id = new_key_id()
    print_hmac = fingerprint(secret, audit.key_of(conn))
    conn.execute(
        insert(credentials).values(
            key_id=key_id, integration_id=integration.id, secret_enc=box.encrypt(secret),
            fingerprint=print_hmac, state=CredentialState.ACTIVE.value,
            created_at=now,
        )
    )
    audit.record(conn, actor, action, key_id, at=now, scope=integration.scope, reason=reason,
                 detail={"integration": integration.public_id,
                         "fingerprint": print_hmac, **(detail or {})})
    return NewCredential(key_id=key_id, secret=secret)


def refresh_fingerprints(conn: Connection, box: SecretBox) -> int:
    """Recompute fingerprints made before they were keyed; return how many changed."""
    key = audit.key_of(conn)
    rows = conn.execute(select(credentials.c.id, credentials.c.secret_enc)
                        .where(credentials.c.fingerprint.not_like(FINGERPRINT_PREFIX + "%"))
                        ).all()
    for row in rows:
        conn.execute(update(credentials).where(credentials.c.id == row.id)
                     .values(fingerprint=fingerprint(box.decrypt(row.secret_enc), key)))
    return len(rows)


def _check_secret(profile: str, secret: str) -> None:
    """Refuse secrets the sender could not use (empty, huge, wrong format)."""
    if not secret or len(secret) > MAX_SECRET_LENGTH or not secret.isprintable():
        raise Refused(f"secret must be 1-{MAX_SECRET_LENGTH} printable characters")
    if profile == "standard-webhooks":
        import base64
        import binascii

        if not secret.startswith("whsec_"):
            raise Refused("a standard-webhooks secret looks like whsec_<base64>")
        try:
            if len(base64.b64decode(secret[6:], validate=True)) < 16:
                raise Refused("a standard-webhooks key must be at least 16 bytes")
        except binascii.Error:
            raise Refused("a standard-webhooks secret looks like whsec_<base64>") from None


def list_credentials(conn: Connection, integration: Integration) -> list[Credential]:
    """Return every credential of the integration, oldest first, without secrets."""
    rows = conn.execute(
        select(credentials).where(credentials.c.integration_id == integration.id)
        .order_by(credentials.c.id)
    ).all()
    return [Credential.from_row(r) for r in rows]
