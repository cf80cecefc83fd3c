"""The credential lifecycle: adding, listing, rotation, revocation, expiry, re-encryption.

Every function takes the caller's connection and never commits; each action
appends its audit row in that same transaction.

Overlap policy: `rotate_credential` keeps the old live keys verifying until
`now + overlap_seconds` (default one day) so that the sender can switch over.
An overlap of 0 is allowed and means "stop now": the old keys become `expired`
at `now` and never verify again. Overlaps above MAX_OVERLAP_SECONDS are refused:
a rotation that leaves the old key alive for months is not a rotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from ledger.access import audit
from ledger.access.integrations import get_integration_by_id
from ledger.access.secrets_box import FINGERPRINT_PREFIX, SecretBox, fingerprint
from ledger.db.schema import credentials
from ledger.domain import Credential, CredentialState, Integration
from ledger.errors import NotFound, Refused
from ledger.ids import KEY_ID, new_key_id
from ledger.intake.signatures import profile_for

DEFAULT_OVERLAP_SECONDS = 86400
MAX_OVERLAP_SECONDS = 30 * 86400
LIVE_STATES = (CredentialState.ACTIVE.value, CredentialState.RETIRING.value)
SCHEDULER = audit.Actor(name="scheduler", role="system")
MAX_LABEL_LENGTH = 80


@dataclass(frozen=True, slots=True, kw_only=True)
class NewCredential:
    """A credential as created: the only moment its secret is shown."""

    key_id: str
    secret: str
    public: bool = False  # the sender's public key (whpk_, Discord, SendGrid): nothing to hide

    @property
    def shown_secret(self) -> str | None:
        """Return the secret to print once; None for a public key (CONTRACT section 4)."""
        return None if self.public else self.secret


def add_credential(
    conn: Connection, box: SecretBox, actor: audit.Actor, integration: Integration, *,
    now: datetime, secret: str | None = None, action: str = "credential.add",
    reason: str | None = None, detail: dict[str, Any] | None = None,
    label: str | None = None,
) -> NewCredential:
    """Add an active credential to the integration; audited. Returns the secret once."""
    label = check_label(label)
    secret_format = profile_for(integration).secret
    if secret is None:
        if secret_format.generate is None:
            raise Refused(f"{integration.profile} verifies with the sender's public key: "
                          "pass it with --secret-stdin")
        secret = secret_format.generate()
    problem = secret_format.check(secret) if isinstance(secret, str) else "secret must be text"
    if problem:
        raise Refused(problem)
    key_id = new_key_id()
    print_hmac = fingerprint(secret, audit.key_of(conn))
    conn.execute(
        insert(credentials).values(
            key_id=key_id, integration_id=integration.id, secret_enc=box.encrypt(secret),
            fingerprint=print_hmac, state=CredentialState.ACTIVE.value,
            created_at=now, label=label,
        )
    )
    audit.record(conn, actor, action, key_id, at=now, scope=integration.scope, reason=reason,
                 detail={"integration": integration.public_id, "fingerprint": print_hmac,
                         **({"label": label} if label else {}), **(detail or {})})
    return NewCredential(key_id=key_id, secret=secret, public=secret_format.is_public(secret))


def check_label(label: str | None) -> str | None:
    """Return a key's label trimmed (None when empty), or refuse one that cannot be shown."""
    label = (label or "").strip()
    if not label:
        return None
    if len(label) > MAX_LABEL_LENGTH or not label.isprintable():
        raise Refused(f"a label is at most {MAX_LABEL_LENGTH} printable characters")
    return label


def identify_secret(conn: Connection, actor: audit.Actor, secret: str, *,
                    now: datetime) -> list[str]:
    """Return the key ids whose secret this is (by keyed fingerprint); audited, never stored.

    The secret itself is neither kept nor written anywhere: only whether it matched.
    """
    if not isinstance(secret, str) or not secret.strip():
        raise Refused("paste the secret to look up")
    print_hmac = fingerprint(secret.strip(), audit.key_of(conn))
    matched = list(conn.execute(select(credentials.c.key_id)
                                .where(credentials.c.fingerprint == print_hmac)
                                .order_by(credentials.c.id)).scalars())
    audit.record(conn, actor, "credential.identify", ",".join(matched) or "no match", at=now,
                 detail={"matched": matched})
    return matched


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



