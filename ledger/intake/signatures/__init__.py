"""Sender signature profiles: preset declarations, and `hmac` configured per integration."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures.base import EventIdentity, HeaderMap, Profile, Verified
from ledger.intake.signatures.configurable import hmac_profile
from ledger.intake.signatures.more_presets import MORE_PRESETS
from ledger.intake.signatures.presets import PRESETS
from ledger.intake.signatures.profile import SenderProfile
from ledger.intake.signatures.token_profile import TOKEN, token_profile

if TYPE_CHECKING:
    from ledger.domain import Integration

__all__ = ["PROFILES", "PROFILE_BODY_LIMITS", "PROFILE_NAMES", "EventIdentity", "HeaderMap",
           "Profile", "SenderProfile", "Verified", "get_profile", "profile_for"]

PROFILES: dict[str, SenderProfile] = {
    profile.name: profile for profile in (*PRESETS, *MORE_PRESETS)}
HMAC = "hmac"
# Profiles built from an integration's own options (stored in its `hmac_options` column).
CONFIGURABLE = {HMAC: hmac_profile, TOKEN: token_profile}
PROFILE_NAMES: tuple[str, ...] = tuple(sorted([*PROFILES, *CONFIGURABLE]))
# Body limits fitted to a sender's own cap, where it exceeds the global default.
PROFILE_BODY_LIMITS: dict[str, int] = {
    name: profile.max_body_bytes for name, profile in PROFILES.items() if profile.max_body_bytes}


def get_profile(name: str | None) -> SenderProfile:
    """Return the preset profile called `name`; an unknown or missing name fails closed."""
    profile = PROFILES.get(name) if isinstance(name, str) else None
    if profile is None:
        raise AuthenticationFailed("unknown_profile")
    return profile


def profile_for(integration: Integration) -> SenderProfile:
    """Return the profile an integration verifies with, its own settings applied."""
    return _configured(integration.profile, integration.type_path,
                       integration.fixed_event_type, integration.endpoint_url,
                       integration.hmac_options)


@lru_cache(maxsize=4096)
def _configured(name: str, type_path: str | None, event_type: str | None, url: str | None,
                hmac_options: str | None) -> SenderProfile:
    """Build (once per process and setting) the profile with an integration's settings."""
    build = CONFIGURABLE.get(name)
    if build is not None:
        if not hmac_options:
            raise AuthenticationFailed("unknown_profile")
        try:
            base = build(hmac_options)
        except ValueError:
            raise AuthenticationFailed("unknown_profile") from None
    else:
        base = get_profile(name)
    return base.configured(type_path=type_path, event_type=event_type, url=url)
