"""The ordered acceptance pipeline: integration → signature → scope → validation → claim.

The size limit is enforced by the web layer while it reads the body (it must
stop reading); everything after that happens here, framework-free. Nothing is
written before the claim transaction, and the answer exists only after commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from ledger.clock import Clock, unix
from ledger.db.engine import storage_guard
from ledger.domain import ConflictKind, CredentialState, ReceiptState
from ledger.errors import (
    AuthenticationFailed,
    InvalidEvent,
    StorageUnavailable,
    UnknownIntegration,
)
from ledger.ids import EVENT_ID, EVENT_TYPE
from ledger.intake.credential_view import CredentialView, IntegrationAuth
from ledger.intake.signatures import HeaderMap, get_profile
from ledger.intake.store import (
    DriverClaim,
    NewEvent,
    RecordedOutcome,
    claim_receipt,
    claim_unsigned_body,
    enqueue_job,
    original_of_body,
    record_conflict,
    recorded_outcome,
)
from ledger.strict_json import StrictJsonError, loads


@dataclass(frozen=True, slots=True, kw_only=True)
class IntakeAnswer:
    """The HTTP answer to a delivery that authenticated, and what it did."""

    status: int
    body: dict[str, Any]
    scope: str
    event_id: str
    event_type: str
    key_id: str  # the credential whose signature matched


class _ReplayedBody(Exception):
    """Internal: roll the claim back, the body was accepted before under another id."""


class Intake:
    """Accepts deliveries for every integration, against one database."""

    def __init__(self, engine: Engine, view: CredentialView, clock: Clock, *,
                 max_json_depth: int = 64) -> None:
        self._engine = engine
        self._max_json_depth = max_json_depth
        self._driver_claim = DriverClaim(engine)
        self._view = view
        self._clock = clock

    def lookup(self, public_id: str) -> IntegrationAuth | None:
        """Return the integration behind a public id (the web layer needs its body limit)."""
        with storage_guard():
            return self._view.lookup(public_id)

    def accept(self, auth: IntegrationAuth | None, headers: HeaderMap, body: bytes) -> IntakeAnswer:
        """Run the pipeline on a body already read within its limit."""
        if auth is None:
            raise UnknownIntegration()
        integration = auth.integration
        profile = get_profile(integration.profile)
        now = self._clock.now()
        key_id = self._authenticate_fresh(auth, headers, body)
        try:
            payload = parse_json_object(body, self._max_json_depth)
            identity = profile.identity(headers, payload)
            event_id = validate_event_id(identity.event_id)
            event_type = validate_event_type(identity.event_type)
        except InvalidEvent as invalid:
            invalid.key_id = key_id
            raise
        event = NewEvent(
            scope_id=integration.id, event_id=event_id, event_type=event_type,
            body_sha256=hashlib.sha256(body).digest(), payload=body.decode("utf-8"),
            accepted_at=now,
        )
        with storage_guard():
            answer = self._claim(event, id_is_signed=profile.id_is_signed)
        return IntakeAnswer(status=answer[0], body=answer[1], scope=integration.scope,
                            event_id=event_id, event_type=event_type, key_id=key_id)

    def _authenticate_fresh(self, auth: IntegrationAuth, headers: HeaderMap,
                            body: bytes) -> str:
        """Authenticate; when no cached key matched, re-read the keys once and try again.

        Returns the key id of the credential that signed.
        """
        try:
            return self._authenticate(auth, headers, body)
        except AuthenticationFailed as failure:
            if failure.reason not in ("bad_signature", "no_secret"):
                raise
            try:
                with storage_guard():
                    fresh = self._view.reload(auth.integration.public_id)
            except StorageUnavailable:
                raise failure from None
            if fresh is None:
                raise
            return self._authenticate(fresh, headers, body)

    def _authenticate(self, auth: IntegrationAuth, headers: HeaderMap, body: bytes) -> str:
        """Verify against live keys (return the signer's key id); name a matching dead key."""
        profile = get_profile(auth.integration.profile)
        now = self._clock.now()
        tolerance = auth.integration.tolerance_seconds
        live = auth.live_keys(now)
        try:
            verified = profile.verify(headers, body, [k.secret for k in live], now=unix(now),
                                      tolerance=tolerance)
        except AuthenticationFailed as failure:
            # "no_secret": every key of the integration is dead, the sole key was revoked.
            if failure.reason in ("bad_signature", "no_secret"):
                dead = auth.dead_keys(now)
                try:
                    hit = profile.verify(headers, body, [k.secret for k in dead],
                                         now=unix(now), tolerance=tolerance)
                except AuthenticationFailed:
                    raise failure from None
                key = dead[hit.secret_index]
                state = "revoked" if key.state is CredentialState.REVOKED else "expired"
                raise AuthenticationFailed(f"{state}_key", key_id=key.key_id) from None
            raise
        return live[verified.secret_index].key_id

    def _claim(self, event: NewEvent, *, id_is_signed: bool) -> tuple[int, dict[str, Any]]:
        """Claim the event id in one transaction; answer from the ledger if it is taken."""
        for _ in range(3):
            try:
                if id_is_signed:
                    claimed, existing = self._driver_claim.claim(event)
                else:
                    with self._engine.begin() as conn:
                        claimed, existing = _claim_unsigned(conn, event)
            except _ReplayedBody:
                answer = self._answer_replayed_body(event)
                if answer is not None:
                    return answer
                continue
            if claimed:
                return 202, {"status": "accepted", "event_id": event.event_id,
                             "state": ReceiptState.PENDING.value}
            if existing is None:
                continue  # the holder was purged, or is not visible yet: claim again
            if existing.body_sha256 != event.body_sha256:
                with self._engine.begin() as conn:
                    record_conflict(
                        conn, scope_id=event.scope_id, event_id=event.event_id,
                        kind=ConflictKind.DIFFERENT_BODY, original_event_id=event.event_id,
                        original_sha256=existing.body_sha256,
                        incoming_sha256=event.body_sha256, now=event.accepted_at)
                return 409, {"status": "conflict", "event_id": event.event_id}
            return duplicate_answer(event.event_id, existing)
        raise StorageUnavailable("the ledger changed under this delivery three times")

    def _answer_replayed_body(self, event: NewEvent) -> tuple[int, dict[str, Any]] | None:
        """Answer a body replayed under a fresh id as a duplicate of the original."""
        with self._engine.begin() as conn:
            original = original_of_body(conn, event.scope_id, event.body_sha256)
            existing = (recorded_outcome(conn, event.scope_id, original)
                        if original is not None else None)
            if original is None or existing is None:
                return None  # the original expired meanwhile: claim as new work
            record_conflict(
                conn, scope_id=event.scope_id, event_id=event.event_id,
                kind=ConflictKind.REPLAYED_BODY, original_event_id=original,
                original_sha256=existing.body_sha256, incoming_sha256=event.body_sha256,
                now=event.accepted_at)
            return duplicate_answer(original, existing)


def _claim_unsigned(conn: Connection, event: NewEvent) -> tuple[bool, RecordedOutcome | None]:
    """Claim an unsigned id (GitHub) with its job, or return the outcome recorded under it.

    Raises _ReplayedBody (rolling the claim back) when the body was accepted
    before under another id.
    """
    if not claim_receipt(conn, event):
        return False, recorded_outcome(conn, event.scope_id, event.event_id)
    if not claim_unsigned_body(conn, event):
        raise _ReplayedBody()
    enqueue_job(conn, event)
    return True, None


def duplicate_answer(event_id: str, existing: RecordedOutcome) -> tuple[int, dict[str, Any]]:
    """Return the CONTRACT's answer for a duplicate in the recorded state."""
    body: dict[str, Any] = {"status": "duplicate", "event_id": event_id,
                            "state": existing.state.value}
    if existing.state is ReceiptState.COMPLETE:
        body["result_ref"] = existing.result_ref
        return 200, body
    if existing.state is ReceiptState.FAILED:
        return 200, body
    return 202, body


def parse_json_object(body: bytes, max_depth: int = 64) -> dict[str, Any]:
    """Decode a strict UTF-8 JSON object, refusing anything else with a clear detail."""
    if not body:
        raise InvalidEvent("body is empty; a JSON object is required")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidEvent("body is not valid UTF-8") from None
    try:
        payload = loads(text, max_depth)
    except StrictJsonError as error:
        raise InvalidEvent(str(error)) from None
    if not isinstance(payload, dict):
        raise InvalidEvent("body must be a JSON object")
    return payload


def validate_event_id(value: Any) -> str:
    """Return the event id if it has the documented form."""
    if value is None or value == "":
        raise InvalidEvent("event id is missing")
    if not isinstance(value, str) or not EVENT_ID.fullmatch(value):
        raise InvalidEvent(f"event id must match ^{EVENT_ID.pattern}$")
    return value


def validate_event_type(value: Any) -> str:
    """Return the event type if it has the documented form."""
    if value is None or value == "":
        raise InvalidEvent("event type is missing")
    if not isinstance(value, str) or not EVENT_TYPE.fullmatch(value):
        raise InvalidEvent(f"event type must match ^{EVENT_TYPE.pattern}$")
    return value