def list_credentials(conn: Connection, integration: Integration) -> list[Credential]:
    """Return every credential of the integration, oldest first, without secrets."""
    rows = conn.execute(
        select(credentials).where(credentials.c.integration_id == integration.id)
        .order_by(credentials.c.id)
    ).all()
    return [Credential.from_row(r) for r in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rotation:
    """The replacement credential (secret shown once) and the keys now retiring."""

    key_id: str
    secret: str | None  # None when the replacement is a public key
    retiring: list[tuple[str, datetime]]

    def to_json(self) -> dict[str, object]:
        """Return the CONTRACT's `credential rotate` object."""
        return {"key_id": self.key_id, "secret": self.secret,
                "retiring": [{"key_id": k, "expires_at": at.isoformat()}
                             for k, at in self.retiring]}


def _live_rows(conn: Connection, integration_id: int,
               now: datetime) -> list[Row[int, str, str, datetime | None]]:
    """Lock and return the integration's credentials that still verify at `now`."""
    query = (
        select(credentials.c.id, credentials.c.key_id, credentials.c.state,
               credentials.c.expires_at)
        .where(credentials.c.integration_id == integration_id,
               credentials.c.state.in_(LIVE_STATES))
        .order_by(credentials.c.id)
    )
    if conn.dialect.name == "postgresql":
        # Two concurrent rotations of one integration serialise here.
        query = query.with_for_update()
    rows = conn.execute(query).all()
    return [r for r in rows if r.expires_at is None or now < r.expires_at]


def is_last_live_key(conn: Connection, integration_id: int, key_id: str,
                     now: datetime) -> bool:
    """Tell whether `key_id` is the only credential of the integration that still verifies."""
    return [r.key_id for r in _live_rows(conn, integration_id, now)] == [key_id]


def rotate_credential(
    conn: Connection, box: SecretBox, actor: audit.Actor, integration: Integration, *,
    now: datetime, overlap_seconds: int = DEFAULT_OVERLAP_SECONDS, secret: str | None = None,
    reason: str | None = None, label: str | None = None,
) -> Rotation:
    """Add a replacement to the same integration and retire its live keys; one audit row."""
    if not 0 <= overlap_seconds <= MAX_OVERLAP_SECONDS:
        raise Refused(f"overlap must be between 0 and {MAX_OVERLAP_SECONDS} seconds")
    until = now + timedelta(seconds=overlap_seconds)
    retiring: list[tuple[str, datetime]] = []
    for row in _live_rows(conn, integration.id, now):
        # An already retiring key keeps its earlier end: rotating twice never extends it.
        expires_at = min(row.expires_at, until) if row.expires_at is not None else until
        state = CredentialState.RETIRING if expires_at > now else CredentialState.EXPIRED
        conn.execute(update(credentials).where(credentials.c.id == row.id)
                     .values(state=state.value, expires_at=expires_at))
        retiring.append((row.key_id, expires_at))
    created = add_credential(
        conn, box, actor, integration, now=now, secret=secret, action="credential.rotate",
        reason=reason, label=label,
        detail={"overlap_seconds": overlap_seconds,
                "retiring": [{"key_id": k, "expires_at": at.isoformat()} for k, at in retiring]},
    )
    return Rotation(key_id=created.key_id, secret=created.shown_secret, retiring=retiring)


def get_credential(conn: Connection, key_id: str) -> Credential:
    """Return the credential with this key id (without its secret), or raise NotFound."""
    if not KEY_ID.fullmatch(key_id):
        raise NotFound("credential", key_id)
    row = conn.execute(select(credentials).where(credentials.c.key_id == key_id)).first()
    if row is None:
        raise NotFound("credential", key_id)
    return Credential.from_row(row)


def revoke_credential(conn: Connection, actor: audit.Actor, key_id: str, *, reason: str,
                      now: datetime) -> Credential:
    """Revoke a credential at once in the database; a reason is required; audited."""
    reason = (reason or "").strip()
    if not reason:
        raise Refused("a reason is required to revoke a credential")
    audit.check_reason(reason)
    current = get_credential(conn, key_id)
    changed = conn.execute(
        update(credentials)
        .where(credentials.c.key_id == key_id,
               credentials.c.state != CredentialState.REVOKED.value)
        .values(state=CredentialState.REVOKED.value, revoked_at=now, revoked_reason=reason)
    ).rowcount
    if changed != 1:
        raise Refused(f"credential {key_id} is already revoked")
    integration = get_integration_by_id(conn, current.integration_id)
    audit.record(conn, actor, "credential.revoke", key_id, at=now, scope=integration.scope,
                 reason=reason, detail={"integration": integration.public_id,
                                        "previous_state": current.state.value})
    return get_credential(conn, key_id)


def expire_due_credentials(conn: Connection, *, now: datetime,
                           actor: audit.Actor = SCHEDULER) -> int:
    """Mark retiring credentials past their `expires_at` as expired; one audit row each."""
    due = conn.execute(
        select(credentials.c.id, credentials.c.key_id, credentials.c.integration_id,
               credentials.c.expires_at)
        .where(credentials.c.state == CredentialState.RETIRING.value,
               credentials.c.expires_at <= now)
        .order_by(credentials.c.id)
    ).all()
    count = 0
    for row in due:
        changed = conn.execute(
            update(credentials)
            .where(credentials.c.id == row.id,
                   credentials.c.state == CredentialState.RETIRING.value)
            .values(state=CredentialState.EXPIRED.value)
        ).rowcount
        if changed:
            count += 1
            integration = get_integration_by_id(conn, row.integration_id)
            audit.record(conn, actor, "credential.expire", row.key_id, at=now,
                         scope=integration.scope,
                         detail={"expires_at": row.expires_at.isoformat()})
    return count


def rekey_secrets(conn: Connection, box: SecretBox) -> int:
    """Re-encrypt every stored secret not yet under the newest master key; return how many."""
    query = select(credentials.c.id, credentials.c.secret_enc).order_by(credentials.c.id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    count = 0
    for row in conn.execute(query).all():
        if box.is_current(row.secret_enc):
            continue
        conn.execute(update(credentials).where(credentials.c.id == row.id)
                     .values(secret_enc=box.rotate(row.secret_enc)))
        count += 1
    return count
