"""GET /openapi.json: an OpenAPI 3 description of the intake, the ops endpoints and the
/api/v1 reads. tests/integration/test_schemathesis.py fuzzes a live server against it."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

bp = Blueprint("openapi", __name__)

STATES = ["pending", "complete", "failed"]
_STRING = {"type": "string"}
_OBJECT = {"type": "object"}
_ERROR = {"type": "object", "properties": {"error": _STRING, "detail": _STRING},
          "required": ["error"]}
_REQUEST_ID = {"X-Request-Id": {
    "description": "The caller's X-Request-Id when sane, else a fresh one; also in the logs",
    "schema": _STRING}}
_INT = {"type": "integer"}
_NUMBER = {"type": "number"}
_BOOL = {"type": "boolean"}
_OPT_STRING = {"type": "string", "nullable": True}
_OPT_INT = {"type": "integer", "nullable": True}
_OPT_NUMBER = {"type": "number", "nullable": True}


def _record(*, closed: bool = False, **fields: dict[str, Any]) -> dict[str, Any]:
    """Return an object schema requiring every field; `closed` also forbids any other key."""
    schema: dict[str, Any] = {"type": "object", "properties": fields, "required": list(fields)}
    if closed:
        schema["additionalProperties"] = False
    return schema


def _list(item: dict[str, Any]) -> dict[str, Any]:
    """Return an array schema."""
    return {"type": "array", "items": item}


def _page_of(item: dict[str, Any], **extra: dict[str, Any]) -> dict[str, Any]:
    """Return a keyset page of `item`."""
    page = _record(items=_list(item), next_cursor=_OPT_STRING)
    page["properties"].update(extra)
    page["required"].extend(extra)
    return page


_RECEIPT = _record(
    scope=_STRING, scope_id=_INT, integration=_STRING, event_id=_STRING, event_type=_STRING,
    state={"type": "string", "enum": STATES}, attempts=_INT, accepted_at=_STRING,
    completed_at=_OPT_STRING, result_ref=_OPT_STRING)
_RECEIPT_PAGE = _page_of(_RECEIPT)
_FAILURE = {**_RECEIPT, "properties": {**_RECEIPT["properties"], "last_error": _OPT_STRING},
            "required": [*_RECEIPT["required"], "last_error"]}
_CONFLICT = _record(
    id=_INT, scope_id=_INT, event_id=_STRING, kind=_STRING, original_event_id=_STRING,
    original_sha256=_STRING, incoming_sha256=_STRING, count=_INT, first_seen=_STRING,
    last_seen=_STRING, acknowledged_at=_OPT_STRING, acknowledged_by=_OPT_STRING,
    ack_note=_OPT_STRING, body_kept=_BOOL, incoming_size=_OPT_INT)
_INTEGRATION = _record(
    id=_INT, public_id={"type": "string", "pattern": "^in_[0-9A-Za-z]{22}$"}, account=_STRING,
    name=_STRING, scope=_STRING, profile=_STRING, tolerance_seconds=_INT,
    max_body_bytes=_OPT_INT, sandbox=_BOOL, created_at=_STRING)
_AUDIT_ROW = _record(
    id=_INT, at=_STRING, actor=_STRING, role=_STRING, action=_STRING, target=_STRING,
    scope=_OPT_STRING, reason=_OPT_STRING, request_id=_OPT_STRING, detail=_OPT_STRING)
# Never a secret: the credential rows are closed (no secret_enc, no secret).
_CREDENTIAL = _record(
    closed=True, key_id={"type": "string", "pattern": "^key_[0-9A-Za-z]{22}$"},
    state={"type": "string", "enum": ["active", "retiring", "revoked", "expired"]},
    created_at=_STRING, expires_at=_OPT_STRING, revoked_at=_OPT_STRING,
    revoked_reason=_OPT_STRING, fingerprint={"type": "string", "pattern": "^hmac:[0-9a-f]{16}$"},
    last_used_at=_OPT_STRING, uses_24h=_INT, uses_after_dead=_INT, uses_capped=_BOOL,
    label=_OPT_STRING)
# The delivery log (CONTRACT section 7): never a body, signature or secret (closed);
# `reason` is null for roles below security; `count` > 1 on a row that counts refusals
# over the log's per-integration rate.
_DELIVERY = _record(
    closed=True, at=_STRING, integration=_OPT_STRING, scope=_OPT_STRING,
    outcome={"type": "string", "enum": ["accepted", "duplicate", "conflict", "unauthenticated",
                                        "invalid_event", "body_too_large",
                                        "unknown_integration", "unavailable", "internal"]},
    http_status=_INT, key_id={"type": "string", "nullable": True,
                              "pattern": "^key_[0-9A-Za-z]{22}$"},
    event_id=_OPT_STRING, client=_OPT_STRING, reason=_OPT_STRING,
    count={"type": "integer", "minimum": 1})
# A destination (CONTRACT section 8): never a secret (closed); `response_excerpt` is null
# for roles below oncall.
_DESTINATION_FAILURE = _record(
    closed=True, event_id=_STRING, attempt=_INT, at=_STRING, outcome=_STRING,
    http_status=_OPT_INT, error=_OPT_STRING, latency_ms=_NUMBER,
    response_excerpt=_OPT_STRING)
_DESTINATION = _record(
    closed=True, destination={"type": "string", "pattern": "^dst_[0-9A-Za-z]{22}$"},
    integration=_STRING, scope=_OPT_STRING, url=_STRING, event_types=_list(_STRING),
    state={"type": "string", "enum": ["active", "paused"]}, state_reason=_OPT_STRING,
    state_changed_at=_STRING, created_at=_STRING, timeout_seconds=_NUMBER,
    max_in_flight=_INT, rate_per_second=_OPT_NUMBER, consecutive_failures=_INT,
    blocked_until=_OPT_STRING, attempts_sampled=_INT, success_rate=_OPT_NUMBER,
    p95_latency_ms=_OPT_NUMBER, window_seconds=_INT, backlog=_INT, backlog_cap=_INT,
    recent_failures=_list(_DESTINATION_FAILURE))
_DELIVERY_FILTERS = [
    ("integration", "`account/integration` or an integration id (`in_…`); else the start "
                    "of scopes (`acme`, `acme/str`)"),
    ("key_id", "the credential whose signature matched (`key_…`)"),
    ("event_id", "the event id (refusals keep it only when the signature verified)"),
    ("outcome", "accepted, duplicate, conflict, unauthenticated, invalid_event, "
                "body_too_large, unknown_integration, unavailable, internal"),
    ("since", "ISO 8601, UTC when no offset"), ("until", "ISO 8601, exclusive"),
    ("limit", "1-200, default 50"), ("cursor", "next_cursor of the previous page")]
_RECEIPT_FILTERS = [
    ("scope", "`account/integration` or an integration id (`in_…`)"),
    ("state", "pending, complete or failed"), ("event_type", "exact event type"),
    ("since", "ISO 8601, UTC when no offset"), ("until", "ISO 8601, exclusive"),
    ("prefix", "event id prefix"), ("limit", "1-200, default 50"),
    ("cursor", "next_cursor of the previous page")]


def _json(schema: dict[str, Any], description: str,
          headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return an OpenAPI response object with a JSON body."""
    response: dict[str, Any] = {"description": description,
                                "content": {"application/json": {"schema": schema}}}
    response["headers"] = {**_REQUEST_ID, **(headers or {})}
    return response


