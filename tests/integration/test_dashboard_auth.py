"""Dashboard access: login, sessions and their timeouts, rate limiting, roles, CSRF, tokens."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from ledger.access import audit
from ledger.access.operators import set_role
from ledger.clock import FixedClock
from ledger.db.schema import operator_sessions
from tests.dashboard_helpers import (
    PASSWORD,
    csrf_token,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    login,
    make_operator,
    make_token,
    post,
)

PAGES = ["/", "/receipts", "/stuck", "/failures", "/conflicts", "/credentials", "/audit",
         "/audit/verify", "/capacity", "/operators", "/receipts/in_0000000000000000000000/e1",
         "/credentials/in_0000000000000000000000"]
API = ["/api/v1/me", "/api/v1/overview", "/api/v1/receipts", "/api/v1/stuck",
       "/api/v1/failures", "/api/v1/conflicts", "/api/v1/integrations", "/api/v1/audit",
       "/api/v1/audit/verify", "/api/v1/capacity",
       "/api/v1/receipts/in_0000000000000000000000/e1"]
ACTIONS = ["/failures/requeue", "/failures/requeue-all/preview", "/failures/requeue-all",
           "/conflicts/1/ack", "/credentials/in_0000000000000000000000/add",
           "/credentials/in_0000000000000000000000/rotate",
           "/credentials/in_0000000000000000000000/revoke", "/operators",
           "/operators/x/role", "/operators/x/disable", "/operators/x/token",
           "/tokens/tok_0000000000000000000000/revoke"]


def _clocked_app(test_env: dict[str, str], clock: FixedClock):  # type: ignore[no-untyped-def]
    """Return an app on the test database whose clock the test moves."""
    from app import create_app

    return create_app(test_env, clock=clock)


def test_every_page_redirects_to_login_without_a_session(client) -> None:  # type: ignore[no-untyped-def]
    for path in PAGES:
        response = client.get(path)
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/login?next="), path


def test_every_api_read_answers_401_json_without_credentials(client) -> None:  # type: ignore[no-untyped-def]
    for path in API:
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.get_json() == {"error": "unauthenticated"}, path


def test_htmx_request_without_session_is_sent_to_login(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/receipts", headers={"HX-Request": "true"})
    assert response.status_code == 401
    assert response.headers["HX-Redirect"].startswith("/login")


def test_actions_without_session_are_refused_even_with_a_csrf_token(client) -> None:  # type: ignore[no-untyped-def]
    token = csrf_token(client)
    for path in ACTIONS:
        response = client.post(path, data={"csrf_token": token})
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/login"), path


def test_no_get_changes_state_action_urls_refuse_get(app) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(app, "admin")
    for path in ACTIONS:
        if path == "/operators":
            continue  # GET is the operators page; creating one needs the POST
        assert client.get(path).status_code == 405, path


def test_wrong_password_is_refused_with_a_message(app, client) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "alice", "viewer")
    response = login(client, "alice", "not the password at all")
    assert response.status_code == 401
    assert "Wrong username or password" in response.get_data(as_text=True)
    assert client.get("/").status_code == 302


def test_login_sets_a_hardened_cookie_and_logout_ends_the_session(app, client) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "alice", "viewer")
    response = login(client, "alice")
    assert response.status_code == 303
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    stolen = client.get_cookie("ledger_session").value
    assert client.get("/").status_code == 200
    assert post(client, "/logout").status_code == 303
    assert client.get("/").status_code == 302
    # Replaying the cookie from before logout does not bring the session back.
    client.set_cookie("ledger_session", stolen)
    assert client.get("/").status_code == 302


def test_cookie_is_secure_when_configured(test_env) -> None:  # type: ignore[no-untyped-def]
    from app import create_app

    app = create_app({**test_env, "LEDGER_COOKIE_SECURE": "1"})
    try:
        make_operator(app, "alice", "viewer")
        client = app.test_client()
        response = login(client, "alice")
        assert "Secure" in response.headers["Set-Cookie"]
    finally:
        app.extensions["ledger"].close()


def test_each_login_gets_a_new_session_id(app, client) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "alice", "viewer")
    client.get("/login")
    before = client.get_cookie("ledger_session").value
    login(client, "alice")
    first = client.get_cookie("ledger_session").value
    login(client, "alice")
    second = client.get_cookie("ledger_session").value
    assert len({before, first, second}) == 3
    # The session replaced by the second login is over: its cookie no longer works.
    replay = app.test_client()
    replay.set_cookie("ledger_session", first)
    assert replay.get("/").status_code == 302
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(operator_sessions)).scalar_one()
    assert rows == 2  # two server-side sessions, each with its own random id


def test_idle_timeout_ends_the_session(test_env) -> None:  # type: ignore[no-untyped-def]
    clock = FixedClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    app = _clocked_app({**test_env, "LEDGER_SESSION_IDLE_SECONDS": "1800"}, clock)
    try:
        client = logged_in(app, "viewer")
        clock.advance(1700)
        assert client.get("/").status_code == 200  # still in use: the idle clock restarts
        clock.advance(1700)
        assert client.get("/").status_code == 200
        clock.advance(1801)
        assert client.get("/").status_code == 302
    finally:
        app.extensions["ledger"].close()


def test_absolute_timeout_ends_even_a_busy_session(test_env) -> None:  # type: ignore[no-untyped-def]
    clock = FixedClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    app = _clocked_app({**test_env, "LEDGER_SESSION_ABSOLUTE_SECONDS": "7200"}, clock)
    try:
        client = logged_in(app, "viewer")
        for _ in range(5):
            clock.advance(1400)
            assert client.get("/").status_code == 200
        clock.advance(1400)  # 7000 s of activity, then past two hours
        clock.advance(300)
        assert client.get("/").status_code == 302
    finally:
        app.extensions["ledger"].close()


def test_login_is_rate_limited_per_username_and_address(test_env) -> None:  # type: ignore[no-untyped-def]
    clock = FixedClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    app = _clocked_app(test_env, clock)
    try:
        make_operator(app, "alice", "viewer")
        attacker = app.test_client()
        for _ in range(5):
            assert login(attacker, "alice", "guess guess guess").status_code == 401
        refused = login(attacker, "alice")  # even the right password waits now
        assert refused.status_code == 429
        assert "Too many failed sign-ins" in refused.get_data(as_text=True)
        assert int(refused.headers["Retry-After"]) > 0
        # Another address is not locked out by this one's failures.
        other = app.test_client()
        other.environ_base["REMOTE_ADDR"] = "10.9.9.9"
        assert login(other, "alice").status_code == 303
        clock.advance(901)
        assert login(attacker, "alice").status_code == 303
    finally:
        app.extensions["ledger"].close()


def test_rate_limit_holds_across_processes(test_env) -> None:  # type: ignore[no-untyped-def]
    from app import create_app

    first, second = create_app(test_env), create_app(test_env)
    try:
        make_operator(first, "alice", "viewer")
        for _ in range(5):
            login(first.test_client(), "alice", "guess guess guess")
        assert login(second.test_client(), "alice").status_code == 429
    finally:
        first.extensions["ledger"].close()
        second.extensions["ledger"].close()


def test_role_change_ends_the_operators_sessions(app) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(app, "security", "bob")
    assert client.get("/credentials").status_code == 200
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        set_role(conn, audit.Actor(name="root", role="admin"), "bob", "viewer",
                 reason="moved team", now=svc.clock.now())
    assert client.get("/").status_code == 302


def test_csrf_token_is_required_for_state_changes(app) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(app, "oncall")
    response = client.post("/failures/requeue", data={"scope": "a/b", "event_id": "e",
                                                      "reason": "r"})
    assert response.status_code == 400
    assert "CSRF" in response.get_data(as_text=True)
    make_operator(app, "carol", "viewer")
    assert app.test_client().post("/login", data={"username": "carol",
                                                  "password": PASSWORD}).status_code == 400


def test_login_next_never_leaves_the_site(app, client) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "alice", "viewer")
    token = csrf_token(client)
    response = client.post("/login", data={"username": "alice", "password": PASSWORD,
                                           "csrf_token": token, "next": "//evil.example/x"})
    assert response.headers["Location"] == "/"


@pytest.mark.parametrize("role", ["viewer", "oncall"])
def test_roles_below_admin_cannot_manage_operators(app, role: str) -> None:  # type: ignore[no-untyped-def]
    client = logged_in(app, role)
    assert client.get("/operators").status_code == 403
    assert post(client, "/operators", {"username": "mallory", "role": "admin"}).status_code == 403
    assert "Operators" not in client.get("/").get_data(as_text=True).split("<main")[0]


def test_api_token_authenticates_and_revocation_by_disable_stops_it(app) -> None:  # type: ignore[no-untyped-def]
    make_operator(app, "robot", "viewer")
    token = make_token(app, "robot")
    client = app.test_client()
    answer = client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    assert answer.get_json() == {"username": "robot", "role": "viewer"}
    assert client.get("/api/v1/me", headers={"Authorization": "Bearer rlt_nope"}
                      ).status_code == 401
    admin = logged_in(app, "admin")
    assert post(admin, "/operators/robot/disable", {"reason": "left",
                                                     "password": PASSWORD}).status_code == 200
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}
                      ).status_code == 401
