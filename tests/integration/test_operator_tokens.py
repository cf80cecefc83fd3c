"""API tokens (issue 14, finding 1): read-only unless --write, expiring, listed, revoked one
by one; no token manages credentials, operators or tokens; every such dashboard form asks
for the password again; revoking the last live key is confirmed first."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from ledger.clock import FixedClock
from ledger.db.schema import api_tokens, audit_log, credentials, operators, receipts
from tests.dashboard_helpers import (
    PASSWORD,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    login,
    make_operator,
    make_token,
    post,
)
from tests.helpers import make_sender

TOKEN_ONLY_FORBIDDEN = {"error": "forbidden"}
SECRET = re.compile(r'<pre class="secret">([^<]+)</pre>')


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _count(app, table) -> int:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _json(result, code: int = 0) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert result.exit_code == code, result.output
    return json.loads(result.output)


def _credential_states(app, integration_id: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return dict(conn.execute(select(credentials.c.key_id, credentials.c.state)  # type: ignore[arg-type]
                                 .where(credentials.c.integration_id == integration_id)).all())


@pytest.mark.parametrize("write", [False, True])
def test_no_token_adds_rotates_or_revokes_credentials(app, write: bool) -> None:  # type: ignore[no-untyped-def]
    """The reported attack: a security operator's token asked "Add a key" for a secret."""
    sender = make_sender(app)
    make_operator(app, "sec", "security")
    headers = _bearer(make_token(app, "sec", write=write))
    client = app.test_client()
    before = _count(app, credentials)
    for action, form in (("add", {"reason": "mine now"}),
                         ("rotate", {"reason": "mine", "overlap": "0", "password": "x"}),
                         ("revoke", {"key_id": sender.key_id, "reason": "x",
                                     "confirm_last": "1", "password": "x"})):
        answer = client.post(f"/credentials/{sender.public_id}/{action}", data=form,
                             headers=headers)
        assert answer.status_code == 403, action
        assert answer.get_json() == TOKEN_ONLY_FORBIDDEN, action
        assert "secret" not in answer.get_data(as_text=True)
    assert _count(app, credentials) == before
    assert _credential_states(app, sender.scope_id) == {sender.key_id: "active"}
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(audit_log)
                            .where(audit_log.c.actor == "sec")).scalar_one() == 0


@pytest.mark.parametrize("write", [False, True])
def test_no_token_manages_operators_or_tokens(app, write: bool) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "root", "admin")
    make_operator(app, "victim", "viewer")
    headers = _bearer(make_token(app, "root", write=write))
    victim_token = make_token(app, "victim")
    with app.extensions["ledger"].engine.connect() as conn:
        victim_token_id = conn.execute(select(api_tokens.c.public_id)
                                       .order_by(api_tokens.c.id.desc())).scalars().first()
    ops, tokens = _count(app, operators), _count(app, api_tokens)
    client = app.test_client()
    for path, form in (("/operators", {"username": "mallory", "role": "admin"}),
                       ("/operators/victim/role", {"role": "admin"}),
                       ("/operators/victim/disable", {"reason": "x"}),
                       ("/operators/root/token", {"write": "1"}),
                       (f"/tokens/{victim_token_id}/revoke", {})):
        answer = client.post(path, data={**form, "password": PASSWORD}, headers=headers)
        assert answer.status_code == 403, path
        assert answer.get_json() == TOKEN_ONLY_FORBIDDEN, path
    assert (_count(app, operators), _count(app, api_tokens)) == (ops, tokens)
    me = client.get("/api/v1/me", headers=_bearer(victim_token)).get_json()
    assert me == {"username": "victim", "role": "viewer"}  # not promoted, not revoked


