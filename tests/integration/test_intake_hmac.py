"""The `hmac` profile's third-edition options over real HTTP on both databases: an entries
header with several signatures, millisecond and RFC 3339 timestamps, `{timestamp}`, `{id}`,
`{method}` and `{url}` anywhere in the template, JSON-array batches and a text reply."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from ledger.db.schema import receipts
from tests.helpers import Sender, ledger_counts, make_sender, send_http

SECRET = "acme-hmac-shared-secret"
URL = "https://hooks.example.com/hooks/in_acme?portal=7"
NOTHING = {"receipts": 0, "jobs": 0, "conflicts": 0}


def hmac_sender(app: Any, **options: Any) -> Sender:
    """Connect a sender through the hmac profile with these options."""
    url = options.pop("endpoint_url", None)
    return make_sender(app, name="acme", profile="hmac", secret=SECRET, hmac_options=options,
                       **({"endpoint_url": url} if url else {}))


def mac(message: bytes, key: str = SECRET, encoding: str = "hex") -> str:
    """HMAC-SHA256 of `message`, hex or base64."""
    raw = hmac.new(key.encode(), message, hashlib.sha256).digest()
    return raw.hex() if encoding == "hex" else base64.b64encode(raw).decode()


def receipt_rows(app: Any) -> list[tuple[str, str]]:
    """Return (event id, type) of every receipt."""
    with app.extensions["ledger"].engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            select(receipts.c.event_id, receipts.c.event_type).order_by(receipts.c.event_id))]


def test_entries_header_with_rotation_signatures(app, live) -> None:
    """`t=<ts>,v1=<old>,v1=<new>`: any listed signature verifies; stale t is refused."""
    sender = hmac_sender(app, signature_header="Acme-Signature", entries=True,
                         content="{timestamp}.{body}", id_path="id")
    body = b'{"id": "e-1", "type": "invitee.created"}'
    now = int(time.time())
    good = mac(f"{now}.".encode() + body)
    header = f"t={now},v1={mac(b'other', 'old-secret')},v1={good}"
    assert send_http(live, sender, body, {"Acme-Signature": header}).status_code == 202
    stale = int(time.time()) - 3600
    old = f"t={stale},v1={mac(f'{stale}.'.encode() + body)}"
    assert send_http(live, sender, body, {"Acme-Signature": old}).status_code == 401
    assert send_http(live, sender, body, {"Acme-Signature": f"v1={good}"}).status_code == 401
    assert receipt_rows(app) == [("e-1", "invitee.created")]


def test_rfc3339_timestamp_header_with_id_in_the_template(app, live) -> None:
    """Twitch-like: id + RFC 3339 timestamp (nanoseconds) + body, `sha256=<hex>`."""
    sender = hmac_sender(app, signature_header="X-Sig", prefix="sha256=",
                         content="{id}{timestamp}{body}", timestamp_header="X-Time",
                         timestamp_format="rfc3339", id_header="X-Id")
    body = b'{"type": "channel.follow"}'
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    headers = {"X-Id": "m-1", "X-Time": stamp,
               "X-Sig": "sha256=" + mac(f"m-1{stamp}".encode() + body)}
    assert send_http(live, sender, body, headers).status_code == 202
    local_time = {**headers, "X-Time": stamp.removesuffix("Z")}
    assert send_http(live, sender, body, local_time).status_code == 401
    assert receipt_rows(app) == [("m-1", "channel.follow")]


def test_millisecond_timestamp_after_the_body_with_method_and_url(app, live) -> None:
    """HubSpot v3's shape: `{method}{url}{body}{timestamp}`, base64, ms timestamps."""
    sender = hmac_sender(app, signature_header="X-Sig-V3", encoding="base64",
                         content="{method}{url}{body}{timestamp}", timestamp_header="X-Ts",
                         timestamp_format="unix-ms", id_path="eventId", endpoint_url=URL)
    body = b'{"eventId": "100", "type": "contact.creation"}'
    millis = str(int(time.time() * 1000))
    signature = mac(f"POST{URL}".encode() + body + millis.encode(), encoding="base64")
    assert send_http(live, sender, body, {"X-Sig-V3": signature, "X-Ts": millis}).status_code == 202
    old = str(int(time.time() * 1000) - 3_600_000)
    stale = mac(f"POST{URL}".encode() + body + old.encode(), encoding="base64")
    assert send_http(live, sender, body, {"X-Sig-V3": stale, "X-Ts": old}).status_code == 401
    assert receipt_rows(app) == [("100", "contact.creation")]


def test_json_array_batch_with_a_text_success_body(app, live) -> None:
    """A JSON-array body: one receipt per element, one transaction, answered as configured."""
    sender = hmac_sender(app, signature_header="X-Sig", id_path="id", body_format="json-array",
                         success_body="[accepted]")
    body = json.dumps([{"id": "a", "type": "t"}, {"id": "b", "type": "t"}]).encode()
    answer = send_http(live, sender, body, {"X-Sig": mac(body)})
    assert (answer.status_code, answer.text) == (202, "[accepted]")
    assert answer.headers["Content-Type"].startswith("text/plain")
    assert receipt_rows(app) == [("a", "t"), ("b", "t")]
    bad = json.dumps([{"id": "c", "type": "t"}, {"id": "has space", "type": "t"}]).encode()
    refused = send_http(live, sender, bad, {"X-Sig": mac(bad)})
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_event"
    assert ledger_counts(app)["receipts"] == 2


@pytest.mark.parametrize(("options", "problem"), [
    ({"content": "{body}{body}"}, "exactly once"),
    ({"content": "{timestamp}{body}"}, "go together"),
    ({"signature_entries": True, "prefix": "x=", "content": "{timestamp}{body}"},
     "no prefix"),
    ({"timestamp_format": "iso"}, "timestamp-format"),
    ({"body_format": "xml"}, "body-format"),
    ({"content": "{url}{body}"}, "--url"),
    ({"body_format": "json-array", "id_header": "X-Id"}, "from id-path"),
])
def test_options_that_cannot_work_are_refused_with_nothing_written(app, runner, options,
                                                                   problem) -> None:
    """Bad options: exit 1, a clear reason, no integration."""
    args = ["ledger", "integration", "create", "--account", "acme", "--name", "x",
            "--profile", "hmac", "--signature-header", "X-Sig"]
    if "id_header" not in options:
        args += ["--id-path", "id"]
    for name, value in options.items():
        flag = "--" + {"content": "signed-content", "prefix": "signature-prefix"}.get(
            name, name).replace("_", "-")
        args += [flag] if value is True else [flag, value]
    result = runner.invoke(args=args)
    assert result.exit_code == 1, result.output
    assert problem in result.output
    assert ledger_counts(app) == NOTHING
