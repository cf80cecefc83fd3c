"""GET /openapi.json: an OpenAPI 3 description of the intake and the /api/v1 reads."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify

bp = Blueprint("openapi", __name__)

_ERROR = {"type": "object", "properties": {"error": {"type": "string"},
                                           "detail": {"type": "string"}},
          "required": ["error"]}
_PAGE = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "object"}},
    "next_cursor": {"type": "string", "nullable": True}}, "required": ["items", "next_cursor"]}
_RECEIPT_FILTERS = [
    ("scope", "`account/integration` or an integration id (`in_…`)"),
    ("state", "pending, complete or failed"), ("event_type", "exact event type"),
    ("since", "ISO 8601, UTC when no offset"), ("until", "ISO 8601, exclusive"),
    ("prefix", "event id prefix"), ("limit", "1-200, default 50"),
    ("cursor", "next_cursor of the previous page")]


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """Return an OpenAPI response object with a JSON body."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _query(names: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Return query parameter objects."""
    return [{"name": n, "in": "query", "required": False, "description": d,
             "schema": {"type": "string"}} for n, d in names]


def _intake() -> dict[str, Any]:
    """Describe POST /hooks/{integration}."""
    answer = {"type": "object", "properties": {
        "status": {"type": "string", "enum": ["accepted", "duplicate", "conflict"]},
        "event_id": {"type": "string"}, "state": {"type": "string"},
        "result_ref": {"type": "string"}}}
    return {"post": {
        "summary": "Receive one signed webhook delivery",
        "description": "Checks in order: body size, integration, signature and freshness, "
                       "scope, event id and type; then one transaction writes the receipt "
                       "and the job. No 2xx before commit.",
        "parameters": [{"name": "integration", "in": "path", "required": True,
                        "schema": {"type": "string", "pattern": "^in_[0-9A-Za-z]{22}$"}}],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"type": "object"}}}},
        "security": [],
        "responses": {
            "200": _json(answer, "duplicate of a complete or failed receipt"),
            "202": _json(answer, "accepted, or duplicate of a pending receipt"),
            "400": _json(_ERROR, "invalid_event"), "401": _json(_ERROR, "unauthenticated"),
            "404": _json(_ERROR, "unknown_integration"),
            "409": _json(answer, "same scope and id, different body"),
            "413": _json(_ERROR, "body_too_large"),
            "503": _json(_ERROR, "unavailable (Retry-After)")}}}


def _read(summary: str, schema: dict[str, Any], params: list[tuple[str, str]] | None = None,
          path_params: tuple[str, ...] = ()) -> dict[str, Any]:
    """Describe one GET of /api/v1."""
    parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in path_params] + _query(params or [])
    return {"get": {"summary": summary, "parameters": parameters, "responses": {
        "200": _json(schema, "OK"), "400": _json(_ERROR, "bad_request"),
        "401": _json(_ERROR, "unauthenticated"), "404": _json(_ERROR, "not_found")}}}


def document() -> dict[str, Any]:
    """Return the OpenAPI document."""
    obj = {"type": "object"}
    audit_params = [("actor", ""), ("action", ""), ("scope", ""), ("since", ""),
                    ("until", ""), ("limit", ""), ("cursor", "")]
    paths = {
        "/hooks/{integration}": _intake(),
        "/api/v1/me": _read("The caller's username and role", obj),
        "/api/v1/overview": _read("Headline numbers, scopes with rollups, instances, job runs",
                                  obj, [("cursor", "")]),
        "/api/v1/receipts": _read("Receipts, keyset paged", _PAGE, _RECEIPT_FILTERS),
        "/api/v1/receipts/{integration}/{event_id}": _read(
            "One receipt with attempts, conflicts, audit rows; payload for oncall and up",
            obj, path_params=("integration", "event_id")),
        "/api/v1/failures": _read("Failed receipts with their last error and a capped total",
                                  _PAGE, _RECEIPT_FILTERS),
        "/api/v1/stuck": _read("Stuck pending receipts, overdue jobs, open findings", obj),
        "/api/v1/conflicts": _read("Conflicts, newest first", _PAGE,
                                   [("scope", ""), ("open", "1: unacknowledged only"),
                                    ("limit", ""), ("cursor", "")]),
        "/api/v1/integrations": _read("Integrations by scope", _PAGE,
                                      [("account", ""), ("limit", ""), ("cursor", "")]),
        "/api/v1/integrations/{integration}/credentials": _read(
            "An integration's credentials (never a secret)", obj,
            path_params=("integration",)),
        "/api/v1/audit": _read("Audit rows, newest first", _PAGE, audit_params),
        "/api/v1/audit/verify": _read("Hash-chain verification", obj),
        "/api/v1/capacity": _read("Capacity equation inputs and projection", obj),
    }
    return {"openapi": "3.0.3",
            "info": {"title": "Replay Ledger", "version": "1"},
            "components": {"securitySchemes": {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "`ledger operator token --username U --json`"},
                "session": {"type": "apiKey", "in": "cookie", "name": "ledger_session"}}},
            "security": [{"token": []}, {"session": []}],
            "paths": paths}


@bp.get("/openapi.json")
def openapi():  # type: ignore[no-untyped-def]
    """Serve the OpenAPI document (public: it describes, it reveals nothing)."""
    return jsonify(document())