def test_read_token_gets_403_for_every_method_but_get_and_head(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_failed", state=2)
    make_operator(app, "pager", "oncall")
    headers = _bearer(make_token(app, "pager"))
    client = app.test_client()
    assert client.get("/api/v1/me", headers=headers).status_code == 200
    assert client.head("/api/v1/me", headers=headers).status_code == 200
    form = {"scope": sender.scope, "event_id": "evt_failed", "reason": "retry"}
    for method in ("post", "put", "patch", "delete", "options"):
        answer = getattr(client, method)("/failures/requeue", data=form, headers=headers)
        assert answer.status_code == 403, method
        assert answer.get_json() == TOKEN_ONLY_FORBIDDEN, method
    with app.extensions["ledger"].engine.connect() as conn:
        state = conn.execute(select(receipts.c.state)
                             .where(receipts.c.event_id == "evt_failed")).scalar_one()
    assert state == 2  # still failed: nothing was requeued


def test_write_token_may_requeue_without_csrf(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_failed", state=2)
    make_operator(app, "pager", "oncall")
    answer = app.test_client().post(
        "/failures/requeue", headers=_bearer(make_token(app, "pager", write=True)),
        data={"scope": sender.scope, "event_id": "evt_failed", "reason": "retry"})
    assert answer.status_code == 200
    with app.extensions["ledger"].engine.connect() as conn:
        state = conn.execute(select(receipts.c.state)
                             .where(receipts.c.event_id == "evt_failed")).scalar_one()
    assert state == 0  # pending again


def test_an_unknown_token_posting_gets_401_not_a_redirect(app) -> None:  # type: ignore[no-untyped-def]
    answer = app.test_client().post("/failures/requeue", headers=_bearer("rlt_forged"))
    assert answer.status_code == 401 and answer.get_json() == {"error": "unauthenticated"}


def test_cli_token_is_read_only_and_expires_in_90_days_by_default(app, runner) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "robot", "viewer")
    before = datetime.now(UTC)
    body = _json(runner.invoke(args=["ledger", "operator", "token", "--username", "robot",
                                     "--json"]))
    assert set(body) == {"username", "token", "token_id", "scopes", "expires_at"}
    assert body["scopes"] == ["read"] and re.fullmatch(r"tok_[0-9A-Za-z]{22}", body["token_id"])
    expires = datetime.fromisoformat(body["expires_at"])
    assert before + timedelta(days=90) <= expires <= datetime.now(UTC) + timedelta(days=90)
    written = _json(runner.invoke(args=["ledger", "operator", "token", "--username", "robot",
                                        "--write", "--expires-in", "3600", "--json"]))
    assert written["scopes"] == ["read", "write"]
    assert datetime.fromisoformat(written["expires_at"]) <= datetime.now(UTC) + timedelta(
        seconds=3600)
    with app.extensions["ledger"].engine.connect() as conn:
        details = [json.loads(d) for d in conn.execute(
            select(audit_log.c.detail).where(audit_log.c.action == "operator.token")
            .order_by(audit_log.c.id)).scalars()]
    assert [(d["token_id"], d["scopes"]) for d in details] == [
        (body["token_id"], ["read"]), (written["token_id"], ["read", "write"])]
    assert body["token"] not in json.dumps(details)
    for bad in ("0", "-5", "soon", str(366 * 86400)):
        usage = runner.invoke(args=["ledger", "operator", "token", "--username", "robot",
                                    "--expires-in", bad, "--json"])
        assert usage.exit_code == 2, bad


def test_token_stops_working_when_it_expires(test_env) -> None:  # type: ignore[no-untyped-def]
    from app import create_app

    clock = FixedClock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    app = create_app(test_env, clock=clock)
    try:
        make_operator(app, "robot", "viewer")
        headers = _bearer(make_token(app, "robot", expires_in=60))
        client = app.test_client()
        assert client.get("/api/v1/me", headers=headers).status_code == 200
        clock.advance(59)
        assert client.get("/api/v1/me", headers=headers).status_code == 200
        clock.advance(1)
        assert client.get("/api/v1/me", headers=headers).status_code == 401
    finally:
        app.extensions["ledger"].close()


def test_tokens_list_last_use_at_most_once_a_minute_and_never_the_token(test_env) -> None:  # type: ignore[no-untyped-def]
    from app import create_app

    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    clock = FixedClock(start)
    app = create_app(test_env, clock=clock)
    try:
        make_operator(app, "robot", "viewer")
        token = make_token(app, "robot")
        runner = app.test_cli_runner()
        listed = _json(runner.invoke(args=["ledger", "operator", "tokens", "--username",
                                           "robot", "--json"]))
        assert token not in json.dumps(listed)
        [item] = listed["tokens"]
        assert set(item) == {"token_id", "scopes", "created_at", "expires_at",
                             "last_used_at", "revoked_at"}
        assert item["last_used_at"] is None and item["revoked_at"] is None
        client = app.test_client()

        def last_used() -> str:
            out = _json(runner.invoke(args=["ledger", "operator", "tokens", "--username",
                                            "robot", "--json"]))
            return out["tokens"][0]["last_used_at"]

        clock.advance(5)
        client.get("/api/v1/me", headers=_bearer(token))
        first = last_used()
        assert datetime.fromisoformat(first) == start + timedelta(seconds=5)
        for _ in range(3):  # reads within the minute do not write again
            clock.advance(15)
            client.get("/api/v1/me", headers=_bearer(token))
        assert last_used() == first
        clock.advance(20)
        client.get("/api/v1/me", headers=_bearer(token))
        assert datetime.fromisoformat(last_used()) == start + timedelta(seconds=70)
    finally:
        app.extensions["ledger"].close()


def test_token_revoke_stops_one_token_only_and_is_audited(app, runner) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "robot", "viewer")
    first = _json(runner.invoke(args=["ledger", "operator", "token", "--username", "robot",
                                      "--json"]))
    second = _json(runner.invoke(args=["ledger", "operator", "token", "--username", "robot",
                                       "--json"]))
    revoked = _json(runner.invoke(args=["ledger", "operator", "token-revoke", "--token-id",
                                        first["token_id"], "--json"]))
    assert set(revoked) == {"token_id", "revoked_at"}
    assert revoked["token_id"] == first["token_id"]
    client = app.test_client()
    assert client.get("/api/v1/me", headers=_bearer(first["token"])).status_code == 401
    assert client.get("/api/v1/me", headers=_bearer(second["token"])).status_code == 200
    listed = _json(runner.invoke(args=["ledger", "operator", "tokens", "--username", "robot",
                                       "--json"]))
    states = {t["token_id"]: t["revoked_at"] for t in listed["tokens"]}
    assert states == {first["token_id"]: revoked["revoked_at"], second["token_id"]: None}
    again = runner.invoke(args=["ledger", "operator", "token-revoke", "--token-id",
                                first["token_id"], "--json"])
    assert again.exit_code == 1
    unknown = runner.invoke(args=["ledger", "operator", "token-revoke", "--token-id",
                                  "tok_0000000000000000000000", "--json"])
    assert unknown.exit_code == 1
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(audit_log.c.action, audit_log.c.actor)
                            .where(audit_log.c.action == "operator.token_revoke")).all()
    assert len(rows) == 1 and rows[0].actor.startswith("cli:")


