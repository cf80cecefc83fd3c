"""The ordered acceptance pipeline: integration → signature → scope → validation → claim.

The size limit is enforced by the web layer while it reads the body (it must
stop reading); everything after that happens here, framework-free. Nothing is
written before the claim transaction, and the answer exists only after commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

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
from ledger.intake.credential_view import CredentialView, IntegrationAuth, KeyMaterial
from ledger.intake.signatures import HeaderMap, SenderProfile, profile_for
from ledger.intake.signatures._common import received_content_type
from ledger.intake.signatures.base import Verified
from ledger.intake.signatures.fields import DIGEST_ID, digest_id
from ledger.intake.signatures.profile import FORM, JSON, JSON_ARRAY, MEDIA_TYPES
from ledger.intake.store import (
    DriverClaim,
    NewEvent,
    RecordedOutcome,
    claim_receipt,
    claim_sender_token,
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
    outcome: str  # accepted, duplicate, conflict, batch or handshake (logs and metrics)
    key_id: str  # the credential whose signature matched (the delivery log)
    # A text/plain answer instead of `body` (a handshake's echo, a profile's success_body).
    text: str | None = None


# A tolerance no timestamp is outside of: finds the key that signed a stale delivery.
FOREVER_SECONDS = 10**12


class _ReplayedBody(Exception):
    """Internal: roll the claim back, the body was accepted before under another id."""


class Intake:
    """Accepts deliveries for every integration, against one database."""

    def __init__(self, engine: Engine, view: CredentialView, clock: Clock, *,
                 max_json_depth: int = 64, claim_connections: int | None = None) -> None:
        self._engine = engine
        self._max_json_depth = max_json_depth
        self._driver_claim = DriverClaim(engine, own_connections=claim_connections)
        self._view = view
        self._clock = clock

    def close(self) -> None:
        """Close the connections the intake's threads claim on (the process is stopping)."""
        self._driver_claim.close()

    def lookup(self, public_id: str) -> IntegrationAuth | None:
        """Return the integration behind a public id (the web layer needs its body limit)."""
        with storage_guard():
            return self._view.lookup(public_id)

    def accept(self, auth: IntegrationAuth | None, headers: HeaderMap, body: bytes) -> IntakeAnswer:
        """Run the pipeline on a body already read within its limit."""
        if auth is None:
            raise UnknownIntegration()
        integration = auth.integration
        profile = profile_for(integration)
        now = self._clock.now()
        try:
            key, verified = self._authenticate_fresh(auth, profile, headers, body)
        except AuthenticationFailed as failure:
            if failure.key_id is not None:  # signed by a known key: its event id is a fact
                failure.event_id = self._signed_event_id(profile, headers, body)
            raise
        try:
            return self._accept_authenticated(auth, profile, key, headers, body, now, verified)
        except InvalidEvent as invalid:
            invalid.key_id = key.key_id  # a signed body that is refused: the log names its key
            raise
        except AuthenticationFailed as failure:
            # A signature token another event used (Mailgun): the key signed the token, not
            # this event, so the log names the key but not the event id the body claims.
            failure.key_id = key.key_id
            raise

    def _signed_event_id(self, profile: SenderProfile, headers: HeaderMap,
                         body: bytes) -> str | None:
        """Return the valid event id of a refused but signed body, else None (best effort)."""
        try:
            _, payload = self._payload(profile, headers, body)
            if isinstance(payload, list):
                return None  # a batch has many ids; the log keeps none
            return validate_event_id(profile.event_id.read(headers, payload, body))
        except (InvalidEvent, ValueError, TypeError, KeyError):
            return None

    def _payload(self, profile: SenderProfile, headers: HeaderMap,
                 body: bytes) -> tuple[str, Any]:
        """Return the body's format (the profile's, or its Content-Type's) and the parsed body."""
        body_format = (JSON if profile.body_format == JSON and profile.alternate_format is None
                       else profile.format_of(headers))
        return body_format, (parse_json_object(body, self._max_json_depth)
                             if body_format == JSON
                             else parse_body(body_format, body, self._max_json_depth,
                                             json_field=profile.form_json_field))

    def _accept_authenticated(self, auth: IntegrationAuth, profile: SenderProfile,
                              key: KeyMaterial, headers: HeaderMap, body: bytes,
                              now: Any, verified: Verified | None = None) -> IntakeAnswer:
        """Answer an authenticated delivery: a handshake, a batch, or one event."""
        integration = auth.integration
        body_format, payload = self._payload(profile, headers, body)
        if profile.handshake is not None:
            reply = profile.handshake(payload, key.secret)
            if reply is not None:  # answered at once, after authentication; nothing written
                status, said = reply
                text = said if isinstance(said, str) else None
                return IntakeAnswer(status=status, body=said if isinstance(said, dict) else {},
                                    scope=integration.scope, event_id="", event_type="",
                                    outcome="handshake", key_id=key.key_id, text=text)
        if isinstance(payload, list):  # a JSON_ARRAY profile's batch (parse_body)
            return self._accept_batch(auth, profile, key, headers, payload, now)
        if profile.batch_items is not None:  # a batch inside an object (Adyen)
            events = profile.batch_items(payload)
            if events is None:
                raise InvalidEvent("body holds no batch of events")
            return self._accept_batch(auth, profile, key, headers, events, now)
        event = self._new_event(integration.id, profile, headers, payload, body, now,
                                form=body_format == FORM, received=True)
        if verified is not None and verified.token is not None and verified.timestamp is not None:
            # The token is refused under another event until its signed timestamp leaves
            # the freshness window; after that the signature itself is stale.
            expires = datetime.fromtimestamp(
                verified.timestamp + integration.tolerance_seconds, UTC)
            event = replace(event, token=verified.token, token_expires_at=expires)
        with storage_guard():
            answer = self._claim(event, id_is_signed=profile.id_is_signed)
        return IntakeAnswer(status=answer[0], body=answer[1], scope=integration.scope,
                            event_id=event.event_id, event_type=event.event_type,
                            outcome=answer[1]["status"], key_id=key.key_id,
                            text=profile.success_body if answer[0] < 300 else None)

    def _new_event(self, scope_id: int, profile: SenderProfile, headers: HeaderMap,
                   payload: Any, body: bytes, now: Any, *, form: bool = False,
                   received: bool = False) -> NewEvent:
        """Validate the event's id and type; the work item carries the body (a form, decoded).

        `received`: `body` is the delivery's whole body (not a batch element), so the work item
        keeps its Content-Type and, for a form, the body as received (for destinations).
        """
        # The fields directly (SenderProfile.identity, minus a call on the hot path).
        raw_id = profile.event_id.read(headers, payload, body)
        event_id = raw_id if raw_id is DIGEST_ID else validate_event_id(raw_id)
        event_type = validate_event_type(profile.event_type.read(headers, payload, body))
        # The digest covers what the signature covers (Twilio: the sorted decoded pairs,
        # so `b=2&a=1`, `a=1&a=1&=` and `a=1` are one body): a signature-equivalent
        # replay is a duplicate, never new work.
        digest = profile.signed_digest(body)
        text = work_item_text(profile, payload, body, form=form)
        raw_body = body.decode("utf-8") if form and received else None  # parse_form checked it
        if event_id is DIGEST_ID:  # an id-less delivery the sender documents
            event_id = digest_id(digest)
        return NewEvent(scope_id=scope_id, event_id=event_id, event_type=event_type,
                        body_sha256=digest, payload=text, accepted_at=now,
                        content_type=received_content_type(headers) if received else None,
                        raw_body=raw_body)

    def _accept_batch(self, auth: IntegrationAuth, profile: SenderProfile, key: KeyMaterial,
                      headers: HeaderMap, events: list[Any], now: Any) -> IntakeAnswer:
        """Give each event of a batch its own receipt and work item, all in one transaction."""
        integration = auth.integration
        batch = []
        for index, element in enumerate(events):
            if not isinstance(element, dict):
                raise InvalidEvent(f"batch element {index} is not a JSON object")
            raw = json.dumps(element, separators=(",", ":")).encode()
            try:
                batch.append(self._new_event(integration.id, profile, headers, element, raw,
                                             now))
            except InvalidEvent as invalid:
                raise InvalidEvent(f"batch element {index}: {invalid.detail}") from None
        # Claimed in id order: two concurrent batches sharing ids then wait for each
        # other in one order and never deadlock. Answers keep the body's order.
        order = sorted(range(len(batch)), key=lambda i: batch[i].event_id)
        claimed: dict[int, tuple[int, dict[str, Any]]] = {}
        with storage_guard(), self._engine.begin() as conn:
            for i in order:
                claimed[i] = claim_in_batch(conn, batch[i])
        answers = [claimed[i] for i in range(len(batch))]
        status = 202 if any(a[1].get("state") == "pending" for a in answers) else 200
        return IntakeAnswer(status=status,
                            body={"status": "batch", "events": [a[1] for a in answers]},
                            scope=integration.scope, event_id=batch[0].event_id,
                            event_type=batch[0].event_type, outcome="batch",
                            key_id=key.key_id, text=profile.success_body)

    def _authenticate_fresh(self, auth: IntegrationAuth, profile: SenderProfile,
                            headers: HeaderMap, body: bytes) -> tuple[KeyMaterial, Verified]:
        """Authenticate; when no cached key matched, re-read the keys once and try again.

        Returns the live credential that signed, and what the signature verified.
        """
        try:
            return self._authenticate(auth, profile, headers, body)
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
            return self._authenticate(fresh, profile, headers, body)

    def _authenticate(self, auth: IntegrationAuth, profile: SenderProfile, headers: HeaderMap,
                      body: bytes) -> tuple[KeyMaterial, Verified]:
        """Verify against live keys and return the one that matched; name a dead one."""
        now = self._clock.now()
        tolerance = auth.integration.tolerance_seconds
        live = auth.live_keys(now)
        try:
            verified = profile.scheme.verify(headers, body, [k.secret for k in live],
                                             now=unix(now), tolerance=tolerance)
        except AuthenticationFailed as failure:
            # "no_secret": every key of the integration is dead, the sole key was revoked.
            if failure.reason in ("bad_signature", "no_secret"):
                dead = auth.dead_keys(now)
                try:
                    hit = profile.scheme.verify(headers, body, [k.secret for k in dead],
                                                now=unix(now), tolerance=tolerance)
                except AuthenticationFailed:
                    raise failure from None
                key = dead[hit.secret_index]
                state = "revoked" if key.state is CredentialState.REVOKED else "expired"
                raise AuthenticationFailed(f"{state}_key", key_id=key.key_id) from None
            if failure.reason in ("stale_timestamp", "future_timestamp"):
                # Freshness is checked after the signature: some live key signed it.
                signer = profile.scheme.verify(headers, body, [k.secret for k in live],
                                               now=unix(now), tolerance=FOREVER_SECONDS)
                raise AuthenticationFailed(failure.reason,
                                           key_id=live[signer.secret_index].key_id) from None
            raise
        return live[verified.secret_index], verified

    def _claim(self, event: NewEvent, *, id_is_signed: bool) -> tuple[int, dict[str, Any]]:
        """Claim the event id in one transaction; answer from the ledger if it is taken."""
        for _ in range(3):
            try:
                if id_is_signed and event.token is None:
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
                        incoming_sha256=event.body_sha256, now=event.accepted_at,
                        incoming_body=event.payload)
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
    """Claim an unsigned id (GitHub) with its work item, or return the outcome recorded under it.

    Raises _ReplayedBody (rolling the claim back) when the body was accepted
    before under another id, and AuthenticationFailed (rolling back: nothing is
    written) when the signature's token carried another event (claim_sender_token).
    """
    if event.token is not None and not claim_sender_token(conn, event):
        raise AuthenticationFailed("replayed_token")
    if not claim_receipt(conn, event):
        return False, recorded_outcome(conn, event.scope_id, event.event_id)
    if not claim_unsigned_body(conn, event):
        raise _ReplayedBody()
    enqueue_job(conn, event)
    return True, None


