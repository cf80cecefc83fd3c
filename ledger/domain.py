"""Domain types shared by the intake, the worker, the CLI and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Any


class ReceiptState(StrEnum):
    """The life of a receipt. Stored as a small integer (see `code`)."""

    PENDING = "pending"
    COMPLETE = "complete"
    FAILED = "failed"

    @property
    def code(self) -> int:
        """Return the small integer stored in receipts.state."""
        return _STATE_CODES[self]

    @classmethod
    def from_code(cls, code: int) -> ReceiptState:
        """Return the state stored as `code`."""
        return _CODE_STATES[code]


_STATE_CODES = {ReceiptState.PENDING: 0, ReceiptState.COMPLETE: 1, ReceiptState.FAILED: 2}
_CODE_STATES = {v: k for k, v in _STATE_CODES.items()}


class JobStatus(IntEnum):
    """A work item (a `jobs` row) is queued until it ends; a failed one is kept for review."""

    QUEUED = 0
    FAILED = 1


class CredentialState(StrEnum):
    """The lifecycle of a signing credential."""

    ACTIVE = "active"
    RETIRING = "retiring"
    REVOKED = "revoked"
    EXPIRED = "expired"


class ConflictKind(StrEnum):
    """Why a delivery was flagged for operators."""

    DIFFERENT_BODY = "different_body"
    REPLAYED_BODY = "replayed_body"


def scope_name(account: str, name: str) -> str:
    """Return the consumer scope of an integration: `account/integration`."""
    return f"{account}/{name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Integration:
    """One sender connected to one account; its id is the dedup scope."""

    id: int
    public_id: str
    account: str
    name: str
    profile: str
    tolerance_seconds: int
    max_body_bytes: int | None
    sandbox: bool
    created_at: datetime
    # Per-integration profile settings (README, "Sender profiles"); None when unused.
    type_path: str | None = None
    fixed_event_type: str | None = None
    endpoint_url: str | None = None
    hmac_options: str | None = None

    @property
    def scope(self) -> str:
        """Return the consumer scope `account/integration`."""
        return scope_name(self.account, self.name)

    @classmethod
    def from_row(cls, row: Any) -> Integration:
        """Build from a row of the integrations table."""
        return cls(id=row.id, public_id=row.public_id, account=row.account, name=row.name,
                   profile=row.profile, tolerance_seconds=row.tolerance_seconds,
                   max_body_bytes=row.max_body_bytes, sandbox=bool(row.sandbox),
                   created_at=row.created_at, type_path=row.type_path,
                   fixed_event_type=row.fixed_event_type, endpoint_url=row.endpoint_url,
                   hmac_options=row.hmac_options)


@dataclass(frozen=True, slots=True, kw_only=True)
class Credential:
    """A signing credential without its secret."""

    key_id: str
    integration_id: int
    state: CredentialState
    fingerprint: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    label: str | None = None

    def is_live(self, now: datetime) -> bool:
        """Tell whether this credential may verify a delivery at `now`."""
        if self.state not in (CredentialState.ACTIVE, CredentialState.RETIRING):
            return False
        return self.expires_at is None or now < self.expires_at

    @classmethod
    def from_row(cls, row: Any) -> Credential:
        """Build from a row of the credentials table."""
        return cls(key_id=row.key_id, integration_id=row.integration_id,
                   state=CredentialState(row.state), fingerprint=row.fingerprint,
                   created_at=row.created_at, expires_at=row.expires_at,
                   revoked_at=row.revoked_at, label=getattr(row, "label", None))


@dataclass(frozen=True, slots=True, kw_only=True)
class Receipt:
    """The durable record of one accepted (scope, event id)."""

    scope: str
    event_id: str
    event_type: str
    state: ReceiptState
    attempts: int
    accepted_at: datetime
    completed_at: datetime | None
    result_ref: str | None
    body_sha256: str
    last_error: str | None

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `receipt show` object."""
        return {
            "scope": self.scope, "event_id": self.event_id, "event_type": self.event_type,
            "state": str(self.state), "attempts": self.attempts,
            "accepted_at": self.accepted_at.isoformat(),
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
            "result_ref": self.result_ref, "body_sha256": self.body_sha256,
            "last_error": self.last_error,
        }
