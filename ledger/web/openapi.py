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
_PAGE = {"type": "object", "properties": {
    "items": {"type": "array", "items": _OBJECT},
    "next_cursor": {"type": "string", "nullable": True}}, "required": ["items", "next_cursor"]}
_RECEIPT_PAGE = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "object", "properties": {
        "scope": _STRING, "integration": _STRING, "event_id": _STRING,
        "event_type": _STRING, "state": {"type": "string", "enum": STATES}},
        "required": ["scope", "event_id", "state"]}},
    "next_cursor": {"type": "string", "nullable": True}}, "required": ["items", "next_cursor"]}
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
                       "integration's profile (standard-webhooks, stripe, github).",
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
                             "operationId": "metrics", "responses": {"200": {
                                 "description": "metrics of every process of this server",
                                 "headers": _REQUEST_ID,
                                 "content": {"text/plain": {"schema": _STRING}}}}}},
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
    verify = {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "rows": {"type": "integer"},
        "first_bad": {"type": "integer", "nullable": True}}, "required": ["ok", "rows"]}
    audit_params = [("actor", ""), ("action", ""), ("scope", ""), ("since", ""),
                    ("until", ""), ("limit", ""), ("cursor", "")]
    return {
        "/api/v1/me": _read("The caller's username and role", me),
        "/api/v1/overview": _read("Headline numbers, scopes with rollups, instances, job runs",
                                  _OBJECT, [("cursor", "")]),
        "/api/v1/receipts": _read("Receipts, keyset paged", _RECEIPT_PAGE, _RECEIPT_FILTERS),
        "/api/v1/receipts/{integration}/{event_id}": _read(
            "One receipt with attempts, conflicts, audit rows; payload for oncall and up",
            _OBJECT, path_params=("integration", "event_id")),
        "/api/v1/failures": _read("Failed receipts with their last error and a capped total",
                                  _RECEIPT_PAGE, _RECEIPT_FILTERS),
        "/api/v1/stuck": _read("Stuck pending receipts, overdue jobs, open findings", _OBJECT),
        "/api/v1/conflicts": _read("Conflicts, newest first", _PAGE,
                                   [("scope", ""), ("open", "1: unacknowledged only"),
                                    ("limit", ""), ("cursor", "")]),
        "/api/v1/integrations": _read("Integrations by scope", _PAGE,
                                      [("account", ""), ("limit", ""), ("cursor", "")]),
        "/api/v1/integrations/{integration}/credentials": _read(
            "An integration's credentials (never a secret)", _OBJECT,
            path_params=("integration",)),
        "/api/v1/audit": _read("Audit rows, newest first", _PAGE, audit_params),
        "/api/v1/audit/verify": _read("Hash-chain verification", verify),
        "/api/v1/capacity": _read("Capacity equation inputs and projection", _OBJECT),
    }


def document() -> dict[str, Any]:
    """Return the OpenAPI document."""
    return {"openapi": "3.0.3",
            "info": {"title": "Replay Ledger", "version": "1",
                     "description": "Authenticated, scoped, exactly-once webhook intake."},
            "components": {"securitySchemes": {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "`ledger operator token --username U --json`"},
                "session": {"type": "apiKey", "in": "cookie", "name": "ledger_session"}}},
            "security": [{"token": []}, {"session": []}],
            "paths": {"/hooks/{integration}": _intake(), **_ops(), **_api()}}


@bp.get("/openapi.json")
def openapi() -> Response:
    """Serve the OpenAPI document (public: it describes, it reveals nothing)."""
    return jsonify(document())
