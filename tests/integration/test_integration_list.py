"""`ledger integration list [--account A] --json` (CONTRACT section 4)."""

from __future__ import annotations

import json
from datetime import datetime

from tests.helpers import make_sender

KEYS = {"integration", "scope", "profile", "created_at", "live_keys"}


def _list(runner, *args: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    result = runner.invoke(args=["ledger", "integration", "list", *args, "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert set(body) == {"integrations"}
    return body["integrations"]  # type: ignore[no-any-return]


def test_every_integration_is_listed_by_scope_with_its_profile(app, runner):
    github = make_sender(app, account="globex", name="gh", profile="github")
    stripe = make_sender(app, account="acme", name="stripe-prod")
    rows = _list(runner)
    assert all(set(row) == KEYS for row in rows)
    assert [(r["integration"], r["scope"], r["profile"], r["live_keys"]) for r in rows] == [
        (stripe.public_id, "acme/stripe-prod", "stripe", 1),
        (github.public_id, "globex/gh", "github", 1)]
    assert all(datetime.fromisoformat(r["created_at"]).tzinfo is not None for r in rows)


def test_account_narrows_the_list_and_an_unknown_one_lists_nothing(app, runner):
    make_sender(app, account="acme", name="one")
    make_sender(app, account="acme", name="two", profile="github")
    make_sender(app, account="globex", name="three")
    assert [r["scope"] for r in _list(runner, "--account", "acme")] == ["acme/one", "acme/two"]
    assert _list(runner, "--account", "initech") == []


def test_live_keys_counts_the_keys_that_still_verify(app, runner):
    sender = make_sender(app)

    def live() -> int:
        (row,) = _list(runner)
        return row["live_keys"]  # type: ignore[no-any-return]

    rotated = runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                  sender.public_id, "--overlap", "3600", "--json"])
    assert rotated.exit_code == 0, rotated.output
    assert live() == 2  # the new key and the retiring one, during the overlap
    new_key = json.loads(rotated.output)["key_id"]
    revoked = runner.invoke(args=["ledger", "credential", "revoke", "--key-id", sender.key_id,
                                  "--reason", "leaked", "--json"])
    assert revoked.exit_code == 0, revoked.output
    assert live() == 1
    again = runner.invoke(args=["ledger", "credential", "rotate", "--integration",
                                sender.public_id, "--overlap", "0", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["retiring"][0]["key_id"] == new_key
    assert live() == 1  # the old key expired at once: only the newest verifies


def test_the_text_listing_names_each_integration(app, runner):
    sender = make_sender(app)
    result = runner.invoke(args=["ledger", "integration", "list"])
    assert result.exit_code == 0
    assert sender.public_id in result.output and "acme/stripe-prod" in result.output
