"""The read models: what each list and detail of the dashboard and the JSON API holds.

They are TypedDicts, so a read model is still the dict the templates read
(`item.scope`) and the API serializes key by key (the keys are CONTRACT.md's);
the type checker checks every producer and every caller against them.
A work item is a row of the `jobs` table: the receipt's unfinished work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NotRequired, TypedDict


class Headline(TypedDict):
    """The live numbers at the top of the overview; the counts stop at `cap`."""

    oldest_pending_at: datetime | None
    oldest_pending_age_seconds: float | None
    failures_24h: int
    conflicts_24h: int
    cap: int


class ReceiptItem(TypedDict):
    """A receipt in a list: its key, state (the stored name), counts and times."""

    scope_id: int
    event_id: str
    event_type: str
    state: str
    attempts: int
    accepted_at: datetime
    completed_at: datetime | None
    result_ref: str | None
    scope: str
    integration: str


class FailureItem(ReceiptItem):
    """A failed receipt in the failures list, with its newest attempt's error."""

    last_error: str | None


class PendingReceiptItem(ReceiptItem):
    """A receipt pending past the stuck threshold."""

    age_seconds: float


class ConflictItem(TypedDict):
    """A conflict: a delivery that reused an event id with another body, by digest only.

    The kept incoming body is evidence for oncall (ledger.reads.evidence), never part
    of a list: `body_kept` says whether it is still there.
    """

    id: int
    scope_id: int
    event_id: str
    kind: str
    original_event_id: str
    original_sha256: str
    incoming_sha256: str
    first_seen: datetime
    last_seen: datetime
    count: int
    acknowledged_at: datetime | None
    acknowledged_by: str | None
    ack_note: str | None
    incoming_size: int | None
    body_kept: bool


class ListedConflict(ConflictItem):
    """A conflict in the conflicts list or on its evidence page, with its scope's names."""

    scope: str
    integration: str


class AuditItem(TypedDict):
    """An audit log row as the audit page and the API list it (never its hash chain)."""

    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target: str
    scope: str | None
    reason: str | None
    detail: str | None
    request_id: str | None


class ReceiptAuditItem(TypedDict):
    """An audit row about one receipt, as its detail shows it."""

    id: int
    at: datetime
    actor: str
    role: str
    action: str
    reason: str | None


class DestinationAnswer(TypedDict):
    """What a destination answered to one attempt of a receipt (the excerpt: oncall and up)."""

    attempt: int
    at: datetime
    outcome: str
    http_status: int | None
    latency_ms: float
    error: str | None
    response_excerpt: str | None


class DestinationFailure(DestinationAnswer):
    """One of a destination's latest attempts that did not complete."""

    event_id: str


class WorkItemState(TypedDict):
    """A receipt's work item as the detail shows it: never its payload."""

    status: int
    run_at: datetime
    leased_by: str | None
    leased_until: datetime | None


class DeliveryItem(TypedDict):
    """One row of the delivery log: what arrived, from where, and how it was answered."""

    at: datetime
    integration: str | None
    scope: str | None
    outcome: str
    http_status: int
    key_id: str | None
    event_id: str | None
    client: str | None
    reason: str | None
    count: int


class AttemptRow(TypedDict):
    """An attempt in the receipt detail: a row of the `attempts` table, every column."""

    id: int
    scope_id: int
    event_id: str
    number: int
    worker_id: str
    lease_token: int
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None


class ReceiptDetail(ReceiptItem):
    """A receipt with its timeline, conflicts, audit rows, work item and retained payload."""

    body_sha256: str
    attempt_rows: list[AttemptRow]
    last_error: str | None
    conflicts: list[ConflictItem]
    audit: list[ReceiptAuditItem]
    deliveries: Sequence[DeliveryItem]  # a page may show each with more keys
    destination_attempts: list[DestinationAnswer]
    job: WorkItemState | None  # the key is CONTRACT.md's
    # Not required: the API drops it for roles below oncall.
    payload: NotRequired[str | None]


class KeyUsage(TypedDict):
    """A signing key's use, from the delivery log."""

    last_used_at: datetime | None
    uses_24h: int
    uses_after_dead: int
    uses_capped: bool