def test_adding_a_key_in_the_dashboard_asks_for_the_password(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    security = logged_in(app, "security", "sam")
    path = f"/credentials/{sender.public_id}/add"
    for password in ("", "not my password"):
        refused = post(security, path, {"reason": "second sender", "password": password},
                       htmx=True)
        assert refused.status_code == 403 and "did not match" in refused.get_data(as_text=True)
        assert not SECRET.search(refused.get_data(as_text=True))
    assert _count(app, credentials) == 1
    added = post(security, path, {"reason": "second sender", "password": PASSWORD}, htmx=True)
    assert added.status_code == 200 and SECRET.search(added.get_data(as_text=True))
    assert _count(app, credentials) == 2
    assert 'name="password"' in security.get(f"/credentials/{sender.public_id}").get_data(
        as_text=True).split("Add a key")[1]


def test_every_operator_and_token_form_asks_for_the_password(app) -> None:  # type: ignore[no-untyped-def]
    admin = logged_in(app, "admin", "root")
    make_operator(app, "victim", "viewer")
    make_token(app, "victim")
    with app.extensions["ledger"].engine.connect() as conn:
        token_id = conn.execute(select(api_tokens.c.public_id)).scalar_one()
    ops, tokens = _count(app, operators), _count(app, api_tokens)
    forms = [("/operators", {"username": "mallory", "role": "admin"}),
             ("/operators/victim/role", {"role": "admin"}),
             ("/operators/victim/disable", {"reason": "x"}),
             ("/operators/victim/token", {"write": "1"}),
             (f"/tokens/{token_id}/revoke", {})]
    for path, form in forms:
        answer = post(admin, path, {**form, "password": "wrong wrong wrong"}, htmx=True)
        assert answer.status_code == 403, path
        assert "nothing was changed" in answer.get_data(as_text=True).lower(), path
    assert (_count(app, operators), _count(app, api_tokens)) == (ops, tokens)
    admin = app.test_client()  # five wrong passwords ended that session: sign in again
    assert login(admin, "root").status_code == 303
    page = admin.get("/operators").get_data(as_text=True)
    forms_on_page = re.findall(r"<form .*?</form>", re.split(r"<main[^>]*>", page)[1], re.S)
    assert len(forms_on_page) == 7  # create; role and token x2; disable victim; revoke token
    assert all('type="password"' in form for form in forms_on_page)
    issued = post(admin, "/operators/victim/token",
                  {"write": "1", "expires_in": "86400", "password": PASSWORD}, htmx=True)
    assert issued.status_code == 200
    new_token = SECRET.search(issued.get_data(as_text=True)).group(1)  # type: ignore[union-attr]
    revoked = post(admin, f"/tokens/{token_id}/revoke", {"password": PASSWORD}, htmx=True)
    assert revoked.status_code == 200 and f"Revoked {token_id}" in revoked.get_data(
        as_text=True)
    client = app.test_client()
    me = client.get("/api/v1/me", headers=_bearer(new_token))
    assert me.get_json() == {"username": "victim", "role": "viewer"}
    with app.extensions["ledger"].engine.connect() as conn:
        scopes = dict(conn.execute(select(api_tokens.c.public_id, api_tokens.c.scopes)).all())  # type: ignore[arg-type]
    assert sorted(scopes.values()) == ["read", "read write"]


def test_revoking_the_last_live_key_says_so_and_needs_confirmation(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    security = logged_in(app, "security", "sam")
    path = f"/credentials/{sender.public_id}/revoke"
    form = {"key_id": sender.key_id, "reason": "leaked", "password": PASSWORD}
    asked = post(security, path, form, htmx=True)
    html = asked.get_data(as_text=True)
    assert asked.status_code == 409 and "last live key" in html
    assert 'name="confirm_last" value="1"' in html
    assert _credential_states(app, sender.scope_id) == {sender.key_id: "active"}
    wrong = post(security, path, {**form, "confirm_last": "1", "password": "nope nope"},
                 htmx=True)
    assert wrong.status_code == 403 and "did not match" in wrong.get_data(as_text=True)
    assert "last live key" in wrong.get_data(as_text=True)  # the question stays on screen
    assert _credential_states(app, sender.scope_id) == {sender.key_id: "active"}
    done = post(security, path, {**form, "confirm_last": "1"}, htmx=True)
    assert done.status_code == 200 and f"Revoked {sender.key_id}" in done.get_data(as_text=True)
    assert _credential_states(app, sender.scope_id) == {sender.key_id: "revoked"}


def test_revoking_a_key_that_is_not_the_last_needs_no_extra_confirmation(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    security = logged_in(app, "security", "sam")
    added = post(security, f"/credentials/{sender.public_id}/add",
                 {"reason": "second", "password": PASSWORD}, htmx=True)
    assert added.status_code == 200
    answer = post(security, f"/credentials/{sender.public_id}/revoke",
                  {"key_id": sender.key_id, "reason": "leaked", "password": PASSWORD},
                  htmx=True)
    assert answer.status_code == 200 and "last live key" not in answer.get_data(as_text=True)
    assert _credential_states(app, sender.scope_id)[sender.key_id] == "revoked"


def test_the_reported_forgery_fails_over_http_on_a_multi_process_server(test_env) -> None:  # type: ignore[no-untyped-def]
    """A security operator's token, read or write, gets no signing secret out of gunicorn."""
    import requests

    from app import create_app
    from tests.helpers import event_body, signed_headers
    from tests.servers import gunicorn_server

    app = create_app(test_env)
    sender = make_sender(app)
    make_operator(app, "sec", "security")
    tokens = [make_token(app, "sec"), make_token(app, "sec", write=True)]
    app.extensions["ledger"].close()
    with gunicorn_server({**test_env, "LEDGER_LOG_LEVEL": "WARNING"}, workers=2) as (base, _):
        for token in tokens:
            answer = requests.post(f"{base}/credentials/{sender.public_id}/add",
                                   data={"reason": "mine now", "password": ""},
                                   headers=_bearer(token), timeout=10)
            assert answer.status_code == 403 and answer.json() == TOKEN_ONLY_FORBIDDEN
            assert requests.get(f"{base}/api/v1/me", headers=_bearer(token),
                                timeout=10).status_code == 200
        # Without the secret nothing signs: a forged credit is refused and nothing lands.
        body = event_body("stripe", "evt_forged", data={"amount": 1_000_000})
        forged = requests.post(f"{base}/hooks/{sender.public_id}", data=body, timeout=10,
                               headers=signed_headers(sender, body, "evt_forged",
                                                      secret="whsec_guess"))
        assert forged.status_code == 401
    app = create_app(test_env)
    try:
        assert _count(app, credentials) == 1 and _count(app, receipts) == 0
    finally:
        app.extensions["ledger"].close()
