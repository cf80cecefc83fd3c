"""What each profile gives an operator, read from its declaration: the catalog.

`integration create --help`, the dashboard's "Connect a sender" and the docs show
these cards, so what an operator is told is what the intake does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledger.intake.signatures import fields
from ledger.intake.signatures.more_presets import MORE_PRESETS, AdyenId, TwitchType
from ledger.intake.signatures.presets import PRESETS
from ledger.intake.signatures.profile import HeaderSetId, SenderProfile
from ledger.intake.signatures.schemes import SignedContent, Template, form_content
from ledger.intake.signatures.shared_token import SharedToken

DIGEST_WORDS = "sha256:<body digest> (the sender sends no id)"
TOKEN_COVERS = "nothing: a shared token authenticates the sender, not the body"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileCard:
    """One profile as an operator sees it."""

    name: str
    covers: str
    event_id: str
    event_type: str
    freshness: str
    id_is_signed: bool

    def as_dict(self) -> dict[str, Any]:
        """Return the card as JSON-ready data."""
        return {"profile": self.name, "covers": self.covers, "event_id": self.event_id,
                "event_type": self.event_type, "freshness": self.freshness,
                "id_is_signed": self.id_is_signed}


_WORDS: dict[type, Callable[[Any], str]] = {
    fields.Header: lambda f: f"header {f.name}" + (" (/ as .)" if f.slash_as_dot else ""),
    fields.BodyPath: lambda f: "body " + ".".join(f.path) + (
        f" (else {f.default})" if f.default else ""),
    fields.Fixed: lambda f: f"fixed: {f.value}",
    fields.Text: lambda f: describe(f.inner),
    TwitchType: lambda f: "body subscription.type (revocation.<type> without an event)",
    AdyenId: lambda f: "item eventCode:pspReference:success",
    fields.Dotted: lambda f: f"{describe(f.first)} + '.' + {describe(f.second)}",
    fields.Wrapped: lambda f: f"{describe(f.inner)} in {f.envelope}, else {describe(f.outer)}",
    fields.Named: lambda f: f"{describe(f.inner)}, named",
    fields.BodyDigest: lambda f: f"{f.prefix}<body digest> (the sender sends no id)",
    fields.BodyDigestId: lambda f: DIGEST_WORDS,
    fields.Matching: lambda f: (f"{describe(f.then)} when {describe(f.marker)} is {f.value}, "
                                f"else {describe(f.otherwise)}"),
    fields.First: lambda f: " or ".join(describe(inner) for inner in f.fields),
    fields.ByShape: lambda f: "; ".join(
        [f"{describe(found)} when {describe(marker)} is present"
         for marker, found in f.shapes] + [describe(f.otherwise)]),
    HeaderSetId: lambda f: " or ".join(
        f"header {names.id}" for names in f.scheme.headers if names.id),
}


def describe(found: Any) -> str:
    """Return where a field reads its value, in words."""
    words = _WORDS.get(type(found))
    return words(found) if words else type(found).__name__


def covers(profile: SenderProfile) -> str:
    """Return what the profile's signature covers, in words."""
    if profile.covers:
        return profile.covers
    scheme = profile.scheme
    if isinstance(scheme, SharedToken):
        return TOKEN_COVERS
    if not isinstance(scheme, SignedContent):
        return type(scheme).__name__
    if isinstance(scheme.content, Template):
        return scheme.content.text.replace("{body}", "{raw body}")
    if scheme.content is form_content:
        return "{url} + the sorted form fields"
    return (scheme.content.__doc__ or "").strip()


def freshness(profile: SenderProfile) -> str:
    """Return how the profile checks freshness."""
    scheme = profile.scheme
    if not profile.has_timestamp:
        return "none: the sender signs no timestamp"
    if isinstance(scheme, SignedContent) and scheme.body_timestamp:
        return f"body {scheme.body_timestamp} within the tolerance"
    return "signed timestamp within the tolerance"


def card(profile: SenderProfile) -> ProfileCard:
    """Return the card of one preset (or configured) profile."""
    event_id = describe(profile.event_id)
    if not profile.id_is_signed:
        event_id += " [unsigned: the body-digest guard applies]"
    return ProfileCard(name=profile.name, covers=covers(profile), event_id=event_id,
                       event_type=describe(profile.event_type), freshness=freshness(profile),
                       id_is_signed=profile.id_is_signed)


CONFIGURABLE_CARDS = (
    ProfileCard(name="hmac", covers="the template you give (--signed-content, {body} and "
                "{timestamp}, {id}, {method}, {url})", event_id="--id-header or --id-path "
                "(unsigned unless {id} is in the template)",
                event_type="--type-header, --type-path, --event-type, else body type",
                freshness="--timestamp-header within the tolerance; none without it",
                id_is_signed=False),
    ProfileCard(name="token", covers=TOKEN_COVERS,
                event_id="--id-header or --id-path, else " + DIGEST_WORDS
                + " [unsigned: the body-digest guard applies]",
                event_type="--type-header, --type-path, --event-type, else body type",
                freshness="none: a token carries no time", id_is_signed=False),
)


def cards() -> list[ProfileCard]:
    """Return every profile's card, by name."""
    return sorted([*(card(profile) for profile in (*PRESETS, *MORE_PRESETS)), *CONFIGURABLE_CARDS],
                  key=lambda found: found.name)


def help_text() -> str:
    """Return the catalog as `integration create --help` shows it (click keeps the lines)."""
    lines = ["\b", "Profiles (what each signature covers; id; type; freshness):"]
    for found in cards():
        lines += ["\b", f"{found.name}: signs {found.covers}", f"  id: {found.event_id}",
                  f"  type: {found.event_type}", f"  freshness: {found.freshness}"]
    return "\n".join(lines)
