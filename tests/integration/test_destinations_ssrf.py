"""Destinations never reach internal addresses (CONTRACT section 8; the red-team checklist in
docs/explanation/security-destinations.md).

No packet leaves loopback: a resolver stub (socket.getaddrinfo) maps test host names to
private and metadata addresses, and a connection guard (socket.socket.connect) fails the
test the moment a connection to anything but the loopback receiver is even attempted.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import pytest

from ledger.destinations.addresses import AddressPolicy, internal_reason
from ledger.destinations.forward import Forwarder, ForwardEvent, ForwardTarget, Outcome
from ledger.destinations.secrets import new_signing_secret
from tests.receivers import Answer, certificate_authority, receiving

EVENT = ForwardEvent(scope="acme/shop", event_id="evt_1", event_type="order.paid", attempt=1)
STUB_DNS = {
    "internal.example": ["10.0.0.5"],
    "metadata.example": ["169.254.169.254"],
    "metadata.google.internal": ["169.254.169.254"],
    "azure-wire.example": ["168.63.129.16"],
    "cgnat.example": ["100.100.100.200"],
    "loopback.example": ["127.0.0.1"],
    "mapped.example": ["::ffff:127.0.0.1"],
    "sixtofour.example": ["2002:a9fe:a9fe::1"],
    "nat64.example": ["64:ff9b::a9fe:a9fe"],
    "ula.example": ["fd00:ec2::254"],
    "mixed.example": ["93.184.216.34", "10.0.0.1"],
    "unspecified.example": ["0.0.0.0"],
    "multicast.example": ["224.0.0.251"],
    "receiver.example": ["127.0.0.1"],
}


class ConnectionGuard:
    """Records every connection attempt; fails the test at once for any but `allowed`."""

    def __init__(self) -> None:
        self.allowed: set[str] = set()
        self.attempts: list[str] = []


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectionGuard]:
    """Stub DNS and refuse any connection the test did not allow."""
    watch = ConnectionGuard()
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def stub_getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(host, str) and host in STUB_DNS:
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6,
                     "", (a, port)) for a in STUB_DNS[host]]
        if isinstance(host, str) and not _is_address(host):
            pytest.fail(f"a test resolved an unstubbed name: {host}")
        return real_getaddrinfo(host, port, *args, **kwargs)

    def guarded_connect(sock, address):  # type: ignore[no-untyped-def]
        watch.attempts.append(str(address[0]))
        if str(address[0]) not in watch.allowed:
            pytest.fail(f"a connection to {address[0]} was attempted")
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", stub_getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    yield watch


def _is_address(text: str) -> bool:
    """Tell whether the resolver reads `text` as an address itself (no DNS query)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        try:
            socket.inet_aton(text)  # the legacy forms: 2130706433, 0x7f.1, 127.1
        except OSError:
            return False
    return True


def _forward(allow: list[str], url: str) -> tuple[Outcome, str | None]:
    sender = Forwarder(policy=AddressPolicy.from_entries(allow), retry_cap_seconds=60)
    try:
        result = sender.forward(ForwardTarget(url=url, timeout_seconds=2,
                                              secrets=[new_signing_secret()]),
                                EVENT, b"{}", "application/json")
    finally:
        sender.close()
    return result.outcome, result.error


@pytest.mark.parametrize("host", [h for h in STUB_DNS if h != "receiver.example"])
def test_a_name_that_resolves_inside_is_refused_without_a_connection(guard, host):
    outcome, error = _forward([], f"http://{host}/hooks")
    assert outcome is Outcome.RETRY and error is not None and error.startswith("refused")
    assert guard.attempts == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/", "http://[::1]/", "http://10.1.1.1/",
                                 "http://169.254.169.254/latest/meta-data/",
                                 "http://[::ffff:169.254.169.254]/", "http://0.0.0.0:80/",
                                 "http://2130706433/", "http://0x7f.1/"])
def test_an_address_in_the_url_is_checked_at_connection_too(guard, url):
    """Even a URL written into the table behind the CLI's back reaches nothing."""
    outcome, error = _forward([], url)
    assert outcome is Outcome.RETRY and error is not None
    assert guard.attempts == []


def test_the_allow_list_opens_exactly_what_it_names(guard):
    guard.allowed.add("127.0.0.1")
    with receiving() as (url, receiver):
        port = url.rsplit(":", 1)[1]
        by_name = _forward(["receiver.example"], f"http://receiver.example:{port}/a")
        by_cidr = _forward(["127.0.0.0/8"], f"http://loopback.example:{port}/b")
        not_named = _forward(["receiver.example"], f"http://loopback.example:{port}/c")
    assert by_name[0] is Outcome.COMPLETE and by_cidr[0] is Outcome.COMPLETE
    assert not_named[0] is Outcome.RETRY and (not_named[1] or "").startswith("refused")
    assert [(r.path, r.headers["host"]) for r in receiver.requests] == [
        ("/a", f"receiver.example:{port}"), ("/b", f"loopback.example:{port}")]


