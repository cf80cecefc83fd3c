"""The parts the third-edition schemes are built from: timestamp formats, templates with
fields after the body, the default-port spelling of a URL, and the shared-token check."""

from __future__ import annotations

import base64

import pytest

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.shared_token import PLAINTEXT_KEY, QUERY_KEY, SharedToken
from ledger.intake.signatures.template import Template, default_port_variant


@pytest.mark.parametrize(("text", "seconds"), [
    ("2019-11-16T10:11:12.634234626Z", 1573899072),
    ("2021-06-17T21:29:16Z", 1623965356),
    ("2021-06-17t21:29:16z", 1623965356),
    ("2021-06-17T23:29:16+02:00", 1623965356),
])
def test_rfc3339_times_with_an_offset(text: str, seconds: int) -> None:
    """Twitch's nanoseconds, Zendesk's seconds, any offset."""
    assert common.parse_rfc3339(text) == seconds


@pytest.mark.parametrize("text", ["2021-06-17T21:29:16", "2021-06-17 21:29:16Z", "1623965356",
                                  "2021-13-45T99:99:99Z", "2021-06-17T21:29:16.Z", ""])
def test_local_or_malformed_times_are_refused(text: str) -> None:
    """No offset, a space, unix seconds, impossible dates: malformed."""
    with pytest.raises(AuthenticationFailed, match="malformed_timestamp"):
        common.parse_rfc3339(text)


def test_milliseconds_read_as_seconds_and_format_back() -> None:
    """HubSpot's milliseconds; each format spells what it parses."""
    assert common.parse_millis("1700000000123") == 1_700_000_000
    for name, parse in common.TIMESTAMP_PARSERS.items():
        assert parse(common.TIMESTAMP_FORMATTERS[name](1_700_000_000)) == 1_700_000_000
    with pytest.raises(AuthenticationFailed):
        common.parse_millis("-1")


def test_template_fields_after_the_body() -> None:
    """`{timestamp}` (and others) may follow the body; literal braces stay literal."""
    template = Template("{method}{url}{body}{timestamp}")
    assert template("i", "99", b"<b>", "https://h/p") == b"POSThttps://h/p<b>99"
    assert Template("{id}.{body}.end")("i", "t", b"B", "") == b"i.B.end"
    with pytest.raises(ValueError, match="exactly once"):
        Template("{timestamp}")


@pytest.mark.parametrize(("url", "other"), [
    ("https://h.example/p?q=1", "https://h.example:443/p?q=1"),
    ("https://h.example:443/p", "https://h.example/p"),
    ("http://u:pw@h.example/p", "http://u:pw@h.example:80/p"),
    ("https://h.example:8443/p", None),
    ("ftp://h.example/p", None),
])
def test_default_port_variant(url: str, other: str | None) -> None:
    """The other spelling of the same endpoint, only for the scheme's default port."""
    assert default_port_variant(url) == other


def _token(**kwargs: object) -> SharedToken:
    return SharedToken(**kwargs)  # type: ignore[arg-type]


def test_shared_token_places_and_every_live_credential() -> None:
    """Header, query or Basic; the matching credential's index; plain HTTP when refused."""
    basic = "Basic " + base64.b64encode(b"u:p").decode()
    cases = [(_token(header="X-T"), {"x-t": ["s2"]}),
             (_token(query="k"), {QUERY_KEY: ["a=1&k=s2"]}),
             (_token(basic=True), {"authorization": [basic]})]
    for scheme, headers in cases:
        secrets = ["s1", "s2"] if not scheme.basic else ["x:y", "u:p"]
        assert scheme.verify(headers, b"", secrets, now=0, tolerance=1).secret_index == 1
    strict = _token(header="X-T", allow_plaintext=False)
    with pytest.raises(AuthenticationFailed, match="plaintext_transport"):
        strict.verify({"x-t": ["s1"], PLAINTEXT_KEY: ["1"]}, b"", ["s1"], now=0, tolerance=1)
    for headers in ({"authorization": ["Basic !!"]}, {"authorization": ["Bearer x"]}):
        with pytest.raises(AuthenticationFailed):
            _token(basic=True).verify(headers, b"", ["u:p"], now=0, tolerance=1)
