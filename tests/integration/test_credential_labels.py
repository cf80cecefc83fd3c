"""Keys: an optional label per credential (CLI and dashboard), and "which key is this
secret?" (password re-entry, audited, the secret never stored)."""

from __future__ import annotations

import json
from typing import Any

from flask import Flask
from sqlalchemy import select

from ledger.db.schema import audit_log, credentials
from tests.dashboard_helpers import PASSWORD, fast_hashes, logged_in, post
from tests.helpers import make_sender

__all__ = ["fast_hashes"]


def _labels(app: Flask) -> dict[str, str | None]:
    with app.extensions["ledger"].engine.connect() as conn:
        return dict(conn.execute(select(credentials.c.key_id, credentials.c.label)).all())


def test_cli_labels_keys(app: Flask, runner: Any) -> None:
    made = runner.invoke(args=["ledger", "integration", "create", "--account", "acme", "--name",
                               "shop", "--profile", "stripe", "--label", "first key", "--json"])
    assert made.exit_code == 0, made.output
    out = json.loads(made.output)
    public_id, first = out["integration"], out["credential"]["key_id"]
    added = json.loads(runner.invoke(args=["ledger", "credential", "add", "--integration",
                                           public_id, "--label", "CI deploy", "--json"]).output)
    rotated = json.loads(runner.invoke(args=[
        "ledger", "credential", "rotate", "--integration", public_id, "--label", "Dec rotation",
        "--json"]).output)
    assert _labels(app) == {first: "first key", added["key_id"]: "CI deploy",
                            rotated["key_id"]: "Dec rotation"}
    listing = runner.invoke(args=["ledger", "credential", "list", "--integration", public_id])
    assert "CI deploy" in listing.output
    too_long = runner.invoke(args=["ledger", "credential", "add", "--integration", public_id,
                                   "--label", "x" * 81, "--json"])
    assert too_long.exit_code == 1 and len(_labels(app)) == 3  # refused, nothing written


def test_dashboard_adds_a_labelled_key(app: Flask) -> None:
    sender = make_sender(app)
    security = logged_in(app, "security", "sam")
    answer = post(security, f"/credentials/{sender.public_id}/add",
                  {"password": PASSWORD, "reason": "second sender", "label": "Zapier bridge"},
                  htmx=True)
    assert answer.status_code == 200
    assert "Zapier bridge" in security.get(f"/credentials/{sender.public_id}").get_data(
        as_text=True)


def test_which_key_is_this_secret(app: Flask) -> None:
    sender = make_sender(app)
    other = make_sender(app, account="globex", name="shop")
    security = logged_in(app, "security", "sam")
    wrong = post(security, "/credentials/identify",
                 {"secret": sender.secret, "password": "nope"}, htmx=True)
    assert wrong.status_code == 403 and sender.key_id not in wrong.get_data(as_text=True)
    found = post(security, "/credentials/identify",
                 {"secret": sender.secret, "password": PASSWORD}, htmx=True)
    html = found.get_data(as_text=True)
    assert sender.key_id in html and other.key_id not in html and "acme/stripe-prod" in html
    assert sender.secret not in html
    none = post(security, "/credentials/identify",
                {"secret": "whsec_not_ours_at_all", "password": PASSWORD}, htmx=True)
    assert "No credential" in none.get_data(as_text=True)
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(audit_log).where(
            audit_log.c.action == "credential.identify")).all()
        everything = json.dumps([dict(r._mapping) for r in conn.execute(select(audit_log))],
                                default=str)
    assert [r.actor for r in rows] == ["sam", "sam"]
    assert sender.key_id in rows[0].detail and sender.secret not in everything
    oncall = logged_in(app, "oncall")
    assert post(oncall, "/credentials/identify",
                {"secret": sender.secret, "password": PASSWORD}).status_code == 403