def test_dns_rebinding_is_caught_at_the_next_connection(guard, monkeypatch):
    """The name answered loopback (allowed) once, then a metadata address: refused."""
    guard.allowed.add("127.0.0.1")
    with receiving() as (url, receiver):
        port = url.rsplit(":", 1)[1]
        sender = Forwarder(policy=AddressPolicy.from_entries(["127.0.0.1/32"]),
                           retry_cap_seconds=60)
        target = ForwardTarget(url=f"http://receiver.example:{port}/", timeout_seconds=2,
                               secrets=[new_signing_secret()])
        try:
            first = sender.forward(target, EVENT, b"{}", "application/json")
            monkeypatch.setitem(STUB_DNS, "receiver.example", ["169.254.169.254"])
            second = sender.forward(target, EVENT, b"{}", "application/json")
        finally:
            sender.close()
    assert first.outcome is Outcome.COMPLETE
    assert second.outcome is Outcome.RETRY and "169.254.169.254" in (second.error or "")
    assert guard.attempts == ["127.0.0.1"] and len(receiver.requests) == 1


def test_a_redirect_to_the_metadata_service_is_not_followed(guard):
    guard.allowed.add("127.0.0.1")
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=302,
                               headers={"Location": "http://169.254.169.254/latest/"}))
        outcome, _error = _forward(["127.0.0.1"], url)
    assert outcome is Outcome.FAILED and guard.attempts == ["127.0.0.1"]


def test_proxy_settings_of_the_environment_are_ignored(guard, monkeypatch):
    """A proxy would make the connection on our behalf, past every check."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://10.9.9.9:3128")
    guard.allowed.add("127.0.0.1")
    with receiving() as (url, _receiver):
        outcome, _error = _forward(["127.0.0.1"], url)
    assert outcome is Outcome.COMPLETE and guard.attempts == ["127.0.0.1"]


@pytest.mark.parametrize(("address", "internal"), [
    ("10.0.0.1", True), ("172.31.255.255", True), ("192.168.1.1", True),
    ("127.0.0.1", True), ("169.254.169.254", True), ("100.64.0.1", True),
    ("0.0.0.0", True), ("224.0.0.1", True), ("255.255.255.255", True),
    ("168.63.129.16", True), ("::1", True), ("::", True), ("fe80::1", True),
    ("fc00::1", True), ("ff02::1", True), ("::ffff:10.0.0.1", True),
    ("2002:7f00:1::", True), ("64:ff9b::7f00:1", True),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", True),  # Teredo carrying 10.0.0.1
    ("93.184.216.34", False), ("8.8.8.8", False), ("2606:4700:4700::1111", False),
    ("::ffff:8.8.8.8", False), ("2002:0808:0808::", False)])
def test_internal_ranges(address, internal):
    assert (internal_reason(ipaddress.ip_address(address)) is not None) is internal


def test_https_verifies_the_certificate_for_the_urls_host(guard, tmp_path):
    """The connection goes to the checked address; TLS still checks the URL's host name."""
    guard.allowed.add("127.0.0.1")
    server_tls, client_tls = certificate_authority("receiver.example", tmp_path)
    with receiving(server_tls) as (url, receiver):
        port = url.rsplit(":", 1)[1]
        trusted = Forwarder(policy=AddressPolicy.from_entries(["receiver.example"]),
                            retry_cap_seconds=60, ssl_context=client_tls)
        system_trust = Forwarder(policy=AddressPolicy.from_entries(["receiver.example"]),
                                 retry_cap_seconds=60)
        by_cidr = Forwarder(policy=AddressPolicy.from_entries(["127.0.0.0/8"]),
                            retry_cap_seconds=60, ssl_context=client_tls)
        target = ForwardTarget(url=f"https://receiver.example:{port}/in", timeout_seconds=5,
                               secrets=[new_signing_secret()])
        wrong_name = ForwardTarget(url=f"https://loopback.example:{port}/in",
                                   timeout_seconds=5, secrets=[new_signing_secret()])
        try:
            ok = trusted.forward(target, EVENT, b"{}", "application/json")
            mismatch = by_cidr.forward(wrong_name, EVENT, b"{}", "application/json")
            untrusted = system_trust.forward(target, EVENT, b"{}", "application/json")
        finally:
            for sender in (trusted, system_trust, by_cidr):
                sender.close()
    assert ok.outcome is Outcome.COMPLETE
    assert receiver.requests[0].headers["host"] == f"receiver.example:{port}"
    for refused in (mismatch, untrusted):  # a name the certificate lacks; an unknown CA
        assert refused.outcome is Outcome.RETRY and "certificate" in (refused.error or "").lower()
    assert len(receiver.requests) == 1