def _error(code: str, description: str) -> dict[str, Any]:
    """Return an error response whose `error` is exactly `code`."""
    schema = {"type": "object", "properties": {
        "error": {"type": "string", "enum": [code]}, "detail": _STRING}, "required": ["error"]}
    return _json(schema, description)


def _unavailable() -> dict[str, Any]:
    """Return the 503 answer: storage unavailable, retry later."""
    schema = {"type": "object", "properties": {"error": {"type": "string",
                                                         "enum": ["unavailable"]}},
              "required": ["error"]}
    return _json(schema, "storage unavailable: retry after the given seconds", headers={
        "Retry-After": {"required": True, "schema": {"type": "integer", "minimum": 1}}})


def _answer(status: list[str], states: list[str], required: list[str]) -> dict[str, Any]:
    """Return an intake answer schema."""
    return {"type": "object", "properties": {
        "status": {"type": "string", "enum": status}, "event_id": _STRING,
        "state": {"type": "string", "enum": states}, "result_ref": _STRING},
        "required": required}


def _intake() -> dict[str, Any]:
    """Describe POST /hooks/{integration} with every answer of CONTRACT section 2."""
    return {"post": {
        "summary": "Receive one signed webhook delivery",
        "description": "Checks in order: body size, integration, signature and freshness, "
                       "scope, event id and type; then one transaction writes the receipt "
                       "and the job. No 2xx before commit. Signature headers depend on the "
                       "integration's profile (docs: reference/profiles.md). Handshakes "
                       "(Slack, Zoom, Discord) answer 200 with the sender's documented body "
                       "(a Discord Webhook Events PING: 204, no body) and write nothing; "
                       "batch profiles (SendGrid) answer "
                       "{\"status\": \"batch\", \"events\": [...]}; form profiles "
                       "(Twilio; Slack slash commands and interactivity) post "
                       "application/x-www-form-urlencoded.",
        "operationId": "receiveDelivery",
        "parameters": [{"name": "integration", "in": "path", "required": True,
                        "schema": {"type": "string", "pattern": "^in_[0-9A-Za-z]{22}$"}}],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _OBJECT}}},
        "security": [],
        "responses": {
            "200": _json(_answer(["duplicate"], ["complete", "failed"],
                                 ["status", "event_id", "state"]),
                         "duplicate of a complete (with result_ref) or failed receipt"),
            "204": {"description": "Discord Webhook Events PING, after authentication; "
                           "nothing written"},
            "202": _json(_answer(["accepted", "duplicate"], ["pending"],
                                 ["status", "event_id", "state"]),
                         "accepted (committed), or duplicate of a pending receipt"),
            "400": _error("invalid_event", "bad event id or type, body not a JSON object"),
            "401": _error("unauthenticated", "any authentication failure (reason in logs)"),
            "404": _error("unknown_integration", "no integration has this id"),
            "409": _json(_answer(["conflict"], STATES, ["status", "event_id"]),
                         "same scope and event id, different body; a conflict is recorded"),
            "408": _error("request_timeout",
                          "body not in within LEDGER_BODY_READ_TIMEOUT_SECONDS"),
            "413": _error("body_too_large", "body over the integration's limit"),
            "503": _unavailable()}}}


