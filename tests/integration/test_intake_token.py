"""The `token` profile (CONTRACT section 2, "Shared-secret senders") over real HTTP on both
databases: a token in a header, a query parameter or Basic auth, every live credential,
ids and types from where the operator says, the digest id, and plain HTTP in production."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from sqlalchemy import select

from ledger.access import audit
from ledger.access.credentials import add_credential, revoke_credential
from ledger.access.integrations import get_integration
from ledger.db.schema import receipts
from tests.helpers import Sender, ledger_counts, make_sender, send_http
from tests.servers import thread_server

NOTHING = {"receipts": 0, "jobs": 0, "conflicts": 0}
JSON = {"Content-Type": "application/json"}
SECRET = "postmark-shared-token-0123456789"


def token_sender(app: Any, secret: str = SECRET, **options: Any) -> Sender:
    """Connect a shared-token sender with these token options."""
    return make_sender(app, name="tok", profile="token", secret=secret, hmac_options=options)


def receipt_rows(app: Any) -> list[tuple[str, str]]:
    """Return (event id, type) of every receipt."""
    with app.extensions["ledger"].engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            select(receipts.c.event_id, receipts.c.event_type).order_by(receipts.c.event_id))]


def test_header_token_with_id_and_type_headers(app, live) -> None:
    """The token in a header; id and type from headers; a retry is a duplicate."""
    sender = token_sender(app, token_header="X-Postmark-Token", id_header="X-Message-Id",
                          type_header="X-Record-Type")
    headers = {"X-Postmark-Token": SECRET, "X-Message-Id": "m-1", "X-Record-Type": "Delivery"}
    body = b'{"RecordType": "Delivery"}'
    assert send_http(live, sender, body, headers).status_code == 202
    assert send_http(live, sender, body, headers).json()["status"] == "duplicate"
    assert receipt_rows(app) == [("m-1", "Delivery")]
    for wrong in ({**headers, "X-Postmark-Token": SECRET + "x"},
                  {k: v for k, v in headers.items() if k != "X-Postmark-Token"}):
        assert send_http(live, sender, body, wrong).status_code == 401
    assert ledger_counts(app)["receipts"] == 1


def test_query_token_with_body_id_path_and_type_path(app, live) -> None:
    """The token in a query parameter; id and type from dotted body paths."""
    sender = make_sender(app, name="tok", profile="token", secret=SECRET,
                         hmac_options={"token_query": "key", "id_path": "data.id"},
                         type_path="data.kind")
    body = json.dumps({"data": {"id": "evt-7", "kind": "order.paid"}}).encode()
    assert send_http(live, sender, body, query=f"?key={SECRET}&x=1").status_code == 202
    assert receipt_rows(app) == [("evt-7", "order.paid")]
    assert send_http(live, sender, body, query="?key=nope").status_code == 401
    assert send_http(live, sender, body, query=f"?key={SECRET}&key={SECRET}").status_code == 401
    assert send_http(live, sender, body, {"key": SECRET}).status_code == 401  # not the query


def test_basic_auth_without_an_id_gets_the_digest_id_and_a_fixed_type(app, live) -> None:
    """Basic auth (the secret is user:password); no id given: the body-digest id."""
    sender = make_sender(app, name="tok", profile="token", secret="hooks:s3cret-pass",
                         hmac_options={"basic": True}, event_type="inbound.mail")
    body = b'{"From": "a@example.com"}'
    first = send_http(live, sender, body, auth=("hooks", "s3cret-pass"))
    assert first.status_code == 202, first.json()
    assert first.json()["event_id"].startswith("sha256:")
    assert send_http(live, sender, body, auth=("hooks", "s3cret-pass")).json()["status"] == (
        "duplicate")
    assert [t for _, t in receipt_rows(app)] == ["inbound.mail"]
    assert send_http(live, sender, body, auth=("hooks", "wrong")).status_code == 401
    bearer = {"Authorization": "Bearer " + base64.b64encode(b"hooks:s3cret-pass").decode()}
    assert send_http(live, sender, body, bearer).status_code == 401


def test_every_live_credential_is_accepted_and_a_revoked_one_is_not(app, live) -> None:
    """Rotation: both live tokens work; a revoked one gets 401 and writes nothing."""
    sender = token_sender(app, token_header="X-Token", id_path="id")
    svc = app.extensions["ledger"]
    actor = audit.Actor(name="test", role="admin")
    with svc.engine.begin() as conn:
        integration = get_integration(conn, sender.public_id)
        second = add_credential(conn, svc.box, actor, integration, now=svc.clock.now(),
                                secret="second-token-abcdefghijkl")
    assert send_http(live, sender, b'{"id": "a", "type": "t"}', {"X-Token": SECRET}).ok
    assert send_http(live, sender, b'{"id": "b", "type": "t"}',
                {"X-Token": "second-token-abcdefghijkl"}).ok
    with svc.engine.begin() as conn:
        revoke_credential(conn, actor, second.key_id, reason="leaked", now=svc.clock.now())
    svc.view.invalidate()  # as the propagation bound's expiry does
    refused = send_http(live, sender, b'{"id": "c", "type": "t"}',
                   {"X-Token": "second-token-abcdefghijkl"})
    assert refused.status_code == 401
    assert sorted(i for i, _ in receipt_rows(app)) == ["a", "b"]


def test_the_body_digest_guard_applies(app, live) -> None:
    """The token signs nothing: the same body under a fresh id is the original's duplicate."""
    sender = token_sender(app, token_header="X-Token", id_header="X-Id")
    body = b'{"type": "t", "amount": 5}'
    assert send_http(live, sender, body, {"X-Token": SECRET, "X-Id": "first"}).status_code == 202
    replay = send_http(live, sender, body, {"X-Token": SECRET, "X-Id": "second"})
    assert replay.json()["status"] == "duplicate"
    assert replay.json()["event_id"] == "first"
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 1}


