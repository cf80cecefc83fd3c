"""Each web process's cached view of integrations and their keys.

A cached view is at most `ttl` seconds old: the whole view is dropped and
re-read lazily once it ages past that, so a revocation takes hold on every
process within the ttl. The ttl is derived from LEDGER_REVOCATION_BOUND_SECONDS
(see `ttl_for_bound`). Expiry instants are checked at verification time, so a
retiring key stops verifying exactly at its `expires_at` whatever the cache holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, and_, select

from ledger.access.secrets_box import SecretBox
from ledger.clock import Clock
from ledger.db.schema import credentials, integrations
from ledger.domain import CredentialState, Integration
from ledger.ids import INTEGRATION_ID


@dataclass(frozen=True, slots=True)
class KeyMaterial:
    """A credential with its decrypted secret, held in memory only."""

    key_id: str
    secret: str
    state: CredentialState
    expires_at: datetime | None

    def is_live(self, now: datetime) -> bool:
        """Tell whether this key may verify a delivery at `now`."""
        if self.state not in (CredentialState.ACTIVE, CredentialState.RETIRING):
            return False
        return self.expires_at is None or now < self.expires_at


@dataclass(frozen=True, slots=True)
class IntegrationAuth:
    """An integration and every key it ever had that is still on record."""

    integration: Integration
    keys: tuple[KeyMaterial, ...]

    def live_keys(self, now: datetime) -> list[KeyMaterial]:
        """Return the keys that verify at `now`."""
        return [k for k in self.keys if k.is_live(now)]

    def dead_keys(self, now: datetime) -> list[KeyMaterial]:
        """Return revoked or expired keys (to recognise their use, never to accept it)."""
        return [k for k in self.keys if not k.is_live(now)]


RELOAD_INTERVAL = 1.0


def ttl_for_bound(bound_seconds: float) -> float:
    """Cache for half the declared bound: the other half absorbs a slow refresh."""
    return bound_seconds / 2


class CredentialView:
    """Looks integrations up by public id, caching for at most `ttl` seconds."""

    def __init__(self, engine: Engine, box: SecretBox, clock: Clock, ttl: float,
                 on_refresh: Callable[[datetime], None] | None = None) -> None:
        self._engine = engine
        self._box = box
        self._clock = clock
        self._ttl = ttl
        self._on_refresh = on_refresh
        self._lock = threading.Lock()
        self._entries: dict[str, IntegrationAuth] = {}
        self._reloaded: dict[str, float] = {}
        self.refreshed_at: datetime = clock.now()

    def lookup(self, public_id: str) -> IntegrationAuth | None:
        """Return the integration and keys for `public_id`, or None if unknown."""
        if not INTEGRATION_ID.fullmatch(public_id):
            return None
        self._expire_if_stale()
        entry = self._entries.get(public_id)
        if entry is None:
            entry = self._load(public_id)
            if entry is not None and self._ttl > 0:
                self._entries[public_id] = entry
        return entry

    def cached(self, public_id: str) -> IntegrationAuth | None:
        """Return the integration if the view holds it now, without reading the database.

        None means: not held (unknown, not read yet, or the view aged out); `lookup`
        then decides, reading the database. For a caller that must not block on it
        (bench/asgi_intake.py runs `lookup` in a thread only then).
        """
        self._expire_if_stale()
        return self._entries.get(public_id)

    def reload(self, public_id: str) -> IntegrationAuth | None:
        """Re-read one integration for a signature no cached key matched; None if too soon.

        A key added or rotated in elsewhere would otherwise be refused until the
        view ages out. At most one reload per integration per RELOAD_INTERVAL
        seconds, so a flood of forged signatures costs the database almost nothing.
        """
        now = time.monotonic()
        if now - self._reloaded.get(public_id, -RELOAD_INTERVAL) < RELOAD_INTERVAL:
            return None
        self._reloaded[public_id] = now
        entry = self._load(public_id)
        if entry is not None and self._ttl > 0:
            self._entries[public_id] = entry
        return entry

    def invalidate(self) -> None:
        """Drop the whole view now (after a local credential change)."""
        with self._lock:
            self._entries = {}
            self.refreshed_at = self._clock.now()

    def drop_if_stale(self) -> None:
        """Drop the view if it outlived its ttl (the heartbeat does this for idle processes)."""
        self._expire_if_stale()

    def _expire_if_stale(self) -> None:
        """Drop the view once it is older than the ttl."""
        now = self._clock.now()
        if (now - self.refreshed_at).total_seconds() < self._ttl:
            return
        with self._lock:
            if (now - self.refreshed_at).total_seconds() >= self._ttl:
                self._entries = {}
                self.refreshed_at = now
        if self._on_refresh is not None:
            self._on_refresh(now)

    def _load(self, public_id: str) -> IntegrationAuth | None:
        """Read one integration and its keys from the database."""
        query = (
            select(integrations, credentials.c.key_id, credentials.c.secret_enc,
                   credentials.c.state.label("key_state"), credentials.c.expires_at)
            .select_from(integrations.outerjoin(
                credentials, and_(credentials.c.integration_id == integrations.c.id)))
            .where(integrations.c.public_id == public_id)
            .order_by(credentials.c.id.desc())
        )
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return None
        keys = tuple(
            KeyMaterial(r.key_id, self._box.decrypt(r.secret_enc), CredentialState(r.key_state),
                        r.expires_at)
            for r in rows if r.key_id is not None
        )
        return IntegrationAuth(Integration.from_row(rows[0]), keys)