def claim_in_batch(conn: Connection, event: NewEvent) -> tuple[int, dict[str, Any]]:
    """Claim one event of a batch inside the batch's transaction; answer as section 2 does."""
    if claim_receipt(conn, event):
        enqueue_job(conn, event)
        return 202, {"status": "accepted", "event_id": event.event_id,
                     "state": ReceiptState.PENDING.value}
    existing = recorded_outcome(conn, event.scope_id, event.event_id)
    if existing is None:
        raise StorageUnavailable("a batch event's receipt vanished while it was claimed")
    if existing.body_sha256 != event.body_sha256:
        record_conflict(conn, scope_id=event.scope_id, event_id=event.event_id,
                        kind=ConflictKind.DIFFERENT_BODY, original_event_id=event.event_id,
                        original_sha256=existing.body_sha256,
                        incoming_sha256=event.body_sha256, now=event.accepted_at)
        return 409, {"status": "conflict", "event_id": event.event_id}
    return duplicate_answer(event.event_id, existing)


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


def work_item_text(profile: SenderProfile, payload: Any, body: bytes, *, form: bool) -> str:
    """Return the payload a work item carries: the body's text, or a form's fields as JSON."""
    if form:
        return json.dumps(payload, sort_keys=profile.signs_decoded_form, separators=(",", ":"))
    return body.decode("utf-8")