class CredentialItem(KeyUsage):
    """A credential as the credentials page and the API show it: never its secret."""

    key_id: str
    state: str
    fingerprint: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_reason: str | None
    label: str | None


class QueuedWorkItem(TypedDict):
    """A queued work item in the stuck and retrying lists."""

    scope_id: int
    event_id: str
    event_type: str
    run_at: datetime
    attempts: int
    leased_by: str | None
    leased_until: datetime | None
    window_start: datetime  # its retry window: acceptance or the last requeue
    accepted_at: datetime | None  # the receipt's first acceptance (None: no receipt)
    last_error: str | None
    scope: str
    integration: str
    max_attempts: int
    window_age_seconds: float
    requeued: bool


class RetryingItem(QueuedWorkItem):
    """A work item waiting on its backoff after a failed attempt."""

    next_in_seconds: float


class StuckItem(QueuedWorkItem):
    """A due work item nobody else may run, and why."""

    reason: str
    overdue_seconds: float


class OrphanReceiptItem(TypedDict):
    """A pending receipt with no queued work item to run it (listed under Stuck)."""

    scope_id: int
    event_id: str
    event_type: str
    accepted_at: datetime
    attempts: int
    scope: str
    integration: str
    reason: str
    window_age_seconds: float
    requeued: bool
    run_at: None
    leased_by: None
    last_error: None


class RunningItem(TypedDict):
    """A work item a worker holds now: the worker, running for, lease left."""

    scope_id: int
    event_id: str
    event_type: str
    attempts: int
    leased_by: str | None
    leased_until: datetime | None
    started_at: datetime | None
    scope: str
    integration: str
    worker_alive: bool
    lease_left_seconds: float | None
    running_seconds: float | None


class OverdueItem(TypedDict):
    """A queued work item due for longer than the grace (the API's `overdue_jobs`)."""

    scope_id: int
    event_id: str
    event_type: str
    accepted_at: datetime
    run_at: datetime
    attempts: int
    leased_by: str | None
    leased_until: datetime | None
    scope: str
    integration: str
    kind: str
    age_seconds: float
    overdue_seconds: float


class CapacityFigures(TypedDict):
    """The CONTRACT's `ledger capacity` figures; `replicas` only when not 1."""

    receipts: int
    bytes_per_receipt_measured: float | None
    retention_days: float
    events_per_day: int
    projected_bytes: int | None
    replicas: NotRequired[int]


class InstanceRow(TypedDict):
    """A process in the overview's instances: its heartbeat's age, liveness and key lag."""

    id: str
    kind: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    credentials_refreshed_at: datetime | None
    handles: list[str] | None  # a worker's event types; None: every type
    heartbeat_age_seconds: float
    refresh_lag_seconds: float | None
    live: bool  # a beat within the bound


class SchedulerRun(TypedDict):
    """The latest run of a scheduled job (a row of `scheduler_runs`)."""

    id: int
    job: str
    period_start: datetime
    instance: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    rows_affected: int | None
    error: str | None
    leased_until: datetime | None


class FindingItem(TypedDict):
    """An unresolved finding of the scheduled checks (a row of `findings`)."""

    id: int
    kind: str
    subject: str
    detail: str | None
    first_seen: datetime
    last_seen: datetime
    resolved_at: datetime | None


class RevokedKeyUse(TypedDict):
    """A delivery the intake accepted with a key after its revocation."""

    at: datetime
    outcome: str
    public_id: str | None
    event_id: str | None
    client: str | None
    count: int
    after_seconds: float  # since the revocation


class RevocationEvidence(TypedDict):
    """Did every web instance pick a revocation up, and what the intake did with the key since."""

    refreshed: int  # web instances that refreshed after the revocation
    instances: int  # of how many (those seen, and the live ones)
    missing: list[str]  # live web instances not seen refreshing
    slowest_seconds: float | None  # an upper bound
    accepted: list[RevokedKeyUse]  # the first LIST_LIMIT
    accepted_count: int
    refused_count: int
    uses_capped: bool  # more deliveries than READ_LIMIT were read


class IntegrationLiveKeys(TypedDict):
    """An integration with how many of its keys verify now (0: every delivery is refused)."""

    integration: str  # the public id
    scope: str
    profile: str
    created_at: str  # ISO 8601
    live_keys: int
