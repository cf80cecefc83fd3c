"""The profile catalog and the sender pages: every profile is described, from its declaration."""

from __future__ import annotations

from pathlib import Path

from ledger.intake.signatures import PROFILE_NAMES, PROFILES
from ledger.intake.signatures.catalog import card, cards, help_text

DOCS = Path(__file__).resolve().parents[2] / "docs" / "senders"


def test_every_profile_has_a_card_and_a_page() -> None:
    """Twenty-plus presets plus hmac and token, each with a card and docs/senders/<name>.md."""
    assert len(PROFILES) >= 20 and {"hmac", "token"} <= set(PROFILE_NAMES)
    assert [found.name for found in cards()] == sorted(PROFILE_NAMES)
    for name in PROFILE_NAMES:
        page = (DOCS / f"{name}.md").read_text()
        assert f"(`{name}`)" in page.splitlines()[0]
        assert f"({name}.md)" in (DOCS / "index.md").read_text()


def test_cards_say_what_is_unsigned_and_unfresh() -> None:
    """An unsigned id and a missing timestamp are stated, not hidden."""
    github, stripe = card(PROFILES["github"]), card(PROFILES["stripe"])
    assert "unsigned" in github.event_id and github.freshness.startswith("none")
    assert "unsigned" not in stripe.event_id and not stripe.freshness.startswith("none")
    assert "NOT the event" in card(PROFILES["mailgun"]).covers
    assert "not the body" in card(PROFILES["gitlab"]).covers


def test_help_text_lists_every_profile() -> None:
    """`integration create --help` shows each profile's card."""
    text = help_text()
    for name in PROFILE_NAMES:
        assert f"\n{name}: signs " in text