def _ops() -> dict[str, Any]:
    """Describe the load-balancer and Prometheus endpoints."""
    status = {"type": "object", "properties": {"status": _STRING, "detail": _STRING},
              "required": ["status"]}
    public: dict[str, Any] = {"security": []}
    return {
        "/healthz": {"get": {**public, "summary": "Process up", "operationId": "healthz",
                             "responses": {"200": _json(status, "the process runs")}}},
        "/readyz": {"get": {**public, "summary": "Database reachable, migrations at head",
                            "operationId": "readyz",
                            "responses": {"200": _json(status, "ready"),
                                          "503": _json(status, "unready, with detail")}}},
        "/metrics": {"get": {**public, "summary": "Prometheus text exposition",
                             "description": "For the monitoring path only: a loopback client "
                                            "not behind a proxy, or with LEDGER_METRICS_TOKEN "
                                            "set, `Authorization: Bearer <token>`.",
                             "operationId": "metrics", "responses": {"200": {
                                 "description": "metrics of every process of this server",
                                 "headers": _REQUEST_ID,
                                 "content": {"text/plain": {"schema": _STRING}}},
                                 "401": _error("unauthenticated", "token missing or wrong"),
                                 "403": _error("forbidden", "not the monitoring path")}}},
        "/openapi.json": {"get": {**public, "summary": "This document",
                                  "operationId": "openapi",
                                  "responses": {"200": _json(_OBJECT, "OpenAPI 3")}}},
    }


