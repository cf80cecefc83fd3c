"""One delivery to a destination: the signed POST and what its answer means (CONTRACT 8).

`Forwarder.forward` sends the stored body as received, signed with Standard Webhooks
headers under each live secret of the destination, and never raises for what the
destination did: it returns a `ForwardResult` (status, latency, the first 1 KiB of the
answer, and the outcome). `ForwardResult.result_ref_or_raise` turns that into the
handler's answer: a `result_ref`, `RetryAfter`, `PermanentFailure`, or a plain error
that the worker retries with its own backoff.

The call runs outside any database transaction (STYLE rule 7). One Forwarder per
process; each thread that sends through it has a connection pool of its own, which keeps
that thread's connections per destination host (see `Forwarder`).

The request is made with httpcore, the connection layer httpx is built on, and not with an
httpx client: the client's request and response models, header merging and cookie jar cost
about a sixth of the worker's CPU per forwarded event (docs: explanation/performance.md).
httpx still parses each destination's URL (IDNA hosts, percent-encoding), once per URL.
Nothing here follows a redirect, reads a proxy from the environment, keeps a cookie or
inflates a compressed answer.
"""

from __future__ import annotations

import math
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from functools import lru_cache

import httpcore
import httpx

from ledger.config import Settings
from ledger.destinations.addresses import AddressPolicy, AddressRefused
from ledger.destinations.guard import DEADLINE, GuardedBackend, Resolver, system_resolver
from ledger.errors import error_summary
from ledger.handlers import PermanentFailure, RetryAfter
from ledger.intake.signatures.presets import STANDARD_WEBHOOKS

EXCERPT_BYTES = 1024
# Read past the excerpt up to this much, so that a small answer leaves its connection
# reusable; a larger one is cut off and its connection closed.
DRAIN_BYTES = 64 * 1024
RESULT_REF_LIMIT = 255
CONNECT_TIMEOUT_CAP = 5.0
RETRYABLE_STATUSES = frozenset({408, 425, 429})
# What an httpx client added to each request besides the forwarder's own headers.
DEFAULT_HEADERS = (("Accept", "*/*"), ("Connection", "keep-alive"))
USER_AGENT = "replay-ledger-destination/1"
# Per sending thread, every destination host together. A thread sends one request at a
# time, so it uses one connection at once; the others are kept for the next hosts it sends to.
MAX_CONNECTIONS = 4
MAX_KEEPALIVE_CONNECTIONS = 4
KEEPALIVE_SECONDS = 5.0  # an idle pooled connection is closed after this long


class Outcome(StrEnum):
    """What an attempt's answer means for the receipt."""

    COMPLETE = "complete"
    RETRY = "retry"
    FAILED = "failed"


