"""Sender signature profiles, one module each, found by name."""

from __future__ import annotations

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures.base import EventIdentity, HeaderMap, Profile, Verified
from ledger.intake.signatures.github import GITHUB
from ledger.intake.signatures.standard_webhooks import STANDARD_WEBHOOKS
from ledger.intake.signatures.stripe import STRIPE

__all__ = ["PROFILES", "EventIdentity", "HeaderMap", "Profile", "Verified", "get_profile"]

PROFILES: dict[str, Profile] = {
    profile.name: profile for profile in (STANDARD_WEBHOOKS, STRIPE, GITHUB)
}


def get_profile(name: str | None) -> Profile:
    """Return the profile called `name`; an unknown or missing name fails closed."""
    profile = PROFILES.get(name) if isinstance(name, str) else None
    if profile is None:
        raise AuthenticationFailed("unknown_profile")
    return profile
