"""An ended session: htmx gets 401 with HX-Redirect (next kept), login comes before CSRF."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from flask import Flask

from tests.dashboard_helpers import csrf_token, fast_hashes, logged_in

__all__ = ["fast_hashes"]
HTMX = {"HX-Request": "true", "Accept": "*/*"}


def _redirect_query(response: object) -> dict[str, list[str]]:
    """Return the query of the HX-Redirect target (it must be the login page)."""
    target = response.headers["HX-Redirect"]  # type: ignore[attr-defined]
    parts = urlsplit(target)
    assert parts.path == "/login"
    return parse_qs(parts.query)


def test_htmx_refresh_without_session_redirects_to_login(app: Flask) -> None:
    client = app.test_client()
    response = client.get("/stuck?scope=acme", headers={
        **HTMX, "HX-Current-URL": "http://localhost/stuck?scope=acme"})
    assert response.status_code == 401
    assert "unauthenticated" not in response.get_data(as_text=True)
    query = _redirect_query(response)
    assert query["next"] == ["/stuck?scope=acme"]
    assert query["expired"] == ["1"]


def test_logged_out_form_is_401_not_400(app: Flask) -> None:
    client = logged_in(app, "oncall")
    token = csrf_token(client, "/")
    client.post("/logout", data={"csrf_token": token})
    response = client.post("/failures/requeue", data={"reason": "x", "csrf_token": token},
                           headers={**HTMX, "HX-Current-URL": "http://localhost/failures"})
    assert response.status_code == 401
    assert _redirect_query(response)["next"] == ["/failures"]
    # Without htmx, a plain form post goes to login too, never to a CSRF error.
    plain = client.post("/failures/requeue", data={"reason": "x"}, headers={"Accept": "text/html"})
    assert plain.status_code == 302
    assert urlsplit(plain.headers["Location"]).path == "/login"


def test_login_page_says_the_session_ended(app: Flask) -> None:
    client = app.test_client()
    assert "session has ended" in client.get("/login?expired=1").get_data(as_text=True)
    assert "session has ended" not in client.get("/login").get_data(as_text=True)


def test_api_clients_still_get_json(app: Flask) -> None:
    client = app.test_client()
    response = client.get("/api/v1/me", headers=HTMX)
    assert response.status_code == 401
    assert response.get_json() == {"error": "unauthenticated"}
    # A CSRF-less POST with a session is still refused as bad CSRF.
    signed = logged_in(app, "oncall", "other")
    assert signed.post("/failures/requeue", data={"reason": "x"}).status_code == 400