class DeliveryError(Exception):
    """A retryable failure without a Retry-After: the worker's own backoff applies."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardTarget:
    """Where to send: the destination's URL, timeout, and the secrets that sign."""

    url: str
    timeout_seconds: float
    secrets: Sequence[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardEvent:
    """The event being forwarded (its body travels separately, as bytes)."""

    scope: str
    event_id: str
    event_type: str
    attempt: int

    @property
    def idempotency_key(self) -> str:
        """Return "<scope>:<event_id>", the key the receiving service deduplicates by."""
        return f"{self.scope}:{self.event_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardResult:
    """What one attempt got back, kept with the attempt (never the request body)."""

    outcome: Outcome
    http_status: int | None
    latency_ms: float
    response_excerpt: str | None
    result_ref: str | None = None
    retry_after: float | None = None  # seconds, capped; None: the worker's backoff
    error: str | None = None

    def result_ref_or_raise(self) -> str:
        """Return the result_ref of a success; raise what the worker needs otherwise."""
        if self.outcome is Outcome.COMPLETE and self.result_ref is not None:
            return self.result_ref
        reason = self.error or f"destination answered {self.http_status}"
        if self.outcome is Outcome.FAILED:
            raise PermanentFailure(reason)
        if self.retry_after is not None:
            raise RetryAfter(self.retry_after, reason)
        raise DeliveryError(reason)


def signature_headers(secrets: Sequence[str], event: ForwardEvent, body: bytes,
                      timestamp: int) -> dict[str, str]:
    """Return the Standard Webhooks headers, one `v1,` signature per live secret."""
    if not secrets:
        raise ValueError("a destination needs a live signing secret")
    signed = [STANDARD_WEBHOOKS.scheme.sign(secret, body, event_id=event.idempotency_key,
                                            timestamp=timestamp) for secret in secrets]
    return {"webhook-id": event.idempotency_key, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(h["webhook-signature"] for h in signed)}


def request_headers(target: ForwardTarget, event: ForwardEvent, body: bytes,
                    content_type: str, timestamp: int) -> dict[str, str]:
    """Return every header of the request; nothing of the sender's own request is among them."""
    return {**signature_headers(target.secrets, event, body, timestamp),
            "Content-Type": content_type, "Idempotency-Key": event.idempotency_key,
            "X-Ledger-Scope": event.scope, "X-Ledger-Event-Type": event.event_type,
            "X-Ledger-Attempt": str(event.attempt), "User-Agent": USER_AGENT,
            # The excerpt is read raw: no compressed answer to inflate (a gzip bomb).
            "Accept-Encoding": "identity"}


def retry_after_seconds(value: str | None, *, cap: float, now: datetime) -> float | None:
    """Parse Retry-After (delay-seconds or an HTTP-date) into seconds in [0, cap]; else None."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            moment = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = (moment - now).total_seconds()
    return min(max(seconds, 0.0), cap) if math.isfinite(seconds) else None


def result_ref_of(status: int, header: str | None) -> str:
    """Return X-Result-Ref when usable (1-255 printable ASCII), else `http:<status>`."""
    if header and len(header) <= RESULT_REF_LIMIT and all(" " <= c <= "~" for c in header):
        return header
    return f"http:{status}"


def excerpt_of(head: bytes) -> str:
    """Return the first EXCERPT_BYTES of an answer as text (undecodable bytes replaced)."""
    return head[:EXCERPT_BYTES].decode("utf-8", errors="replace")


def verified_tls() -> ssl.SSLContext:
    """Return the TLS context of destinations: the system's trusted certificates, verified."""
    return httpx.create_ssl_context(verify=True, trust_env=False)


def guarded_pool(policy: AddressPolicy, *, resolver: Resolver = system_resolver,
                 ssl_context: ssl.SSLContext | None = None) -> httpcore.ConnectionPool:
    """Return a connection pool whose connections go through GuardedBackend (verified TLS)."""
    return httpcore.ConnectionPool(
        ssl_context=ssl_context or verified_tls(),
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_SECONDS, retries=0,
        network_backend=GuardedBackend(policy, resolver=resolver))


@lru_cache(maxsize=1024)
def request_url(url: str) -> httpcore.URL:
    """Return `url` as httpx would send it (IDNA host, percent-encoded target)."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL with a host: {parsed.scheme}")
    return httpcore.URL(scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port,
                        target=parsed.raw_path)


def header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str | None:
    """Return a response header's values joined by ", " (as httpx does), or None."""
    values = [value.decode("latin-1") for key, value in headers if key.lower() == name]
    return ", ".join(values) if values else None


class Forwarder:
    """Sends events to destinations over pooled, guarded connections: a pool per thread.

    A worker sends a round's requests on several threads at once. One pool shared by them
    checked every idle connection of every thread (a readiness poll each) whenever a
    request took a connection or gave one back; a pool of the thread's own checks only the
    few that thread keeps. A pool whose thread has ended is closed when the next thread
    makes one, and `close` closes them all.
    """

    def __init__(self, *, policy: AddressPolicy, retry_cap_seconds: float,
                 resolver: Resolver = system_resolver,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context` replaces the system's trusted certificates (a private CA)."""
        self._cap = retry_cap_seconds
        self._policy, self._resolver = policy, resolver
        self._tls = ssl_context or verified_tls()  # loaded once, shared by every pool
        self._local = threading.local()
        self._pools: list[tuple[threading.Thread, httpcore.ConnectionPool]] = []
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Forwarder:
        """Return a forwarder under LEDGER_DESTINATION_ALLOW and LEDGER_RETRY_CAP_SECONDS."""
        return cls(policy=AddressPolicy.from_settings(settings),
                   retry_cap_seconds=settings.retry_cap_seconds)

    def close(self) -> None:
        """Close every pooled connection, of every thread."""
        with self._lock:
            pools = [pool for _thread, pool in self._pools]
        for pool in pools:
            pool.close()

    def _pool(self) -> httpcore.ConnectionPool:
        """Return this thread's pool, made on its first forward."""
        pool: httpcore.ConnectionPool | None = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = guarded_pool(self._policy, resolver=self._resolver,
                                                   ssl_context=self._tls)
            with self._lock:
                ended = [kept for thread, kept in self._pools if not thread.is_alive()]
                self._pools = [(thread, kept) for thread, kept in self._pools
                               if thread.is_alive()]
                self._pools.append((threading.current_thread(), pool))
            for idle in ended:  # nobody sends on them any more
                idle.close()
        return pool

    def forward(self, target: ForwardTarget, event: ForwardEvent, body: bytes,
                content_type: str, *, now: datetime | None = None) -> ForwardResult:
        """POST the body to the destination and classify its answer; never raises for it."""
        now = now or datetime.now(UTC)
        headers = request_headers(target, event, body, content_type, int(now.timestamp()))
        total = target.timeout_seconds
        timeout = {"connect": min(total, CONNECT_TIMEOUT_CAP), "read": total, "write": total,
                   "pool": total}
        started = time.monotonic()
        token = DEADLINE.set(started + total)
        try:
            return self._send(target.url, headers, body, timeout, started, now)
        finally:
            DEADLINE.reset(token)

    def _send(self, url: str, headers: dict[str, str], body: bytes,
              timeout: dict[str, float], started: float, now: datetime) -> ForwardResult:
        """Make the request; map every way it can end to a ForwardResult."""
        try:
            target = request_url(url)
            with self._pool().stream("POST", target, content=body,
                                   headers=[*DEFAULT_HEADERS, *headers.items()],
                                   extensions={"timeout": timeout}) as response:
                head = _read_head(response)
                return self._classify(response, head, _ms(started), now)
        except AddressRefused as refused:
            return _no_answer(started, f"refused: {refused}")
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, httpcore.UnsupportedProtocol) as error:
            # Only a URL written past `destination create`'s checks gets here: no retry fixes it.
            return ForwardResult(outcome=Outcome.FAILED, http_status=None, latency_ms=_ms(started),
                                 response_excerpt=None, error=f"url: {error_summary(error)}")
        except httpcore.TimeoutException as error:
            return _no_answer(started, f"timeout: {error_summary(error)}")
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.ProxyError,
                OSError) as error:
            return _no_answer(started, f"connection: {error_summary(error)}")

    def _classify(self, response: httpcore.Response, head: bytes, latency_ms: float,
                  now: datetime) -> ForwardResult:
        """Turn a status into an outcome (CONTRACT section 8)."""
        status, excerpt = response.status, excerpt_of(head)
        if 200 <= status < 300:
            return ForwardResult(outcome=Outcome.COMPLETE, http_status=status,
                                 latency_ms=latency_ms, response_excerpt=excerpt,
                                 result_ref=result_ref_of(status,
                                                          header(response.headers,
                                                                 b"x-result-ref")))
        if status in RETRYABLE_STATUSES or status >= 500:
            wait = retry_after_seconds(header(response.headers, b"retry-after"), cap=self._cap,
                                       now=now)
            return ForwardResult(outcome=Outcome.RETRY, http_status=status,
                                 latency_ms=latency_ms, response_excerpt=excerpt,
                                 retry_after=wait, error=f"destination answered {status}")
        what = "a redirect (not followed)" if 300 <= status < 400 else str(status)
        return ForwardResult(outcome=Outcome.FAILED, http_status=status, latency_ms=latency_ms,
                             response_excerpt=excerpt, error=f"destination answered {what}")


def _read_head(response: httpcore.Response) -> bytes:
    """Return the answer's first bytes; drain a little more so the connection is reused."""
    head, seen = bytearray(), 0
    for chunk in response.iter_stream():
        if len(head) < EXCERPT_BYTES:
            head += chunk[:EXCERPT_BYTES - len(head)]
        seen += len(chunk)
        if seen >= DRAIN_BYTES:
            break
    return bytes(head)


def _ms(started: float) -> float:
    """Return the milliseconds since `started` (time.monotonic)."""
    return round((time.monotonic() - started) * 1000, 3)


def _no_answer(started: float, error: str) -> ForwardResult:
    """Return the result of an attempt that got no HTTP answer: retried."""
    return ForwardResult(outcome=Outcome.RETRY, http_status=None, latency_ms=_ms(started),
                         response_excerpt=None, error=error)
