"""Schema fuzzing: schemathesis drives a live server (both databases) from /openapi.json.

Every documented operation is called with generated inputs (a viewer's API token for the
/api/v1 reads); the server must never answer 5xx, and every answer must have a documented
status, content type, headers and a body matching its schema. Bounded: few examples each.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from datetime import UTC, datetime

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app import create_app
from ledger.access import audit
from ledger.access.operators import create_operator, issue_token
from ledger.intake.signatures import get_profile
from ledger.web.openapi import document
from tests.conftest import TEST_MASTER_KEY, _pg_or_skip
from tests.helpers import Sender, deliver, make_sender
from tests.servers import thread_server

TOKENS: dict[str, str] = {}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzzed_server(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One server per database for the whole module, with data, a sender and a token.

    Sharing the server across operations keeps this module to seconds; fuzzed
    deliveries that happen to be valid events only add receipts to read.
    """
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp / "ledger.sqlite3")
        urls = iter([f"sqlite:///{tmp / 'ledger.sqlite3'}"])
    else:
        urls = _pg_or_skip(request)
    url = next(urls)
    app = create_app({"DATABASE_URL": url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
                      "LEDGER_VAR_DIR": str(tmp), "LEDGER_SECRET_KEY": "fuzz",
                      "LEDGER_DEMO_HANDLERS": "1", "LEDGER_LOG_LEVEL": "WARNING"})
    try:
        sender, token = _seed(app)
        with app.extensions["ledger"].engine.begin() as conn:
            actor = audit.Actor(name="test", role="admin")
            create_operator(conn, actor, username="pager", role="oncall",
                            password="pager-password-123", now=datetime.now(UTC))
            TOKENS["oncall"] = issue_token(conn, actor, "pager", now=datetime.now(UTC)).token
        app.extensions["ledger"].delivery_log.flush(everything=True)  # rows for /deliveries
        with thread_server(app) as base_url:
            yield base_url, sender, token
    finally:
        app.extensions["ledger"].close()
        for _ in urls:  # drop the PostgreSQL database
            pass


def _seed(app) -> tuple[Sender, str]:  # type: ignore[no-untyped-def]
    """Deliver a few events and a conflict; return the sender and a viewer's API token."""
    sender = make_sender(app)
    client = app.test_client()
    for n in range(3):
        assert deliver(client, sender, f"evt_fuzz_{n}").status_code == 202
    assert deliver(client, sender, "evt_fuzz_0", data={"amount": 5}).status_code == 409
    actor = audit.Actor(name="test", role="admin")
    with app.extensions["ledger"].engine.begin() as conn:
        create_operator(conn, actor, username="fuzzer", role="viewer",
                        password="fuzzer-password-123", now=datetime.now(UTC))
        return sender, issue_token(conn, actor, "fuzzer", now=datetime.now(UTC)).token


def test_the_served_document_is_the_one_fuzzed(fuzzed_server):  # type: ignore[no-untyped-def]
    """The server serves exactly the document the cases below are generated from."""
    base_url, _sender, _token = fuzzed_server
    assert requests.get(f"{base_url}/openapi.json", timeout=10).json() == document()


# The document is static, so the cases are generated from it at collection time.
schema = schemathesis.openapi.from_dict(document())


@schema.parametrize()
@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_matches_its_document(case, fuzzed_server):  # type: ignore[no-untyped-def]
    """No 5xx; status, content type, headers and body as documented."""
    base_url, sender, token = fuzzed_server
    headers = {"Authorization": f"Bearer {token}"} if case.path.startswith("/api/") else {}
    if case.path == "/hooks/{integration}":
        headers = aim_at_the_sender(case, sender)
    case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)


def aim_at_the_sender(case, sender: Sender) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Send two thirds of the intake cases to the real integration, half of those signed.

    Generated ids name no integration (404); aimed at the real one, an unsigned body
    is refused (401) and a signed one runs validation (400) or is accepted (2xx).
    The signature covers the body as requests serialises `json=` (json.dumps).
    """
    if not isinstance(case.body, dict):
        return {}
    pick = hashlib.sha256(repr(case.body).encode()).digest()[0] % 3
    if pick == 0:
        return {}
    case.path_parameters["integration"] = sender.public_id
    if pick == 1:
        return {}
    raw = json.dumps(case.body, allow_nan=False).encode()
    return get_profile("stripe").sign(sender.secret, raw, event_id="", event_type="",
                                      timestamp=int(time.time()))


API_READS = sorted(p for p in document()["paths"] if p.startswith("/api/v1/"))


def _ok_schema(path: str) -> dict:  # type: ignore[type-arg]
    """Return the documented body of a read's 200 answer."""
    ok = document()["paths"][path]["get"]["responses"]["200"]
    return ok["content"]["application/json"]["schema"]


def _all_objects_typed(schema: dict) -> bool:  # type: ignore[type-arg]
    """Tell whether an object schema names its keys (a bare {"type": "object"} checks nothing)."""
    if schema.get("type") == "array":
        return _all_objects_typed(schema["items"])
    if schema.get("type") != "object":
        return True
    return bool(schema.get("required")) and all(
        _all_objects_typed(s) for name, s in schema.get("properties", {}).items()
        if name != "counts")  # counts: one integer per state, keyed by state


@pytest.mark.parametrize("path", API_READS)
def test_every_api_read_documents_the_keys_of_its_body(path):  # type: ignore[no-untyped-def]
    assert _all_objects_typed(_ok_schema(path)), path


@pytest.mark.parametrize("role", ["viewer", "oncall"])
@pytest.mark.parametrize("path", API_READS)
def test_every_api_read_of_real_records_matches_its_document(fuzzed_server, path, role):  # type: ignore[no-untyped-def]
    """Fuzzed ids name no record (404): read the seeded ones, so every 200 body is checked."""
    base_url, sender, token = fuzzed_server
    values = {"integration": sender.public_id, "event_id": "evt_fuzz_0"}
    case = schema[path]["GET"].Case(
        path_parameters={k: v for k, v in values.items() if "{" + k + "}" in path})
    bearer = token if role == "viewer" else TOKENS["oncall"]
    response = case.call_and_validate(base_url=base_url, checks=CHECKS,
                                      headers={"Authorization": f"Bearer {bearer}"})
    assert response.status_code == 200, response.text
