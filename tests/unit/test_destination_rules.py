"""Destination rules without a database: LEDGER_DESTINATION_ALLOW, URLs, answers, signatures."""

from __future__ import annotations

import time

import pytest
import standardwebhooks

from ledger.config import Settings, SettingsError
from ledger.destinations.addresses import AddressPolicy, AddressRefused, check_url
from ledger.destinations.forward import ForwardEvent, ForwardTarget, request_headers, result_ref_of
from ledger.destinations.secrets import new_signing_secret
from ledger.errors import Refused

BASE = {"DATABASE_URL": "sqlite:///unused.sqlite3"}


def test_the_allow_list_reads_cidrs_addresses_and_host_names():
    settings = Settings.from_env({**BASE, "LEDGER_DESTINATION_ALLOW":
                                  " 10.20.0.0/16, 127.0.0.1,Orders.Internal., fd00::/8"})
    assert settings.destination_allow == ("10.20.0.0/16", "127.0.0.1/32", "orders.internal",
                                          "fd00::/8")
    assert Settings.from_env(BASE).destination_allow == ()


@pytest.mark.parametrize("raw", ["10.0.0.0/33", "not a host", "http://x", "*.internal",
                                 "a..b"])
def test_a_bad_allow_entry_stops_the_process_naming_the_variable(raw):
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({**BASE, "LEDGER_DESTINATION_ALLOW": raw})
    assert raised.value.name == "LEDGER_DESTINATION_ALLOW"
    assert "LEDGER_DESTINATION_ALLOW" in str(raised.value)


def test_the_policy_opens_what_it_names_and_nothing_more():
    policy = AddressPolicy.from_entries(["10.20.0.0/16", "orders.internal"])
    policy.check("anything.example", "10.20.3.4")
    policy.check("orders.internal", "192.168.1.1")
    policy.check("public.example", "93.184.216.34")
    for host, address in (("anything.example", "10.21.0.1"),
                          ("orders.internal.evil.example", "192.168.1.1"),
                          ("x.example", "169.254.169.254")):
        with pytest.raises(AddressRefused):
            policy.check(host, address)


@pytest.mark.parametrize("url", ["https://orders.example.com/in?x=1",
                                 "http://orders.example.com:8080/", "https://93.184.216.34/"])
def test_usable_urls(url):
    assert check_url(url, AddressPolicy()) == url


def test_the_request_names_the_event_and_verifies_with_every_live_secret():
    old, new = new_signing_secret(), new_signing_secret()
    event = ForwardEvent(scope="acme/shop", event_id="evt_1", event_type="a.b", attempt=3)
    body = b'{"id":"evt_1"}'
    headers = request_headers(ForwardTarget(url="https://x.example/", timeout_seconds=1,
                                            secrets=[new, old]),
                              event, body, "application/json", int(time.time()))
    for secret in (old, new):
        standardwebhooks.Webhook(secret).verify(body, headers)
    assert headers["X-Ledger-Attempt"] == "3" and headers["Idempotency-Key"] == "acme/shop:evt_1"
    with pytest.raises(ValueError):
        request_headers(ForwardTarget(url="https://x.example/", timeout_seconds=1, secrets=[]),
                        event, body, "application/json", int(time.time()))


def test_result_ref_of_keeps_only_printable_ascii():
    assert result_ref_of(204, "order:7") == "order:7"
    assert result_ref_of(204, "bad\nref") == "http:204"
    assert result_ref_of(200, "") == "http:200"
    assert result_ref_of(200, None) == "http:200"


def test_refusals_are_refused_errors():
    with pytest.raises(Refused):
        check_url("gopher://example.com/", AddressPolicy())
