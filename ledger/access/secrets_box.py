"""Signing secrets at rest: Fernet under a rotatable master key (MultiFernet)."""

from __future__ import annotations

import hmac
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from ledger.config import MASTER_KEY_FILE, development_key
from ledger.errors import LedgerError
from ledger.logs import get_logger


class MasterKeyError(LedgerError):
    """The master key is missing, malformed, or cannot decrypt a stored secret."""


class SecretBox:
    """Encrypts with the newest master key, decrypts with any configured one."""

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise MasterKeyError("no master key configured")
        try:
            self._fernets = [Fernet(k.encode()) for k in keys]
        except (ValueError, TypeError):
            raise MasterKeyError("LEDGER_MASTER_KEY holds a malformed Fernet key") from None
        self._multi = MultiFernet(self._fernets)

    def encrypt(self, secret: str) -> str:
        """Return the ciphertext of `secret` under the newest key."""
        return self._multi.encrypt(secret.encode()).decode()

    def decrypt(self, token: str) -> str:
        """Return the plaintext of a stored secret."""
        try:
            return self._multi.decrypt(token.encode()).decode()
        except InvalidToken:
            raise MasterKeyError("stored secret does not decrypt under any master key") from None

    def is_current(self, token: str) -> bool:
        """Tell whether a stored secret is already encrypted under the newest key."""
        try:
            self._fernets[0].decrypt(token.encode())
        except InvalidToken:
            return False
        return True

    def rotate(self, token: str) -> str:
        """Re-encrypt a stored secret under the newest key."""
        try:
            return self._multi.rotate(token.encode()).decode()
        except InvalidToken:
            raise MasterKeyError("stored secret does not decrypt under any master key") from None


FINGERPRINT_PREFIX = "hmac:"


def fingerprint(secret: str, key: bytes) -> str:
    """Return a short fingerprint that names a secret in listings, keyed by the audit key.

    Keyed, so that someone who can read listings cannot test guessed secrets offline.
    """
    subkey = hmac.digest(key, b"ledger credential fingerprint", "sha256")
    return FINGERPRINT_PREFIX + hmac.digest(subkey, secret.encode(), "sha256").hex()[:16]


def load_box(master_key: str | None, var_dir: Path, *, production: bool = False) -> SecretBox:
    """Build the box from LEDGER_MASTER_KEY (comma-separated, newest first).

    Without a configured key, and outside production, a key is generated into
    var/ with a warning so that a first `make run` works.
    """
    if master_key:
        return SecretBox([k.strip() for k in master_key.split(",") if k.strip()])
    if production:
        raise MasterKeyError("LEDGER_MASTER_KEY must be set in production")
    created = not (Path(var_dir) / MASTER_KEY_FILE).exists()
    key = development_key(var_dir, MASTER_KEY_FILE, lambda: Fernet.generate_key().decode())
    if created:  # warn when generated, not on every command that reads it
        get_logger("ledger.secrets").warning("master_key.development",
                                             path=str(Path(var_dir) / MASTER_KEY_FILE),
                                             hint="set LEDGER_MASTER_KEY outside development")
    return SecretBox([key])