@pytest.fixture
def production_env(test_env: dict[str, str]) -> dict[str, str]:
    """A production process, one trusted proxy in front."""
    return {**test_env, "LEDGER_ENV": "production", "LEDGER_LOG_HASH_KEY": "log-hash-key",
            "LEDGER_TRUSTED_PROXIES": "1"}


def test_production_refuses_a_token_over_plain_http_unless_allowed(production_env) -> None:
    """Plain HTTP: 401 with nothing written; HTTPS said by the trusted proxy, or
    --allow-plaintext: accepted."""
    from app import create_app

    app = create_app(production_env)
    try:
        strict = token_sender(app, token_header="X-Token", id_path="id")
        relaxed = make_sender(app, name="tok-plain", profile="token", secret=SECRET,
                              hmac_options={"token_header": "X-Token", "id_path": "id",
                                            "allow_plaintext": True})
        with thread_server(app) as live:
            body = b'{"id": "p-1", "type": "t"}'
            assert send_http(live, strict, body, {"X-Token": SECRET}).status_code == 401
            assert ledger_counts(app) == NOTHING
            assert send_http(live, relaxed, body, {"X-Token": SECRET}).status_code == 202
            proxied = send_http(live, strict, body,
                                {"X-Token": SECRET, "X-Forwarded-Proto": "https"})
            assert proxied.status_code == 202
    finally:
        app.extensions["ledger"].close()


def test_a_clients_own_forwarded_proto_is_not_trusted(production_env) -> None:
    """Without a trusted proxy, X-Forwarded-Proto from the client changes nothing."""
    from app import create_app

    app = create_app({**production_env, "LEDGER_TRUSTED_PROXIES": "0"})
    try:
        sender = token_sender(app, token_header="X-Token", id_path="id")
        with thread_server(app) as live:
            body = b'{"id": "p-1", "type": "t"}'
            forged = send_http(live, sender, body,
                               {"X-Token": SECRET, "X-Forwarded-Proto": "https"})
            assert forged.status_code == 401
            assert ledger_counts(app) == NOTHING
    finally:
        app.extensions["ledger"].close()


CREATE = ["ledger", "integration", "create", "--account", "acme", "--json"]


def test_cli_creates_token_integrations_and_refuses_stray_flags(app, runner, live) -> None:
    """`integration create --profile token` (CONTRACT section 4); a Basic secret is
    generated as user:password; flags of another profile are usage errors."""
    made = runner.invoke(args=[*CREATE, "--name", "pm", "--profile", "token", "--basic",
                               "--id-path", "MessageID", "--event-type", "inbound"])
    assert made.exit_code == 0, made.output
    out = json.loads(made.output)
    user, _, password = out["credential"]["secret"].partition(":")
    assert user and password
    sender = Sender(out["integration"], "token", out["credential"]["secret"], "acme/pm", 0, "")
    body = b'{"MessageID": "b7bc2f4a-e38e", "From": "a@example.com"}'
    assert send_http(live, sender, body, auth=(user, password)).status_code == 202
    assert receipt_rows(app) == [("b7bc2f4a-e38e", "inbound")]
    for args, code in ((["--profile", "stripe", "--token-header", "X-T"], 2),
                       (["--profile", "hmac", "--basic", "--signature-header", "x"], 2),
                       (["--profile", "token"], 1),
                       (["--profile", "token", "--basic", "--token-query", "k"], 1),
                       (["--profile", "token", "--token-header", "bad header"], 1),
                       (["--profile", "token", "--token-header", "X-T", "--type-header", "X-Y",
                         "--event-type", "x"], 1)):
        refused = runner.invoke(args=[*CREATE, "--name", "other", *args])
        assert refused.exit_code == code, (args, refused.output)
    assert ledger_counts(app)["receipts"] == 1


def test_integration_create_help_says_a_token_authenticates_the_sender_not_the_body(
        runner) -> None:
    """The operator is told what a shared token does and does not prove."""
    shown = runner.invoke(args=["ledger", "integration", "create", "--help"]).output
    assert "token" in shown and "not the body" in shown


def test_integration_create_text_output_warns_a_token_signs_nothing(runner) -> None:
    """Without --json, creating a token integration says what the token proves."""
    args = ["ledger", "integration", "create", "--account", "acme", "--name", "t",
            "--profile", "token", "--token-header", "X-Token"]
    shown = runner.invoke(args=args)
    assert shown.exit_code == 0, shown.output
    assert "authenticates the sender, not the body" in shown.output