def _query(names: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Return query parameter objects."""
    return [{"name": n, "in": "query", "required": False, "description": d,
             "schema": {"type": "string"}} for n, d in names]


def _read(summary: str, schema: dict[str, Any], params: list[tuple[str, str]] | None = None,
          path_params: tuple[str, ...] = ()) -> dict[str, Any]:
    """Describe one GET of /api/v1."""
    parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in path_params] + _query(params or [])
    return {"get": {"summary": summary, "parameters": parameters, "responses": {
        "200": _json(schema, "OK"), "400": _error("bad_request", "a filter or cursor is bad"),
        "401": _error("unauthenticated", "no valid session or token"),
        "403": _error("forbidden", "the operator's role is too low"),
        "404": _error("not_found", "no such record"), "503": _unavailable()}}}


def _api() -> dict[str, Any]:
    """Describe the /api/v1 reads."""
    me = {"type": "object", "properties": {
        "username": _STRING,
        "role": {"type": "string", "enum": ["viewer", "oncall", "security", "admin"]}},
        "required": ["username", "role"]}
    verify = _record(closed=True, ok={**_BOOL, "nullable": True}, rows=_INT,
                     first_bad=_OPT_INT, next=_OPT_INT)
    instance = _record(id=_STRING, kind=_STRING, hostname=_STRING, pid=_INT,
                       started_at=_STRING, heartbeat_at=_STRING,
                       heartbeat_age_seconds=_NUMBER,
                       handles={"type": "array", "items": _STRING, "nullable": True})
    overview = _record(
        headline={"type": "object", "properties": {
            "failures_24h": _INT, "conflicts_24h": _INT, "cap": _INT,
            "oldest_pending_at": _OPT_STRING, "oldest_pending_age_seconds": _OPT_NUMBER},
            "required": ["failures_24h", "conflicts_24h"]},
        rollups_refreshed_at=_OPT_STRING,
        scopes=_list({**_INTEGRATION, "properties": {**_INTEGRATION["properties"],
                                                     "counts": _OBJECT}}),
        next_cursor=_OPT_STRING, instances=_list(instance), scheduler_runs=_list(_record(
            id=_INT, job=_STRING, period_start=_STRING, instance=_STRING, started_at=_STRING,
            finished_at=_OPT_STRING, outcome=_STRING, rows_affected=_OPT_INT,
            error=_OPT_STRING)))
    attempt = _record(id=_INT, number=_INT, outcome=_STRING, started_at=_STRING,
                      finished_at=_OPT_STRING, error=_OPT_STRING, worker_id=_OPT_STRING)
    receipt = {**_RECEIPT, "properties": {
        **_RECEIPT["properties"], "body_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "attempt_rows": _list(attempt), "last_error": _OPT_STRING,
        "conflicts": _list(_CONFLICT), "deliveries": _list(_DELIVERY),
        "audit": _list(_record(id=_INT, at=_STRING, actor=_STRING, role=_STRING,
                               action=_STRING, reason=_OPT_STRING)),
        "job": {**_record(status=_INT, run_at=_STRING, leased_by=_OPT_STRING,
                          leased_until=_OPT_STRING), "nullable": True},
        # Any JSON value for oncall and up (text when the stored body is not strict JSON).
        "payload": {"nullable": True}},
        "required": [*_RECEIPT["required"], "body_sha256", "attempt_rows", "last_error",
                     "conflicts", "deliveries", "audit", "job"]}
    pending = {**_RECEIPT, "properties": {**_RECEIPT["properties"], "age_seconds": _NUMBER},
               "required": [*_RECEIPT["required"], "age_seconds"]}
    overdue = _record(scope=_STRING, integration=_STRING, event_id=_STRING,
                      event_type=_STRING, run_at=_STRING, attempts=_INT)
    finding = _record(id=_INT, kind=_STRING, subject=_STRING, detail=_OPT_STRING,
                      first_seen=_STRING, last_seen=_STRING, resolved_at=_OPT_STRING)
    stuck_item = _record(scope=_STRING, integration=_STRING, event_id=_STRING,
                         event_type=_STRING, reason=_STRING)
    retrying = _record(scope=_STRING, integration=_STRING, event_id=_STRING,
                       event_type=_STRING, run_at=_STRING, attempts=_INT, max_attempts=_INT,
                       last_error=_OPT_STRING)
    stuck = _record(stuck=_list(stuck_item), retrying=_list(retrying), live_workers=_INT,
                    pending=_list(pending), overdue_jobs=_list(overdue),
                    findings=_list(finding), threshold_seconds=_INT)
    credentials = _record(closed=True, integration=_STRING, scope=_STRING,
                          credentials=_list(_CREDENTIAL))
    capacity = _record(receipts=_INT, bytes_per_receipt_measured=_NUMBER,
                       retention_days=_NUMBER, events_per_day=_NUMBER, projected_bytes=_NUMBER)
    audit_params = [("actor", ""), ("action", ""), ("scope", ""), ("since", ""),
                    ("until", ""), ("limit", ""), ("cursor", "")]
    return {
        "/api/v1/me": _read("The caller's username and role", me),
        "/api/v1/overview": _read("Headline numbers, scopes with rollups, instances, job runs",
                                  overview, [("cursor", "")]),
        "/api/v1/receipts": _read("Receipts, keyset paged", _RECEIPT_PAGE, _RECEIPT_FILTERS),
        "/api/v1/receipts/{integration}/{event_id}": _read(
            "One receipt with attempts, conflicts, audit rows; payload for oncall and up",
            receipt, path_params=("integration", "event_id")),
        "/api/v1/failures": _read("Failed receipts with their last error and a capped total",
                                  _page_of(_FAILURE, total=_INT, total_capped=_BOOL),
                                  _RECEIPT_FILTERS),
        "/api/v1/stuck": _read("Stuck pending receipts, overdue jobs, open findings", stuck),
        "/api/v1/conflicts": _read("Conflicts, newest first", _page_of(
            {**_CONFLICT, "properties": {**_CONFLICT["properties"], "scope": _STRING,
                                         "integration": _STRING}}),
                                   [("scope", ""), ("open", "1: unacknowledged only"),
                                    ("limit", ""), ("cursor", "")]),
        "/api/v1/integrations": _read("Integrations by scope", _page_of(_INTEGRATION),
                                      [("account", ""), ("limit", ""), ("cursor", "")]),
        "/api/v1/integrations/{integration}/credentials": _read(
            "An integration's credentials (never a secret)", credentials,
            path_params=("integration",)),
        "/api/v1/deliveries": _read(
            "The delivery log, newest first: every request to /hooks/, refusals included",
            _page_of(_DELIVERY), _DELIVERY_FILTERS),
        "/api/v1/destinations": _read(
            "Destinations with state, success rate, p95 latency, backlog, latest failures",
            _record(closed=True, destinations=_list(_DESTINATION)),
            [("integration", "an integration id (`in_…`)")]),
        "/api/v1/audit": _read("Audit rows, newest first", _page_of(_AUDIT_ROW), audit_params),
        "/api/v1/audit/verify": _read(
            "Hash-chain verification, a chunk of rows per request: `ok` is null while"
            " `next` names the row to continue `after`", verify,
            [("after", "verify the rows after this id, linked to the stored hash before"
              " them (0, the default, starts the chain)")]),
        "/api/v1/capacity": _read("Capacity equation inputs and projection", capacity),
    }


def document() -> dict[str, Any]:
    """Return the OpenAPI document."""
    return {"openapi": "3.0.3",
            "info": {"title": "Replay Ledger", "version": "1",
                     "description": "Authenticated, scoped, exactly-once webhook intake."},
            "components": {"securitySchemes": {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "`ledger operator token --username U [--write] "
                                         "--json`: read-only unless --write; expires "
                                         "(90 days by default)"},
                "session": {"type": "apiKey", "in": "cookie", "name": "ledger_session"}}},
            "security": [{"token": []}, {"session": []}],
            "paths": {"/hooks/{integration}": _intake(), **_ops(), **_api()}}


@bp.get("/openapi.json")
def openapi() -> Response:
    """Serve the OpenAPI document (public: it describes, it reveals nothing)."""
    return jsonify(document())
