"""Connecting a sender from the dashboard: security only, secret shown once, refusals explained."""

from __future__ import annotations

from sqlalchemy import func, select

from ledger.db.schema import integrations
from tests.dashboard_helpers import (
    PASSWORD,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    post,
)
from tests.helpers import Sender, deliver
from tests.profile_keys import KEYS


def _count(app) -> int:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(integrations)).scalar_one())


def _public_id(app, name: str) -> str:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(integrations.c.public_id)
                            .where(integrations.c.name == name)).scalar_one()


def test_security_connects_a_sender_whose_deliveries_then_verify(app, client) -> None:  # type: ignore[no-untyped-def]
    security = logged_in(app, "security")
    assert "Connect a sender" in security.get("/credentials").get_data(as_text=True)
    answer = post(security, "/credentials/connect",
                  {"account": "acme", "name": "slack-app", "profile": "slack",
                   "secret": KEYS["slack"].stored, "password": PASSWORD})
    page = answer.get_data(as_text=True)
    assert answer.status_code == 200, page
    assert "Connected acme/slack-app (slack)" in page and KEYS["slack"].stored in page
    public_id = _public_id(app, "slack-app")
    sender = Sender(public_id, "slack", KEYS["slack"].stored, "acme/slack-app", 0, "")
    assert deliver(client, sender, "Ev01").status_code == 202
    assert KEYS["slack"].stored not in security.get(f"/credentials/{public_id}").get_data(
        as_text=True)  # shown once


def test_viewer_cannot_connect_and_bad_settings_are_explained(app) -> None:  # type: ignore[no-untyped-def]
    viewer = logged_in(app, "viewer")
    assert "Connect a sender" not in viewer.get("/credentials").get_data(as_text=True)
    assert post(viewer, "/credentials/connect", {"account": "a", "name": "b",
                                                 "profile": "stripe"}).status_code == 403
    security = logged_in(app, "security")
    for form, words in (({"profile": "hmac"}, "signature-header"),
                        ({"profile": "twilio"}, "--url"),
                        ({"profile": "discord"}, "public key"),
                        ({"profile": "stripe", "tolerance": "soon"}, "whole seconds")):
        answer = post(security, "/credentials/connect",
                      {"account": "acme", "name": "x", "password": PASSWORD, **form})
        assert answer.status_code == 400
        assert words in answer.get_data(as_text=True), form
    assert _count(app) == 0


def test_a_public_key_sender_shows_no_secret(app) -> None:  # type: ignore[no-untyped-def]
    security = logged_in(app, "security")
    answer = post(security, "/credentials/connect",
                  {"account": "acme", "name": "bot", "profile": "discord",
                   "secret": KEYS["discord"].stored, "password": PASSWORD})
    page = answer.get_data(as_text=True)
    assert answer.status_code == 200 and "Connected acme/bot (discord)" in page
    assert "shown once" not in page


def test_connect_shows_each_profiles_catalog_card(app) -> None:  # type: ignore[no-untyped-def]
    """Every profile's id, type, freshness and what its signature covers, from its declaration."""
    from ledger.intake.signatures import PROFILE_NAMES
    from ledger.intake.signatures.catalog import cards

    page = logged_in(app, "security").get("/credentials").get_data(as_text=True)
    shown = cards()
    assert sorted(card.name for card in shown) == sorted(PROFILE_NAMES)
    for card in shown:
        assert f'<th scope="row">{card.name}</th>' in page
    assert "a shared token authenticates the sender, not the body" in page
    assert "none: the sender signs no timestamp" in page


def test_security_connects_a_token_sender(app, client) -> None:  # type: ignore[no-untyped-def]
    """The token profile's fields connect a sender whose header token then authenticates."""
    security = logged_in(app, "security")
    answer = post(security, "/credentials/connect",
                  {"account": "acme", "name": "pm", "profile": "token",
                   "tok_token_header": "X-Token", "tok_id_path": "id",
                   "secret": "postmark-token-0123456789", "password": PASSWORD})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    public_id = _public_id(app, "pm")
    sent = client.post(f"/hooks/{public_id}", data=b'{"id": "m-1", "type": "Bounce"}',
                       headers={"X-Token": "postmark-token-0123456789",
                                "Content-Type": "application/json"})
    assert sent.status_code == 202
    refused = post(security, "/credentials/connect",
                   {"account": "acme", "name": "pm2", "profile": "token",
                    "password": PASSWORD})
    assert refused.status_code == 400
    assert "token-header" in refused.get_data(as_text=True)
