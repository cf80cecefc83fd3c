"""The drill's every-profile step: each sender's key is accepted, then refused once revoked.

One sandbox integration per preset profile (plus a `whpk_` Standard Webhooks key
and `hmac` and `token` integrations), each signed the sender's way over real HTTP. All keys
are revoked at once, so the whole step waits one revocation bound, not one per
profile. Public-key senders (Discord, SendGrid, v1a) get a fresh key pair: the
ledger stores the public half, the drill signs with the private half.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ledger.access import audit
from ledger.access.credentials import revoke_credential
from ledger.access.integrations import create_integration, profile_settings
from ledger.clock import unix
from ledger.intake.signatures import PROFILES, SenderProfile, profile_for
from ledger.intake.signatures.keys import WHPK, WHSK, ed25519_pair, p256_pair
from ledger.intake.signatures.sns import sns_pair

if TYPE_CHECKING:
    from ledger.services import Services

HTTP_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.2
DRILL_HMAC: dict[str, Any] = {
    "signature_header": "x-drill-signature", "content": "{timestamp}.{body}",
    "timestamp_header": "x-drill-timestamp", "id_path": "id"}
# The drill talks to a loopback server, often over plain HTTP: a sandbox token may.
DRILL_TOKEN: dict[str, Any] = {"token_header": "x-drill-token", "id_path": "id",
                               "allow_plaintext": True}
DRILL_OPTIONS = {"hmac": DRILL_HMAC, "token": DRILL_TOKEN}


@dataclass(slots=True, kw_only=True)
class ProfileSender:
    """One sandbox integration of one profile, and how it signs."""

    label: str
    integration_id: int
    public_id: str
    key_id: str
    signing: str
    profile: SenderProfile


def _key_pair(name: str) -> tuple[str | None, str | None]:
    """Return (stored, signing) for a public-key sender; (None, None) for shared secrets."""
    if name == "discord":
        seed, public = ed25519_pair()
        return public.hex(), seed.hex()
    if name == "sendgrid":
        private, public_der = p256_pair()
        return public_der, private
    if name == "aws-sns":
        return sns_pair()
    if name == "standard-webhooks-v1a":
        seed, public = ed25519_pair()
        return WHPK + base64.b64encode(public).decode(), WHSK + base64.b64encode(seed).decode()
    return None, None


def post_signed(base_url: str, public_id: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST one signed delivery; return (status, JSON answer)."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/hooks/{public_id}", data=body,
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
            raw = response.read()
            is_json = response.headers.get_content_type() == "application/json"
            # A profile may answer a literal text (Adyen's `[accepted]`).
            return response.status, json.loads(raw or b"{}") if is_json else {}
    except urllib.error.HTTPError as error:
        with error:
            raw = error.read()
        try:
            return error.code, json.loads(raw or b"{}")
        except ValueError:
            return error.code, {}


class ProfileDrill:
    """Create, deliver, revoke and re-deliver for every profile."""

    def __init__(self, base_url: str, services: Services, actor: audit.Actor,
                 account: str) -> None:
        self.base_url = base_url
        self.svc = services
        self.actor = actor
        self.account = account
        self.senders: list[ProfileSender] = []

    def create(self) -> None:
        """Create one sandbox integration per profile (the ids go to cleanup at once)."""
        labels = [*sorted(PROFILES), "standard-webhooks-v1a", *DRILL_OPTIONS]
        for label in labels:
            name = "standard-webhooks" if label.startswith("standard-webhooks") else label
            stored, signing = _key_pair(label)
            scheme = PROFILES[name].scheme if name in PROFILES else None
            url = (f"{self.base_url.rstrip('/')}/hooks/drill-{label}"
                   if getattr(scheme, "needs_url", False) else None)
            settings = profile_settings(name, endpoint_url=url,
                                        hmac_options=DRILL_OPTIONS.get(name))
            with self.svc.engine.begin() as conn:
                integration, cred = create_integration(
                    conn, self.svc.box, self.actor, account=self.account,
                    name=f"drill-{label}", profile=name, now=self.svc.clock.now(),
                    secret=stored, sandbox=True, settings=settings)
            self.senders.append(ProfileSender(
                label=label, integration_id=integration.id, public_id=integration.public_id,
                key_id=cred.key_id, signing=signing or cred.secret,
                profile=profile_for(integration)))

    def post(self, sender: ProfileSender, event_id: str) -> int:
        """Deliver one event in the sender's shape; return the status."""
        profile = sender.profile
        body = profile.compose(event_id, "drill.check", {"drill": event_id})
        if sender.label in DRILL_OPTIONS:
            body = json.dumps({"id": event_id, "type": "drill.check"}).encode()
        now = unix(self.svc.clock.now())
        body = profile.seal(sender.signing, body, now)  # Mailgun signs inside the body
        headers = profile.sign(sender.signing, body, event_id=event_id, event_type="drill.check",
                               timestamp=now)
        form = profile.body_format == "form"
        headers["Content-Type"] = ("application/x-www-form-urlencoded" if form
                                   else "application/json")
        return post_signed(self.base_url, sender.public_id, body, headers)[0]

    def run(self, bound: float, expect: Callable[[bool, str], None]) -> str:
        """Accept one event per profile, revoke every key, then see every one refused."""
        self.create()
        accepted = {s.label: self.post(s, "evt-p1") for s in self.senders}
        failed = sorted(label for label, status in accepted.items() if status != 202)
        expect(not failed, f"not accepted before revocation: {failed}")
        revoked_at: datetime = self.svc.clock.now()
        with self.svc.engine.begin() as conn:
            for sender in self.senders:
                revoke_credential(conn, self.actor, sender.key_id, reason="leaked-key drill",
                                  now=revoked_at)
        started = time.monotonic()
        pending = list(self.senders)
        while pending and time.monotonic() < started + bound + 2:
            pending = [s for s in pending if self.post(s, "evt-p2") != 401]
            if pending:
                time.sleep(POLL_SECONDS)
        took = time.monotonic() - started
        expect(not pending, f"still accepted {took:.1f} s after revocation: "
                            f"{sorted(s.label for s in pending)} (bound {bound} s)")
        return (f"{len(self.senders)} profiles ({', '.join(s.label for s in self.senders)}) "
                f"accepted, then all refused {took:.1f} s after revocation (bound {bound} s)")