@dataclass(frozen=True, slots=True)
class RerunItem:
    """What a work item run again carries, rebuilt from the body an operator supplies."""

    payload: str
    content_type: str | None
    raw_body: str | None


def rerun_item(profile: SenderProfile, body: bytes, *, max_json_depth: int = 64) -> RerunItem:
    """Rebuild the work item an accepted `body` made, from the body alone.

    The delivery's headers are gone by then, so a sender with two formats (Slack's
    forms, Twilio's JSON) gets the first of its formats the body parses as; a batch's
    receipt is run from its element, a JSON object. A form is decoded as the intake
    decodes it and keeps its body and Content-Type for destinations. Raises
    InvalidEvent when the body parses as none of the sender's formats.
    """
    formats = [profile.body_format, profile.alternate_format]
    invalid: InvalidEvent | None = None
    for body_format in (f for f in formats if f is not None):
        form = body_format == FORM
        try:
            payload = (parse_body(FORM, body, max_json_depth, json_field=profile.form_json_field)
                       if form else parse_json_object(body, max_json_depth))
        except InvalidEvent as error:
            invalid = invalid or error
            continue
        text = work_item_text(profile, payload, body, form=form)
        return RerunItem(payload=text, content_type=MEDIA_TYPES[FORM] if form else None,
                         raw_body=body.decode("utf-8") if form else None)
    assert invalid is not None  # a profile has at least one format
    raise invalid


