"""A destination's `whsec_` signing secrets: created, rotated with overlap, re-encrypted.

Stored like credentials (ledger.access.credentials): encrypted by the secrets box, named
in listings and the audit log by a keyed fingerprint, shown once. During a rotation's
overlap the old and the new secret both sign each request (one `v1,` entry each), so the
receiving service can switch its secret at any moment of the overlap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, insert, literal, select, update

from ledger.access import audit
from ledger.access.credentials import DEFAULT_OVERLAP_SECONDS, MAX_OVERLAP_SECONDS
from ledger.access.secrets_box import SecretBox, fingerprint
from ledger.db.schema import destination_secrets, destinations, integrations
from ledger.domain import CredentialState
from ledger.errors import NotFound, Refused
from ledger.ids import DESTINATION_ID
from ledger.intake.signatures.presets import STANDARD_WEBHOOKS

LIVE_STATES = (CredentialState.ACTIVE.value, CredentialState.RETIRING.value)


def new_signing_secret() -> str:
    """Return a fresh Standard Webhooks secret (`whsec_` + base64 of 24 random bytes)."""
    generate = STANDARD_WEBHOOKS.secret.generate
    if generate is None:  # the standard-webhooks profile has always generated its secrets
        raise RuntimeError("the standard-webhooks profile generates no secret")
    return generate()


def add_secret(conn: Connection, box: SecretBox, destination_id: int, *,
               now: datetime) -> tuple[str, str]:
    """Store a fresh active secret of the destination; return it and its fingerprint."""
    secret = new_signing_secret()
    print_hmac = fingerprint(secret, audit.key_of(conn))
    conn.execute(insert(destination_secrets).values(
        destination_id=destination_id, secret_enc=box.encrypt(secret), fingerprint=print_hmac,
        state=CredentialState.ACTIVE.value, created_at=now))
    return secret, print_hmac


def _live_rows(conn: Connection, destination_id: int, now: datetime) -> list[Any]:
    """Return the destination's secrets that still sign at `now`, newest first."""
    query = (select(destination_secrets)
             .where(destination_secrets.c.destination_id == destination_id,
                    destination_secrets.c.state.in_(LIVE_STATES))
             .order_by(destination_secrets.c.id.desc()))
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()  # two rotations of one destination serialise here
    return [r for r in conn.execute(query).all() if r.expires_at is None or now < r.expires_at]


# Built once: every round of sends reads its destinations' secrets.
_LIVE_SECRETS = (select(destination_secrets.c.secret_enc, destination_secrets.c.expires_at)
                 .where(destination_secrets.c.destination_id == bindparam("destination_id"),
                        # the states as literals: an IN of bound values is expanded per run
                        destination_secrets.c.state.in_([literal(s) for s in LIVE_STATES]))
                 .order_by(destination_secrets.c.id.desc()))


def live_secrets(conn: Connection, box: SecretBox | Callable[[str], str], destination_id: int,
                 *, now: datetime) -> list[str]:
    """Return the plaintext secrets that sign a request sent at `now`, newest first.

    `box` is the secrets box, or what decrypts with it (a worker keeps a memo of it:
    the secrets are read for every round of sends, so a rotation or a revocation applies
    from the next one; only their decryption is saved).
    """
    decrypt = box.decrypt if isinstance(box, SecretBox) else box
    rows = conn.execute(_LIVE_SECRETS, {"destination_id": destination_id}).all()
    return [decrypt(r.secret_enc) for r in rows if r.expires_at is None or now < r.expires_at]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rotation:
    """The new secret (shown once) and the fingerprints of the secrets now retiring."""

    destination: str
    signing_secret: str
    fingerprint: str
    retiring: list[tuple[str, datetime]]

    def to_json(self) -> dict[str, object]:
        """Return the `destination rotate` object."""
        return {"destination": self.destination, "signing_secret": self.signing_secret,
                "fingerprint": self.fingerprint,
                "retiring": [{"fingerprint": f, "expires_at": at.isoformat()}
                             for f, at in self.retiring]}


def rotate_secret(conn: Connection, box: SecretBox, actor: audit.Actor, public_id: str, *,
                  now: datetime, overlap_seconds: int = DEFAULT_OVERLAP_SECONDS,
                  reason: str | None = None) -> Rotation:
    """Add a new secret; the live ones keep signing until `now + overlap`; audited."""
    if not 0 <= overlap_seconds <= MAX_OVERLAP_SECONDS:
        raise Refused(f"overlap must be between 0 and {MAX_OVERLAP_SECONDS} seconds")
    row = _destination_row(conn, public_id)
    until = now + timedelta(seconds=overlap_seconds)
    retiring: list[tuple[str, datetime]] = []
    for secret_row in _live_rows(conn, row.id, now):
        # An already retiring secret keeps its earlier end: rotating twice never extends it.
        ends = min(secret_row.expires_at, until) if secret_row.expires_at else until
        state = CredentialState.RETIRING if ends > now else CredentialState.EXPIRED
        conn.execute(update(destination_secrets)
                     .where(destination_secrets.c.id == secret_row.id)
                     .values(state=state.value, expires_at=ends))
        retiring.append((secret_row.fingerprint, ends))
    secret, print_hmac = add_secret(conn, box, row.id, now=now)
    audit.record(conn, actor, "destination.rotate", public_id, at=now,
                 scope=f"{row.account}/{row.name}", reason=reason,
                 detail={"integration": row.integration_public_id, "fingerprint": print_hmac,
                         "overlap_seconds": overlap_seconds,
                         "retiring": [{"fingerprint": f, "expires_at": at.isoformat()}
                                      for f, at in retiring]})
    return Rotation(destination=public_id, signing_secret=secret, fingerprint=print_hmac,
                    retiring=retiring)


def _destination_row(conn: Connection, public_id: str) -> Any:
    """Return the destination's id with its integration's scope, or raise NotFound."""
    if not isinstance(public_id, str) or not DESTINATION_ID.fullmatch(public_id):
        raise NotFound("destination", str(public_id)[:64])
    row = conn.execute(
        select(destinations.c.id, integrations.c.account, integrations.c.name,
               integrations.c.public_id.label("integration_public_id"))
        .join(integrations, integrations.c.id == destinations.c.integration_id)
        .where(destinations.c.public_id == public_id)).first()
    if row is None:
        raise NotFound("destination", public_id)
    return row


def rekey_destination_secrets(conn: Connection, box: SecretBox) -> int:
    """Re-encrypt every destination secret not yet under the newest master key."""
    query = select(destination_secrets.c.id, destination_secrets.c.secret_enc)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    count = 0
    for row in conn.execute(query.order_by(destination_secrets.c.id)).all():
        if not box.is_current(row.secret_enc):
            conn.execute(update(destination_secrets).where(destination_secrets.c.id == row.id)
                         .values(secret_enc=box.rotate(row.secret_enc)))
            count += 1
    return count
