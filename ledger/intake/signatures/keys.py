"""Signing algorithms and the stored credential formats they read keys from.

A credential is stored as text. Each algorithm turns that text into a key it can
use, or into None when the text is not in its format: an unusable stored key
matches nothing, it never crashes the intake. Asymmetric keys are parsed once per
process (they are public, and parsing a curve point costs more than verifying).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from secrets import token_bytes
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ledger.intake.signatures import _common as common

WHSEC = "whsec_"
WHPK = "whpk_"
WHSK = "whsk_"
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def padded_base64(encoded: str) -> bytes | None:
    """Decode base64 published with or without '=' padding; None when it is not base64."""
    if not _BASE64.fullmatch(encoded):
        return None
    bare = encoded.rstrip("=")
    try:
        return base64.b64decode(bare + "=" * (-len(bare) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def random_key_base64(size: int) -> str:
    """Return the base64 of `size` random bytes."""
    return base64.b64encode(token_bytes(size)).decode("ascii")


def whsec_key(secret: str) -> bytes | None:
    """Return the HMAC key inside a `whsec_<base64>` secret."""
    if not isinstance(secret, str) or not secret.startswith(WHSEC):
        return None
    return padded_base64(secret[len(WHSEC):]) or None


@lru_cache(maxsize=256)
def whpk_key(secret: str) -> ed25519.Ed25519PublicKey | None:
    """Return the ed25519 public key inside a `whpk_<base64 32 bytes>` credential."""
    if not isinstance(secret, str) or not secret.startswith(WHPK):
        return None
    raw = padded_base64(secret[len(WHPK):])
    return ed25519.Ed25519PublicKey.from_public_bytes(raw) if raw and len(raw) == 32 else None


@lru_cache(maxsize=256)
def hex_ed25519_key(secret: str) -> ed25519.Ed25519PublicKey | None:
    """Return the ed25519 public key spelled as 64 hex digits (Discord's "Public Key")."""
    if not isinstance(secret, str) or not _HEX64.fullmatch(secret):
        return None
    return ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(secret))


@lru_cache(maxsize=256)
def der_p256_key(secret: str) -> ec.EllipticCurvePublicKey | None:
    """Return the P-256 public key in base64 DER (SendGrid's "Verification Key")."""
    raw = padded_base64(secret) if isinstance(secret, str) else None
    if not raw:
        return None
    try:
        key = serialization.load_der_public_key(raw)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        return None
    return key


@dataclass(frozen=True, slots=True, kw_only=True)
class Hmac:
    """A shared-secret MAC: HMAC with `digest` under the key `key_of` reads."""

    digest: str
    key_of: Callable[[str], bytes | None] = common.utf8_key
    size: int = 32

    def matches(self, key: Any, message: bytes, candidates: Sequence[bytes]) -> bool:
        """Tell whether any candidate is the MAC of `message`; every one is compared."""
        expected = hmac.new(key, message, self.digest).digest()
        matched = False
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
        return matched

    def sign(self, secret: str, message: bytes) -> bytes:
        """Return the MAC of `message` under `secret`."""
        key = self.key_of(secret)
        if key is None:
            raise ValueError("secret is not in this sender's format")
        return hmac.new(key, message, self.digest).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Ed25519:
    """ed25519 signatures checked with a public key credential."""

    key_of: Callable[[str], Any]
    private_of: Callable[[str], ed25519.Ed25519PrivateKey | None]
    size: int = 64

    def matches(self, key: Any, message: bytes, candidates: Sequence[bytes]) -> bool:
        """Tell whether any candidate is a valid signature of `message`."""
        matched = False
        for candidate in candidates:
            try:
                key.verify(candidate, message)
                matched = True
            except InvalidSignature:
                continue
        return matched

    def sign(self, private: str, message: bytes) -> bytes:
        """Return the signature of `message` by a private key (tests, drills, demos)."""
        key = self.private_of(private)
        if key is None:
            raise ValueError("not an ed25519 private key in this sender's format")
        return key.sign(message)


@dataclass(frozen=True, slots=True, kw_only=True)
class EcdsaP256:
    """ECDSA P-256 / SHA-256 signatures (DER), checked with a public key credential."""

    key_of: Callable[[str], Any] = der_p256_key
    size: int = 0  # DER signatures vary in length

    def matches(self, key: Any, message: bytes, candidates: Sequence[bytes]) -> bool:
        """Tell whether any candidate is a valid signature of `message`."""
        matched = False
        for candidate in candidates:
            try:
                key.verify(candidate, message, ec.ECDSA(hashes.SHA256()))
                matched = True
            except (InvalidSignature, ValueError):
                continue
        return matched

    def sign(self, private: str, message: bytes) -> bytes:
        """Return a DER signature by a base64-DER PKCS#8 private key (tests, drills)."""
        raw = padded_base64(private)
        key = serialization.load_der_private_key(raw, None) if raw else None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("not a P-256 private key in base64 DER")
        return key.sign(message, ec.ECDSA(hashes.SHA256()))


def whsk_private(secret: str) -> ed25519.Ed25519PrivateKey | None:
    """Return the ed25519 key inside `whsk_<base64 32-byte seed>` (the sender's half)."""
    if not isinstance(secret, str) or not secret.startswith(WHSK):
        return None
    raw = padded_base64(secret[len(WHSK):])
    return ed25519.Ed25519PrivateKey.from_private_bytes(raw) if raw and len(raw) == 32 else None


def hex_private(secret: str) -> ed25519.Ed25519PrivateKey | None:
    """Return the ed25519 key whose 32-byte seed is spelled in hex."""
    if not isinstance(secret, str) or not _HEX64.fullmatch(secret):
        return None
    return ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(secret))


def ed25519_pair() -> tuple[bytes, bytes]:
    """Return a fresh (seed, public key) pair of raw ed25519 bytes."""
    private = ed25519.Ed25519PrivateKey.generate()
    seed = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.Raw,
                                               serialization.PublicFormat.Raw)
    return seed, public


def p256_pair() -> tuple[str, str]:
    """Return a fresh (private, public) P-256 pair, both base64 DER."""
    private = ec.generate_private_key(ec.SECP256R1())
    der_private = private.private_bytes(serialization.Encoding.DER,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    der_public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der_private).decode(), base64.b64encode(der_public).decode()


HMAC_SHA256 = Hmac(digest="sha256")
HMAC_SHA256_WHSEC = Hmac(digest="sha256", key_of=whsec_key)
HMAC_SHA1 = Hmac(digest="sha1", size=20)
HMAC_DIGESTS = {"sha256": 32, "sha1": 20, "sha512": 64}
ED25519_WHPK = Ed25519(key_of=whpk_key, private_of=whsk_private)
ED25519_HEX = Ed25519(key_of=hex_ed25519_key, private_of=hex_private)
ECDSA_P256 = EcdsaP256()
