"""docs/tutorial.md and the README's demo walk work as written, on both databases."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TUTORIAL, re.S)
# The body of step 6, as the reader pastes it.
BODY = re.search(r"^BODY='(.*)'$", TUTORIAL, re.M).group(1)  # type: ignore[union-attr]


@pytest.fixture
def tutorial_app(test_env, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The app with the tutorial's my_handlers.py on the path, as LEDGER_HANDLER_MODULES."""
    from app import create_app

    handlers, _test = BLOCKS
    (tmp_path / "my_handlers.py").write_text(handlers)
    monkeypatch.syspath_prepend(str(tmp_path))
    application = create_app({**test_env, "LEDGER_DEMO_HANDLERS": "0",
                              "LEDGER_HANDLER_MODULES": "my_handlers"})
    yield application
    application.extensions["ledger"].close()


def _stripe_signature(secret: str, body: str) -> str:
    """Sign as step 6's openssl line does: HMAC-SHA256 of `{t}.{body}`, hex."""
    ts = int(time.time())
    digest = hmac.new(secret.encode(), f"{ts}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


def test_the_tutorials_own_test_passes(tutorial_app) -> None:  # type: ignore[no-untyped-def]
    _handlers, test_code = BLOCKS
    namespace: dict[str, object] = {}
    exec(compile(test_code, "test_my_handlers.py", "exec"), namespace)  # the page's code
    namespace["test_a_paid_invoice_is_recorded_once"]()  # type: ignore[operator]


def test_a_signed_stripe_delivery_reaches_the_tutorials_handler_once(  # type: ignore[no-untyped-def]
        tutorial_app) -> None:
    runner, client = tutorial_app.test_cli_runner(), tutorial_app.test_client()
    created = json.loads(runner.invoke(args=[
        "ledger", "integration", "create", "--account", "acme", "--name", "stripe-test",
        "--profile", "stripe", "--json"]).output)
    url, secret = f"/hooks/{created['integration']}", created["credential"]["secret"]
    headers = {"Content-Type": "application/json",
               "Stripe-Signature": _stripe_signature(secret, BODY)}
    first = client.post(url, data=BODY, headers=headers)
    assert (first.status_code, first.get_json()) == (
        202, {"status": "accepted", "event_id": "evt_1", "state": "pending"})
    assert runner.invoke(args=["ledger", "worker", "--burst"]).exit_code == 0
    again = client.post(url, data=BODY, headers=headers)
    assert (again.status_code, again.get_json()) == (200, {
        "status": "duplicate", "event_id": "evt_1", "state": "complete",
        "result_ref": "invoice:in_1"})
    shown = json.loads(runner.invoke(args=["ledger", "receipt", "show", "--scope",
                                           "acme/stripe-test", "--event-id", "evt_1",
                                           "--json"]).output)
    assert (shown["state"], shown["attempts"], shown["result_ref"]) == (
        "complete", 1, "invoice:in_1")
    with tutorial_app.extensions["ledger"].engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT invoice, amount FROM paid_invoices").all()
    assert [tuple(r) for r in rows] == [("in_1", 4200)]
    tampered = client.post(url, data=BODY.replace("4200", "4201"), headers=headers)
    assert tampered.status_code == 401


def test_the_readmes_signed_delivery_credits_the_demo_once(  # type: ignore[no-untyped-def]
        app) -> None:
    readme = (ROOT / "README.md").read_text()
    body = re.search(r"^BODY='(.*)'$", readme, re.M).group(1)  # type: ignore[union-attr]
    runner, client = app.test_cli_runner(), app.test_client()
    created = json.loads(runner.invoke(args=[
        "ledger", "integration", "create", "--account", "acme", "--name", "my-stripe",
        "--profile", "stripe", "--json"]).output)
    url = f"/hooks/{created['integration']}"
    headers = {"Content-Type": "application/json",
               "Stripe-Signature": _stripe_signature(created["credential"]["secret"], body)}
    assert client.post(url, data=body, headers=headers).status_code == 202
    assert runner.invoke(args=["ledger", "worker", "--burst"]).exit_code == 0
    again = client.post(url, data=body, headers=headers).get_json()
    assert again == {"status": "duplicate", "event_id": "evt_hello", "state": "complete",
                     "result_ref": "credit:5"}
    balance = json.loads(runner.invoke(args=["ledger", "demo", "balance", "--scope",
                                             "acme/my-stripe", "--json"]).output)
    assert balance == {"scope": "acme/my-stripe", "balance": 5}
