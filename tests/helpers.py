"""Test helpers: create integrations and send signed deliveries like a real sender."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests
from flask import Flask
from sqlalchemy import func, select

from ledger.access import audit
from ledger.access.integrations import create_integration, profile_settings
from ledger.clock import unix
from ledger.db.schema import conflicts, jobs, receipts
from ledger.intake.signatures import SenderProfile, get_profile, profile_for

WAIT = 60  # seconds: the default bound of a test's wait on a server, process or condition


@dataclass(frozen=True, slots=True)
class Sender:
    """A connected sender: where to post and how to sign."""

    public_id: str
    profile: str
    secret: str
    scope: str
    scope_id: int
    key_id: str
    configured: SenderProfile | None = field(default=None, repr=False)

    @property
    def signer(self) -> SenderProfile:
        """Return the profile as the integration holds it (URL, type settings applied)."""
        return self.configured or get_profile(self.profile)


def make_sender(app: Flask, *, account: str = "acme", name: str = "stripe-prod",
                profile: str = "stripe", tolerance: int = 300,
                max_body_bytes: int | None = None, secret: str | None = None,
                signing_key: str | None = None, **settings: Any) -> Sender:
    """Create an integration and return a sender holding its first secret.

    `settings` are profile_settings() keywords (type_path, endpoint_url, …). For a
    public-key profile pass the public key as `secret` and the private half as
    `signing_key`: the sender signs with that.
    """
    svc = app.extensions["ledger"]
    with svc.engine.begin() as conn:
        integration, cred = create_integration(
            conn, svc.box, audit.Actor(name="test", role="admin"), account=account,
            name=name, profile=profile, now=svc.clock.now(), tolerance=tolerance,
            max_body_bytes=max_body_bytes, secret=secret,
            settings=profile_settings(profile, **settings))
    return Sender(integration.public_id, profile, signing_key or cred.secret, integration.scope,
                  integration.id, cred.key_id, profile_for(integration))


def event_body(profile: str | Sender, event_id: str, event_type: str = "demo.credit",
               data: dict[str, Any] | None = None) -> bytes:
    """Return a body in the sender's shape."""
    data = data if data is not None else {"amount": 1}
    found = profile.signer if isinstance(profile, Sender) else get_profile(profile)
    body = found.compose(event_id, event_type, data)
    if isinstance(profile, Sender):  # Mailgun's signature is inside the body
        body = found.seal(profile.secret, body, int(time.time()))
    return body


def signed_headers(sender: Sender, body: bytes, event_id: str,
                   event_type: str = "demo.credit", *, secret: str | None = None,
                   timestamp: int | None = None) -> dict[str, str]:
    """Return the headers the real sender would attach."""
    profile = sender.signer
    headers = profile.sign(secret or sender.secret, body, event_id=event_id,
                           event_type=event_type,
                           timestamp=int(time.time()) if timestamp is None else timestamp)
    form = profile.body_format == "form"
    headers["Content-Type"] = "application/x-www-form-urlencoded" if form else "application/json"
    return headers


def deliver(client: Any, sender: Sender, event_id: str, event_type: str = "demo.credit",
            data: dict[str, Any] | None = None, *, body: bytes | None = None,
            secret: str | None = None, timestamp: int | None = None) -> Any:
    """Sign and POST one delivery; return the test client's response."""
    body = body if body is not None else event_body(sender, event_id, event_type, data)
    headers = signed_headers(sender, body, event_id, event_type, secret=secret,
                             timestamp=timestamp)
    return client.post(f"/hooks/{sender.public_id}", data=body, headers=headers)


def send(app: Flask, sender: Sender, event_id: str, event_type: str = "demo.credit",
         data: dict[str, Any] | None = None, *, body: bytes | None = None,
         secret: str | None = None, expect: int | tuple[int, ...] | None = None) -> Any:
    """Deliver one event signed at the app's clock time; check its status if `expect` is given."""
    response = deliver(app.test_client(), sender, event_id, event_type, data, body=body,
                       secret=secret, timestamp=unix(app.extensions["ledger"].clock.now()))
    if expect is not None:
        wanted = expect if isinstance(expect, tuple) else (expect,)
        assert response.status_code in wanted, response.get_json()
    return response


def send_http(base_url: str, sender: Sender, body: bytes, headers: dict[str, str] | None = None,
              *, query: str = "", content_type: str | None = "application/json",
              **kwargs: Any) -> requests.Response:
    """POST a delivery over HTTP as given (`content_type` fills a missing Content-Type)."""
    sent = {"Content-Type": content_type} if content_type else {}
    return requests.post(f"{base_url}/hooks/{sender.public_id}{query}", data=body,
                         headers={**sent, **(headers or {})}, timeout=30, **kwargs)


def ledger_counts(app: Flask) -> dict[str, int]:
    """Return how many receipts, jobs and conflicts the ledger holds."""
    with app.extensions["ledger"].engine.connect() as conn:
        return {name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
                for name, table in (("receipts", receipts), ("jobs", jobs),
                                    ("conflicts", conflicts))}


def migrate_to(engine: Any, revision: str) -> None:
    """Upgrade the engine's database to `revision` ("head" for the newest) with Alembic."""
    from alembic import command

    from ledger.db.engine import alembic_config

    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


class Trickling(Protocol):
    """A slow client: its socket, and one more byte of its request each time it is asked."""

    sock: socket.socket

    def trickle(self) -> None: ...


@contextlib.contextmanager
def trickling(clients: Sequence[Trickling], every: float) -> Iterator[None]:
    """Have every client send one more byte each `every` seconds while the block runs;
    close their sockets afterwards."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            for client in clients:
                client.trickle()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        for client in clients:
            client.sock.close()