def parse_body(body_format: str, body: bytes, max_depth: int = 64, *,
               json_field: str | None = None) -> Any:
    """Decode the body in the profile's format: a JSON object, a JSON array, or a form.

    `json_field` names a form field holding a JSON object (Slack's `payload`): it is
    decoded in place, as strictly as a JSON body.
    """
    if body_format == FORM:
        fields = parse_form(body)
        inner = fields.get(json_field) if json_field else None
        if json_field and isinstance(inner, str):
            try:
                fields[json_field] = parse_json_object(inner.encode(), max_depth)
            except InvalidEvent as invalid:
                raise InvalidEvent(f"form field {json_field}: {invalid.detail}") from None
        return fields
    if body_format == JSON_ARRAY:
        events = _load_json(body, "a JSON array of events", max_depth)
        if not isinstance(events, list) or not events:
            raise InvalidEvent("body must be a non-empty JSON array of events")
        return events
    return parse_json_object(body, max_depth)


def parse_form(body: bytes) -> dict[str, Any]:
    """Decode an x-www-form-urlencoded body; a repeated field becomes a list of values."""
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except UnicodeDecodeError:
        raise InvalidEvent("body is not valid UTF-8") from None
    except ValueError:
        raise InvalidEvent("body is not a valid form") from None
    fields: dict[str, Any] = {}
    for name, value in pairs:
        if name in fields:
            previous = fields[name]
            fields[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            fields[name] = value
    return fields


def parse_json_object(body: bytes, max_depth: int = 64) -> dict[str, Any]:
    """Decode a strict UTF-8 JSON object, refusing anything else with a clear detail."""
    payload = _load_json(body, "a JSON object", max_depth)
    if not isinstance(payload, dict):
        raise InvalidEvent("body must be a JSON object")
    return payload


def _load_json(body: bytes, expected: str, max_depth: int) -> Any:
    """Decode strict UTF-8 JSON of any shape, refusing what is not JSON with a clear detail."""
    if not body:
        raise InvalidEvent(f"body is empty; {expected} is required")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidEvent("body is not valid UTF-8") from None
    try:
        payload = loads(text, max_depth)
    except StrictJsonError as error:
        raise InvalidEvent(str(error)) from None
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
